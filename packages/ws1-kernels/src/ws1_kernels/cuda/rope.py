"""rope (cuda_bf16): ``torch.ops.ws1.rope``, HF rotate_half at the context's positions, fp64 angles.

One thread per pair of elements (csrc/kernels/rope.cu): no reduction, so any layout gives the same bits; the
backward is the transposed rotation of the gradient.
"""

from __future__ import annotations

import torch

from ..backend import OpEntry
from ..context import LayoutContext
from ..launches import record
from ..op_checks import check_rope
from ._common import check_inputs

KERNEL = "ws1.cuda.rope.rotate_half"


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, positions, theta):  # type: ignore[override]
        record(KERNEL, "fwd")
        ctx.save_for_backward(positions)
        ctx.theta = theta
        return torch.ops.ws1.rope(x, positions, theta, False)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        record(KERNEL, "bwd")
        (positions,) = ctx.saved_tensors
        return torch.ops.ws1.rope(dy.contiguous(), positions, ctx.theta, True), None, None


def rope(x: torch.Tensor, theta: float, ctx: LayoutContext) -> torch.Tensor:
    """Rotary embedding (HF rotate_half) at ``ctx.positions``: ``[T,Nh,D] -> [T,Nh,D]``."""
    where = "cuda_bf16.rope"
    theta = check_rope(where, x, theta, ctx, None)
    check_inputs(where, ctx, x.shape[0], x=x)
    _, positions = ctx.on(x.device)
    return _Rope.apply(x, positions, theta)


# lift_fresh/_to_copy: the context's ids copied to the device once per context; clone: contiguous() of a
# non-contiguous upstream gradient; detach: autograd's bookkeeping
_DECLARED = frozenset({"ws1.rope", "aten.lift_fresh", "aten._to_copy", "aten.clone", "aten.detach"})
OPS: dict[str, OpEntry] = {"rope": OpEntry(rope, KERNEL, _DECLARED)}
