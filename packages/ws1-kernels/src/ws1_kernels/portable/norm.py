"""rms_norm and qk_norm (portable_cpu): per-row fp32 math, row sums by ``tree_sum``; dW by sample blocks."""

from __future__ import annotations

import torch

from .. import _validate as v
from ..backend import OpEntry
from ..context import LayoutContext
from ..launches import record
from ..main_grad import check_main_grad, main_grad_of
from ._blocks import gather_blocks, tree_sum, wgrad_index


def _rms_rows(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``1/sqrt(mean(x^2) + eps)`` over the last dim, fp32, keepdim."""
    ms = tree_sum(x * x, -1) / x.shape[-1]
    return (1.0 / torch.sqrt(ms + eps)).unsqueeze(-1)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, lctx, kernel_id):  # type: ignore[override]
        record(kernel_id, "fwd")
        xf = x.float()
        r = _rms_rows(xf, eps)
        y = (xf * r) * weight.float()
        ctx.save_for_backward(x, weight)
        ctx.eps, ctx.lctx, ctx.kernel_id = eps, lctx, kernel_id
        return y.to(torch.bfloat16)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        record(ctx.kernel_id, "bwd")
        x, weight = ctx.saved_tensors
        xf, dyf = x.float(), dy.float()
        r = _rms_rows(xf, ctx.eps)
        xhat = xf * r
        dx = None
        if ctx.needs_input_grad[0]:
            g = dyf * weight.float()
            c = (tree_sum(g * xhat, -1) / x.shape[-1]).unsqueeze(-1)
            dx = (r * (g - xhat * c)).to(torch.bfloat16)
        if ctx.needs_input_grad[1]:
            index = wgrad_index(ctx.lctx.segments, zero_row=x.shape[0])
            blocks = gather_blocks(dyf * xhat, index)  # [nb, WB, ..., D]
            sums = tree_sum(blocks.reshape(blocks.shape[0], -1, x.shape[-1]), 1)  # [nb, D]
            mg = main_grad_of(weight)
            for b in range(sums.shape[0]):
                mg += sums[b]
        return dx, None, None, None, None


RMS_KERNEL = "ws1.cpu.rms_norm.rowwise"
QK_KERNEL = "ws1.cpu.qk_norm.rowwise"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, ctx: LayoutContext) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the hidden dim: ``[T,H] -> [T,H]``."""
    where = "portable_cpu.rms_norm"
    v.tensor(where, "x", x, 2)
    v.tensor(where, "weight", weight, 1)
    v.dims(where, "weight", weight, (x.shape[1],))
    eps = v.positive(where, "eps", eps)
    ctx.check_rows(where, x.shape[0])
    check_main_grad(where, weight)
    return _RMSNorm.apply(x, weight, eps, ctx, RMS_KERNEL)


def qk_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, ctx: LayoutContext) -> torch.Tensor:
    """RMS norm of every head over head_dim: ``[T,Nh,D] -> [T,Nh,D]``, one weight ``[D]`` shared by heads."""
    where = "portable_cpu.qk_norm"
    v.tensor(where, "x", x, 3)
    v.tensor(where, "weight", weight, 1)
    v.dims(where, "weight", weight, (x.shape[2],))
    eps = v.positive(where, "eps", eps)
    ctx.check_rows(where, x.shape[0])
    check_main_grad(where, weight)
    return _RMSNorm.apply(x, weight, eps, ctx, QK_KERNEL)


# The aten ops each candidate may dispatch, forward and backward, recorded over every layout type
# (tests/ws1_kernels/test_registry.py re-records them): anything else is a fallback the harness must see.
_DECLARED_RMS_NORM = frozenset(
    {
        "aten._to_copy",
        "aten.add",
        "aten.add_",
        "aten.cat",
        "aten.detach",
        "aten.div",
        "aten.index",
        "aten.lift_fresh",
        "aten.mul",
        "aten.new_zeros",
        "aten.reciprocal",
        "aten.select",
        "aten.slice",
        "aten.sqrt",
        "aten.squeeze",
        "aten.sub",
        "aten.unsqueeze",
        "aten.view",
        "aten.zeros",
    }
)
_DECLARED_QK_NORM = _DECLARED_RMS_NORM  # the same ops: one path

OPS: dict[str, OpEntry] = {
    "rms_norm": OpEntry(rms_norm, RMS_KERNEL, _DECLARED_RMS_NORM),
    "qk_norm": OpEntry(qk_norm, QK_KERNEL, _DECLARED_QK_NORM),
}
