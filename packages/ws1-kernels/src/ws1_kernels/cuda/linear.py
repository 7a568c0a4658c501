"""det_gemm and lm_head (cuda_bf16): ``y = x W^T`` on the tensor cores, fp32 accumulation, no split of K.

The autograd wrapper takes the GEMM as an argument (``Gemm``), so the Hopper profile (``cuda_sm90.linear``) runs
its own forward and dx kernels through the same code, with the same ``sample_blocks_main_grad`` weight gradient.

``torch.ops.ws1.gemm`` (csrc/kernels/gemm.cu): every element of y is one accumulator fed 16-wide MMA steps over the
reduced dim from 0 upward, so its bits depend only on K, never on T or the tile it falls in (128 x 128 above 64
rows, 32 x 64 at or below). dx is the same kernel on ``dy W`` (reduced over N). The weight gradient walks the
call's ``sample_blocks_main_grad`` blocks in order (``row_tables.block_table``): one MMA per 16-row block into the
``main_grad`` tile it carries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


#: a weight-gradient op: ``op(dy, x, table_rows, n_blocks, main_grad, dy_lo)`` adds the blocks into main_grad
WgradOp = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor, "torch.Tensor | None"], None]
#: a profile's own weight gradient for a weight, by its shape alone: (kernel id, op), or None for the generic one
WgradPick = Callable[[torch.Tensor], "tuple[str, WgradOp] | None"]


def _generic_wgrad(
    dy: torch.Tensor,
    x: torch.Tensor,
    rows: torch.Tensor,
    n_blocks: int,
    mg: torch.Tensor,
    lo: torch.Tensor | None,
) -> None:
    torch.ops.ws1.gemm_wgrad(dy, x, rows, n_blocks, mg, lo)


@dataclass(frozen=True)
class Gemm:
    """A profile's GEMM for the linear layers: ``op(a, b, b_trans)`` (``a b^T`` or ``a b``), the kernel ids its
    forward and dx record, and the id the generic weight gradient (``ws1.gemm_wgrad``) records. ``wgrad``, if
    set, may give the profile's own weight gradient for a weight (by its shape alone, never the batch's)."""

    op: Callable[[torch.Tensor, torch.Tensor, bool], torch.Tensor]
    kernel: str
    wgrad_kernel: str
    wgrad: WgradPick | None = None

    def wgrad_for(self, weight: torch.Tensor) -> tuple[str, WgradOp]:
        """The weight gradient that runs for ``weight``: (the id it records, its op)."""
        kernel, op = pick_wgrad(self.wgrad, weight, self.wgrad_kernel)
        assert kernel is not None  # a str generic id gives a str
        return kernel, op


def pick_wgrad(
    pick: WgradPick | None, weight: torch.Tensor, generic_id: str | None
) -> tuple[str | None, WgradOp]:
    """The weight gradient for ``weight``: the profile's own where ``pick`` gives one (by the weight's shape alone),
    else the generic ``ws1.gemm_wgrad``; with the id to record, ``generic_id`` for the generic one (None where the
    caller's own id already names it, as linear_logp's does). The one place that decides, for every caller."""
    own = pick(weight) if pick is not None else None
    return own if own is not None else (generic_id, _generic_wgrad)


def wgrad_into_main_grad(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    lctx: LayoutContext,
    dy_lo: torch.Tensor | None = None,
    op: WgradOp = _generic_wgrad,
) -> None:
    """``main_grad(weight) += dy^T x`` under ``sample_blocks_main_grad``: the call's sample-aligned 16-row blocks
    in order, one MMA per block into the fp32 tile it carries (``dy_lo``: dy's low bf16 half, if split), through
    ``op`` (the generic kernel unless a profile gives its own)."""
    table = block_table(lctx, x.shape[0], x.device)
    mg = main_grad_of(weight)
    if table.n_blocks:
        op(dy, x, table.rows, table.n_blocks, mg, dy_lo)


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, lctx, gemm):  # type: ignore[override]
        record(gemm.kernel, "fwd")
        ctx.save_for_backward(x, weight)
        ctx.lctx, ctx.gemm = lctx, gemm
        return gemm.op(x, weight, True)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        do_dx, do_dw = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
        if not (do_dx or do_dw):
            return None, None, None, None
        gemm: Gemm = ctx.gemm
        dy = dy.contiguous()
        dx = None
        if do_dx:
            record(gemm.kernel, "bwd")
            dx = gemm.op(dy, weight, False)
        if do_dw:
            kernel, op = gemm.wgrad_for(weight)
            record(kernel, "bwd")
            wgrad_into_main_grad(dy, x, weight, ctx.lctx, op=op)
        return dx, None, None, None


def linear(where: str, gemm: Gemm, x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``x W^T`` through ``gemm`` after the checks a raw pointer needs (once per call, before any launch)."""
    v.tensor(where, "x", x, 2, None)
    v.tensor(where, "weight", weight, 2, None)
    v.dims(where, "weight", weight, (None, x.shape[1]))
    check_inputs(where, ctx, x.shape[0], x=x, weight=weight)
    check_main_grad(where, weight)
    return _Linear.apply(x, weight, ctx, gemm)


def _ws1_gemm(a: torch.Tensor, b: torch.Tensor, b_trans: bool) -> torch.Tensor:
    return torch.ops.ws1.gemm(a, b, b_trans)


_DET_GEMM = Gemm(_ws1_gemm, DET_GEMM, DET_GEMM)
_LM_HEAD = Gemm(_ws1_gemm, LM_HEAD, LM_HEAD)


def det_gemm(x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``x W^T``: ``[T,K], [N,K] -> [T,N]`` (the projections of a decoder layer)."""
    return linear("cuda_bf16.det_gemm", _DET_GEMM, x, weight, ctx)


def lm_head(x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``x W^T`` over the vocabulary: ``[T,H], [V,H] -> [T,V]``."""
    return linear("cuda_bf16.lm_head", _LM_HEAD, x, weight, ctx)


# zeros: main_grad created lazily; lift_fresh/_to_copy: the host-built block table (once per call and device);
# clone: contiguous() of a non-contiguous upstream gradient; detach: autograd's bookkeeping
DECLARED = frozenset(
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
    "det_gemm": OpEntry(det_gemm, DET_GEMM, DECLARED),
    "lm_head": OpEntry(lm_head, LM_HEAD, DECLARED),
}
