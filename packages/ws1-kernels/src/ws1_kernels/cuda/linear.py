"""det_gemm and lm_head (cuda_bf16): ``y = x W^T`` on the tensor cores, fp32 accumulation, no split of K.

``torch.ops.ws1.gemm`` (csrc/kernels/gemm.cu): every element of y is one accumulator fed 16-wide MMA steps over the
reduced dim from 0 upward, so its bits depend only on K, never on T or the tile it falls in (128 x 128 above 64
rows, 32 x 64 at or below). dx is the same kernel on ``dy W`` (reduced over N). The weight gradient walks the
call's ``sample_blocks_main_grad`` blocks in order (``row_tables.block_table``): one MMA per 16-row block into the
``main_grad`` tile it carries.
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

DET_GEMM = "ws1.cuda.det_gemm.fixed_k"
LM_HEAD = "ws1.cuda.lm_head.fixed_k"


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, lctx, kernel):  # type: ignore[override]
        record(kernel, "fwd")
        ctx.save_for_backward(x, weight)
        ctx.lctx, ctx.kernel = lctx, kernel
        return torch.ops.ws1.gemm(x, weight, True)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        do_dx, do_dw = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
        if not (do_dx or do_dw):
            return None, None, None, None
        record(ctx.kernel, "bwd")
        dy = dy.contiguous()
        dx = torch.ops.ws1.gemm(dy, weight, False) if do_dx else None
        if do_dw:
            table = block_table(ctx.lctx, x.shape[0], x.device)
            mg = main_grad_of(weight)
            if table.n_blocks:
                torch.ops.ws1.gemm_wgrad(dy, x, table.rows, table.n_blocks, mg)
        return dx, None, None, None


def _linear(
    where: str, kernel: str, x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext
) -> torch.Tensor:
    v.tensor(where, "x", x, 2, None)
    v.tensor(where, "weight", weight, 2, None)
    v.dims(where, "weight", weight, (None, x.shape[1]))
    check_inputs(where, ctx, x.shape[0], x=x, weight=weight)
    check_main_grad(where, weight)
    return _Linear.apply(x, weight, ctx, kernel)


def det_gemm(x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``x W^T``: ``[T,K], [N,K] -> [T,N]`` (the projections of a decoder layer)."""
    return _linear("cuda_bf16.det_gemm", DET_GEMM, x, weight, ctx)


def lm_head(x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``x W^T`` over the vocabulary: ``[T,H], [V,H] -> [T,V]``."""
    return _linear("cuda_bf16.lm_head", LM_HEAD, x, weight, ctx)


# zeros: main_grad created lazily; lift_fresh/_to_copy: the host-built block table (once per call and device);
# clone: contiguous() of a non-contiguous upstream gradient; detach: autograd's bookkeeping
_DECLARED = frozenset(
    {
        "ws1.gemm",
        "ws1.gemm_wgrad",
        "aten.zeros",
        "aten.lift_fresh",
        "aten._to_copy",
        "aten.clone",
        "aten.detach",
    }
)
OPS: dict[str, OpEntry] = {
    "det_gemm": OpEntry(det_gemm, DET_GEMM, _DECLARED),
    "lm_head": OpEntry(lm_head, LM_HEAD, _DECLARED),
}
