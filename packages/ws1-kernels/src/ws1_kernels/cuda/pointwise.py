"""silu and swiglu (cuda_bf16): ``torch.ops.ws1.silu_fwd/bwd`` and ``swiglu_fwd/bwd`` under autograd.

One element per thread in fp32 (csrc/kernels/pointwise.cu): no reduction, so any layout gives the same bits.
"""

from __future__ import annotations

import torch

from .. import _validate as v
from ..backend import OpEntry
from ..context import LayoutContext
from ..launches import record
from ._common import check_inputs

SILU = "ws1.cuda.silu.pointwise"
SWIGLU = "ws1.cuda.swiglu.pointwise"


class _Silu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        record(SILU, "fwd")
        ctx.save_for_backward(x)
        return torch.ops.ws1.silu_fwd(x)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        record(SILU, "bwd")
        (x,) = ctx.saved_tensors
        return torch.ops.ws1.silu_bwd(x, dy.contiguous())


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):  # type: ignore[override]
        record(SWIGLU, "fwd")
        ctx.save_for_backward(gate, up)
        return torch.ops.ws1.swiglu_fwd(gate, up)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        record(SWIGLU, "bwd")
        gate, up = ctx.saved_tensors
        dgate, dup = torch.ops.ws1.swiglu_bwd(gate, up, dy.contiguous())
        return dgate, dup


def silu(x: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``x * sigmoid(x)``: ``[T,F] -> [T,F]``."""
    where = "cuda_bf16.silu"
    v.tensor(where, "x", x, 2, None)
    check_inputs(where, ctx, x.shape[0], x=x)
    return _Silu.apply(x)


def swiglu(gate: torch.Tensor, up: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``silu(gate) * up``: ``[T,F], [T,F] -> [T,F]``."""
    where = "cuda_bf16.swiglu"
    v.tensor(where, "gate", gate, 2, None)
    v.tensor(where, "up", up, 2, None)
    v.dims(where, "up", up, tuple(gate.shape))
    check_inputs(where, ctx, gate.shape[0], gate=gate, up=up)
    return _SwiGLU.apply(gate, up)


# the ws1 ops themselves; clone: contiguous() of a non-contiguous upstream gradient; detach: autograd's bookkeeping
_SILU_OPS = frozenset({"ws1.silu_fwd", "ws1.silu_bwd", "aten.clone", "aten.detach"})
_SWIGLU_OPS = frozenset({"ws1.swiglu_fwd", "ws1.swiglu_bwd", "aten.clone", "aten.detach"})
OPS: dict[str, OpEntry] = {
    "silu": OpEntry(silu, SILU, _SILU_OPS),
    "swiglu": OpEntry(swiglu, SWIGLU, _SWIGLU_OPS),
}
