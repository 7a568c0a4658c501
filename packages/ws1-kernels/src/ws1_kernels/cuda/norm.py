"""rms_norm and qk_norm (cuda_bf16): one warp per (token, head) row, the weight gradient by sample blocks.

``torch.ops.ws1.norm_fwd`` / ``norm_bwd`` / ``wgrad_accumulate`` (csrc/kernels/norm.cu). A row's sums are
lane-strided partial sums folded by a fixed butterfly, so their order depends only on the row width. The
backward walks the call's ``sample_blocks_main_grad`` blocks (``row_tables.block_table``, built on the host once
per call and device): each block's column sums of ``dy * xhat`` (slot by slot, head by head) land in a block-sum
row, and ``wgrad_accumulate`` adds the rows into ``weight.main_grad`` in block order, one thread per column.
"""

from __future__ import annotations

import torch

from .. import _validate as v
from ..backend import OpEntry
from ..context import LayoutContext
from ..launches import record
from ..main_grad import check_main_grad, main_grad_of
from ..row_tables import block_table
from ._common import check_inputs

RMS = "ws1.cuda.rms_norm.rowwise"
QK = "ws1.cuda.qk_norm.rowwise"


class _Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, lctx, kernel):  # type: ignore[override]
        record(kernel, "fwd")
        ctx.save_for_backward(x, weight)
        ctx.eps, ctx.lctx, ctx.kernel = eps, lctx, kernel
        return torch.ops.ws1.norm_fwd(x, weight, eps)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        do_dx, do_dw = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
        if not (do_dx or do_dw):
            return None, None, None, None, None
        record(ctx.kernel, "bwd")
        table = block_table(ctx.lctx, x.shape[0], x.device)
        dx, bsum = torch.ops.ws1.norm_bwd(
            x, weight, dy.contiguous(), table.rows, table.n_blocks, ctx.eps, do_dx, do_dw
        )
        if do_dw and table.n_blocks:
            torch.ops.ws1.wgrad_accumulate(bsum, main_grad_of(weight), table.n_blocks)
        return (dx if do_dx else None), None, None, None, None


def _norm(where: str, kernel: str, x: torch.Tensor, weight: torch.Tensor, eps: float, ctx: LayoutContext):
    check_inputs(where, ctx, x.shape[0], x=x, weight=weight)
    if x.numel() == 0 and x.shape[0] != 0:
        raise v.KernelInputError(f"{where}: x has an empty row shape {tuple(x.shape)}")
    eps = v.positive(where, "eps", eps)
    check_main_grad(where, weight)
    return _Norm.apply(x, weight, eps, ctx, kernel)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, ctx: LayoutContext) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the hidden dim: ``[T,H] -> [T,H]``."""
    where = "cuda_bf16.rms_norm"
    v.tensor(where, "x", x, 2, None)
    v.tensor(where, "weight", weight, 1, None)
    v.dims(where, "weight", weight, (x.shape[1],))
    return _norm(where, RMS, x, weight, eps, ctx)


def qk_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, ctx: LayoutContext) -> torch.Tensor:
    """RMS norm of every head over head_dim: ``[T,Nh,D] -> [T,Nh,D]``, one weight ``[D]`` shared by heads."""
    where = "cuda_bf16.qk_norm"
    v.tensor(where, "x", x, 3, None)
    v.tensor(where, "weight", weight, 1, None)
    v.dims(where, "weight", weight, (x.shape[2],))
    return _norm(where, QK, x, weight, eps, ctx)


# the ws1 ops; zeros: main_grad created lazily; lift_fresh/_to_copy: the host-built block table (once per call
# and device); clone: contiguous() of a non-contiguous upstream gradient; detach: autograd's bookkeeping
_DECLARED = frozenset(
    {
        "ws1.norm_fwd",
        "ws1.norm_bwd",
        "ws1.wgrad_accumulate",
        "aten.zeros",
        "aten.lift_fresh",
        "aten._to_copy",
        "aten.clone",
        "aten.detach",
    }
)
OPS: dict[str, OpEntry] = {
    "rms_norm": OpEntry(rms_norm, RMS, _DECLARED),
    "qk_norm": OpEntry(qk_norm, QK, _DECLARED),
}
