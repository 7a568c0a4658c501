"""logp and linear_logp (portable_cpu): selected-token logprob, vocab walked in fixed blocks.

Both keep a per-row online log-sum-exp (max, scaled sum) over ``VOCAB_BLOCK`` vocab columns in ascending
order; a block's sum is a ``tree_sum``, so a row's result depends only on its own logits and V.
``linear_logp`` fuses the lm_head GEMM (fixed-shape row blocks, see linear.py) and never materialises the
``[T,V]`` logits: forward and backward recompute one ``[T,VOCAB_BLOCK]`` fp32 block at a time.
"""

from __future__ import annotations

import torch

from .. import _validate as v
from ..backend import OpEntry
from ..context import LayoutContext
from ..launches import record
from ..main_grad import check_main_grad, main_grad_of
from ..op_checks import check_targets
from . import _math
from ._blocks import VOCAB_BLOCK, gather_blocks, pad_rows, tree_sum, wgrad_index
from .linear import dx_accumulate, linear_forward_fp32_chunks, wgrad_accumulate

LOGP_KERNEL = "ws1.cpu.logp.rowwise"
LINEAR_LOGP_KERNEL = "ws1.cpu.linear_logp.vocabblock"


class OnlineLSE:
    """Running ``(m, s)`` with ``lse = m + log(s)``; ``update`` folds in one fp32 block ``[T, n]``."""

    def __init__(self, rows: int, device: torch.device):
        self.m = torch.full((rows,), float("-inf"), device=device)
        self.s = torch.zeros((rows,), device=device)

    def update(self, block: torch.Tensor) -> None:
        m_new = torch.maximum(self.m, block.amax(-1))
        self.s = self.s * _math.exp(self.m - m_new) + tree_sum(_math.exp(block - m_new.unsqueeze(-1)), -1)
        self.m = m_new

    def lse(self) -> torch.Tensor:
        return self.m + _math.log(self.s)


def _target_mask(targets: torch.Tensor, c0: int, c1: int):
    """Rows whose target lies in ``[c0, c1)`` and the target's column inside the block."""
    rows = ((targets >= c0) & (targets < c1)).nonzero().squeeze(-1)
    return rows, targets[rows] - c0


def _dlogits_block(block: torch.Tensor, lse: torch.Tensor, g: torch.Tensor, targets, c0: int, c1: int):
    """fp32 ``d logp / d logits`` for one block times upstream ``g``: ``g*(onehot - softmax)``."""
    d = -g.unsqueeze(-1) * _math.exp(block - lse.unsqueeze(-1))
    rows, cols = _target_mask(targets, c0, c1)
    d[rows, cols] = d[rows, cols] + g[rows]
    return d


class _Logp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets):  # type: ignore[override]
        record(LOGP_KERNEL, "fwd")
        t, vocab = logits.shape
        acc = OnlineLSE(t, logits.device)
        for c0 in range(0, vocab, VOCAB_BLOCK):
            acc.update(logits[:, c0 : c0 + VOCAB_BLOCK].float())
        lse = acc.lse()
        ctx.save_for_backward(logits, targets, lse)
        return logits.gather(1, targets.unsqueeze(1)).squeeze(1).float() - lse

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None, None
        record(LOGP_KERNEL, "bwd")
        logits, targets, lse = ctx.saved_tensors
        g = g.float()
        dl = torch.empty_like(logits)
        for c0 in range(0, logits.shape[1], VOCAB_BLOCK):
            c1 = min(logits.shape[1], c0 + VOCAB_BLOCK)
            dl[:, c0:c1] = _dlogits_block(logits[:, c0:c1].float(), lse, g, targets, c0, c1)
        return dl, None


class _LinearLogp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, lctx):  # type: ignore[override]
        record(LINEAR_LOGP_KERNEL, "fwd")
        t = x.shape[0]
        acc = OnlineLSE(t, x.device)
        picked = torch.zeros((t,), dtype=torch.float32, device=x.device)
        for c0, c1, _wc, logits in linear_forward_fp32_chunks(pad_rows(x), weight):
            block = logits[:t]
            acc.update(block)
            rows, cols = _target_mask(targets, c0, c1)
            picked[rows] = block[rows, cols]
        lse = acc.lse()
        ctx.save_for_backward(x, weight, targets, lse)
        ctx.lctx = lctx
        return picked - lse

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (need_x or need_w):
            return None, None, None, None
        record(LINEAR_LOGP_KERNEL, "bwd")
        x, weight, targets, lse = ctx.saved_tensors
        t = x.shape[0]
        g = g.float()
        x_pad = pad_rows(x)
        dx_acc = torch.zeros_like(x_pad) if need_x else None
        if need_w:
            index = wgrad_index(ctx.lctx.segments, zero_row=t)
            x_blocks = gather_blocks(x, index)
            mg = main_grad_of(weight)
        for c0, c1, wc, logits in linear_forward_fp32_chunks(x_pad, weight):
            d = _dlogits_block(logits[:t], lse, g, targets, c0, c1)
            if need_x:
                dx_accumulate(dx_acc, pad_rows(d), wc)
            if need_w:
                wgrad_accumulate(mg, gather_blocks(d, index), x_blocks, c0)
        dx = dx_acc[:t].to(torch.bfloat16) if need_x else None
        return dx, None, None, None


def logp(logits: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``log_softmax(logits)[t, targets[t]]``: ``[T,V], [T] -> fp32 [T]``."""
    where = "portable_cpu.logp"
    v.tensor(where, "logits", logits, 2)
    ctx.check_rows(where, logits.shape[0])
    check_targets(where, targets, logits.shape[1], logits.shape[0])
    return _Logp.apply(logits, targets)


def linear_logp(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext
) -> torch.Tensor:
    """Fused ``logp(lm_head(x))`` without the ``[T,V]`` logits: ``[T,H], [V,H], [T] -> fp32 [T]``."""
    where = "portable_cpu.linear_logp"
    v.tensor(where, "x", x, 2)
    v.tensor(where, "weight", weight, 2)
    v.dims(where, "weight", weight, (None, x.shape[1]))
    ctx.check_rows(where, x.shape[0])
    check_targets(where, targets, weight.shape[0], x.shape[0])
    check_main_grad(where, weight)
    return _LinearLogp.apply(x, weight, targets, ctx)


# The aten ops each candidate may dispatch, forward and backward, recorded over every layout type
# (tests/ws1_kernels/test_registry.py re-records them): anything else is a fallback the harness must see.
_DECLARED_LOGP = frozenset(
    {
        "aten._local_scalar_dense",
        "aten._to_copy",
        "aten.add",
        "aten.alias",
        "aten.amax",
        "aten.aminmax",
        "aten.bitwise_and",
        "aten.cat",
        "aten.copy_",
        "aten.detach",
        "aten.empty_like",
        "aten.exp",
        "aten.full",
        "aten.gather",
        "aten.ge",
        "aten.index",
        "aten.index_put_",
        "aten.log",
        "aten.lt",
        "aten.maximum",
        "aten.mul",
        "aten.neg",
        "aten.new_zeros",
        "aten.nonzero",
        "aten.slice",
        "aten.squeeze",
        "aten.sub",
        "aten.unsqueeze",
        "aten.zeros",
    }
)
_DECLARED_LINEAR_LOGP = frozenset(
    {
        "aten._local_scalar_dense",
        "aten._to_copy",
        "aten.add",
        "aten.addmm_",
        "aten.amax",
        "aten.aminmax",
        "aten.bitwise_and",
        "aten.cat",
        "aten.clone",
        "aten.copy_",
        "aten.detach",
        "aten.empty",
        "aten.equal",
        "aten.exp",
        "aten.full",
        "aten.ge",
        "aten.index",
        "aten.index_put_",
        "aten.lift_fresh",
        "aten.log",
        "aten.lt",
        "aten.maximum",
        "aten.mm",
        "aten.mul",
        "aten.neg",
        "aten.new_zeros",
        "aten.nonzero",
        "aten.select",
        "aten.slice",
        "aten.squeeze",
        "aten.sub",
        "aten.t",
        "aten.transpose",
        "aten.unsqueeze",
        "aten.view",
        "aten.zeros",
        "aten.zeros_like",
    }
)

OPS: dict[str, OpEntry] = {
    "logp": OpEntry(logp, LOGP_KERNEL, _DECLARED_LOGP),
    "linear_logp": OpEntry(linear_logp, LINEAR_LOGP_KERNEL, _DECLARED_LINEAR_LOGP),
}
