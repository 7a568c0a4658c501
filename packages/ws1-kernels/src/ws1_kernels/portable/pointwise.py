"""silu, swiglu and rope (portable_cpu): elementwise fp32 math, one rounding to bf16.

Each element's bits depend on its own value only: basic arithmetic is correctly rounded, and exp comes from
``_math`` (fp64, rounded once), never from whichever library kernel torch picks for a chunk of the call. So
no row blocking is needed.
"""

from __future__ import annotations

import torch

from .. import _validate as v
from ..backend import OpEntry
from ..context import LayoutContext
from ..launches import record
from ..op_checks import check_rope
from ..rope_math import rope_tables, rotate, rotate_transposed
from . import _math

SILU_KERNEL = "ws1.cpu.silu.pointwise"
SWIGLU_KERNEL = "ws1.cpu.swiglu.pointwise"
ROPE_KERNEL = "ws1.cpu.rope.rotate_half"


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + _math.exp(-x))


class _Silu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        record(SILU_KERNEL, "fwd")
        ctx.save_for_backward(x)
        xf = x.float()
        return (xf * _sigmoid(xf)).to(torch.bfloat16)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        record(SILU_KERNEL, "bwd")
        (x,) = ctx.saved_tensors
        xf = x.float()
        s = _sigmoid(xf)
        return (dy.float() * (s * (1.0 + xf * (1.0 - s)))).to(torch.bfloat16)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):  # type: ignore[override]
        record(SWIGLU_KERNEL, "fwd")
        ctx.save_for_backward(gate, up)
        g = gate.float()
        return ((g * _sigmoid(g)) * up.float()).to(torch.bfloat16)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        record(SWIGLU_KERNEL, "bwd")
        gate, up = ctx.saved_tensors
        g, dyf = gate.float(), dy.float()
        s = _sigmoid(g)
        dgate = dup = None
        if ctx.needs_input_grad[0]:
            dgate = (dyf * up.float() * (s * (1.0 + g * (1.0 - s)))).to(torch.bfloat16)
        if ctx.needs_input_grad[1]:
            dup = (dyf * (g * s)).to(torch.bfloat16)
        return dgate, dup


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, theta, positions):  # type: ignore[override]
        record(ROPE_KERNEL, "fwd")
        cos, sin = rope_tables(positions, x.shape[-1], theta)
        ctx.save_for_backward(cos, sin)
        return rotate(x.float(), cos, sin).to(torch.bfloat16)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        record(ROPE_KERNEL, "bwd")
        cos, sin = ctx.saved_tensors
        return rotate_transposed(dy.float(), cos, sin).to(torch.bfloat16), None, None


def silu(x: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``x * sigmoid(x)``: ``[T,F] -> [T,F]``."""
    where = "portable_cpu.silu"
    v.tensor(where, "x", x, 2)
    ctx.check_rows(where, x.shape[0])
    return _Silu.apply(x)


def swiglu(gate: torch.Tensor, up: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``silu(gate) * up``: ``[T,F], [T,F] -> [T,F]``."""
    where = "portable_cpu.swiglu"
    v.tensor(where, "gate", gate, 2)
    v.tensor(where, "up", up, 2)
    v.dims(where, "up", up, tuple(gate.shape))
    ctx.check_rows(where, gate.shape[0])
    return _SwiGLU.apply(gate, up)


def rope(x: torch.Tensor, theta: float, ctx: LayoutContext) -> torch.Tensor:
    """Rotary embedding (HF rotate_half) at ``ctx.positions``: ``[T,Nh,D] -> [T,Nh,D]``."""
    theta = check_rope("portable_cpu.rope", x, theta, ctx, torch.bfloat16)
    return _Rope.apply(x, theta, ctx.on(x.device)[1])


# The aten ops each candidate may dispatch, forward and backward, recorded over every layout type
# (tests/ws1_kernels/test_registry.py re-records them): anything else is a fallback the harness must see.
_DECLARED_SILU = frozenset(
    {
        "aten._to_copy",
        "aten.add",
        "aten.detach",
        "aten.exp",
        "aten.mul",
        "aten.neg",
        "aten.reciprocal",
        "aten.rsub",
    }
)
_DECLARED_SWIGLU = _DECLARED_SILU  # the same ops: one path
_DECLARED_ROPE = frozenset(
    {
        "aten._to_copy",
        "aten.add",
        "aten.arange",
        "aten.cat",
        "aten.clamp",
        "aten.cos",
        "aten.detach",
        "aten.div",
        "aten.mul",
        "aten.neg",
        "aten.pow",
        "aten.reciprocal",
        "aten.sin",
        "aten.slice",
        "aten.unsqueeze",
    }
)

OPS: dict[str, OpEntry] = {
    "silu": OpEntry(silu, SILU_KERNEL, _DECLARED_SILU),
    "swiglu": OpEntry(swiglu, SWIGLU_KERNEL, _DECLARED_SWIGLU),
    "rope": OpEntry(rope, ROPE_KERNEL, _DECLARED_ROPE),
}
