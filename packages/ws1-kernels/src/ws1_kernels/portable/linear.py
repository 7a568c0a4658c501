"""det_gemm and lm_head: ``x[T,K] @ weight[N,K]^T`` with fixed-shape row blocks (portable_cpu).

Forward and dx: each output row comes from ``ROW_BLOCK``-row ``mm`` calls (fp32, zero-filled), so its bits do
not depend on T or on the other rows.  The weight is converted to fp32 one ``VOCAB_BLOCK``-row chunk at a time
(a full fp32 lm_head weight would be 2.5 GB).  dW follows ``sample_blocks_main_grad``.
"""

from __future__ import annotations

import torch

from .. import _validate as v
from ..backend import OpEntry
from ..context import LayoutContext
from ..launches import record
from ..main_grad import check_main_grad, main_grad_of
from ._blocks import (
    ROW_BLOCK,
    VOCAB_BLOCK,
    WGRAD_COL_BLOCK,
    blocked_mm,
    fp32_weight,
    gather_blocks,
    pad_rows,
    wgrad_index,
)


def linear_forward_fp32_chunks(x_pad: torch.Tensor, weight: torch.Tensor):
    """Yield ``(c0, c1, w_chunk_fp32, logits_chunk_fp32[Tp, c1-c0])`` over the weight rows in fixed chunks."""
    n = weight.shape[0]
    w32 = fp32_weight(weight)  # once per call: each lookup checks the weight's bits
    for c0 in range(0, n, VOCAB_BLOCK):
        c1 = min(n, c0 + VOCAB_BLOCK)
        wc = w32[c0:c1]
        yield c0, c1, wc, blocked_mm(x_pad, wc.t())


def dx_accumulate(acc: torch.Tensor, dy_chunk_pad: torch.Tensor, w_chunk: torch.Tensor) -> None:
    """``acc += dy_chunk @ w_chunk`` with one fixed-shape ``mm`` per row block (chunks added in order)."""
    for i in range(0, acc.shape[0], ROW_BLOCK):
        acc[i : i + ROW_BLOCK].addmm_(dy_chunk_pad[i : i + ROW_BLOCK], w_chunk)


def wgrad_accumulate(mg: torch.Tensor, dy_blocks: torch.Tensor, x_blocks: torch.Tensor, c0: int) -> None:
    """``main_grad[c0:c0+n] += dy_b^T @ x_b`` for every block b in order (rule sample_blocks_main_grad).

    ``dy_blocks[nb, WB, n]`` and ``x_blocks[nb, WB, K]`` come from ``gather_blocks``; dy is transposed into a
    contiguous ``[nb, n, WB]`` first (a strided A operand made MKL 6x slower here); the weight rows are walked
    in chunks of ``WGRAD_COL_BLOCK`` so the accumulator chunk stays in cache across blocks.  Chunking the rows
    of main_grad does not change any element's order of additions (block 0, 1, ... of sample order).  Each
    block is one fixed-shape ``addmm_`` (C <- C + A.B with beta = alpha = 1): measured 10x faster than ``mm``
    into a buffer plus ``add_`` (lm_head 4096x151936, one 16-token block: 0.19 s against 2.2 s).
    """
    n = dy_blocks.shape[2]
    dyt = dy_blocks.transpose(1, 2).contiguous()
    for r0 in range(0, n, WGRAD_COL_BLOCK):
        r1 = min(n, r0 + WGRAD_COL_BLOCK)
        dst = mg[c0 + r0 : c0 + r1]
        for b in range(dy_blocks.shape[0]):
            dst.addmm_(dyt[b, r0:r1], x_blocks[b])


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, lctx, kernel_id):  # type: ignore[override]
        record(kernel_id, "fwd")
        t = x.shape[0]
        out = torch.empty((t, weight.shape[0]), dtype=torch.bfloat16, device=x.device)
        for c0, c1, _wc, logits in linear_forward_fp32_chunks(pad_rows(x), weight):
            out[:, c0:c1] = logits[:t]
        ctx.save_for_backward(x, weight)
        ctx.lctx = lctx
        ctx.kernel_id = kernel_id
        return out

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        record(ctx.kernel_id, "bwd")
        x, weight = ctx.saved_tensors
        t = x.shape[0]
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dx = None
        if need_x:
            dy_pad = pad_rows(dy)
            acc = torch.zeros((dy_pad.shape[0], x.shape[1]), dtype=torch.float32, device=x.device)
            w32 = fp32_weight(weight)
            for c0 in range(0, weight.shape[0], VOCAB_BLOCK):
                c1 = min(weight.shape[0], c0 + VOCAB_BLOCK)
                dx_accumulate(acc, dy_pad[:, c0:c1], w32[c0:c1])
            dx = acc[:t].to(torch.bfloat16)
        if need_w:
            index = wgrad_index(ctx.lctx.segments, zero_row=t)
            wgrad_accumulate(main_grad_of(weight), gather_blocks(dy, index), gather_blocks(x, index), 0)
        return dx, None, None, None


def _linear(
    where: str, kernel_id: str, x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext
) -> torch.Tensor:
    v.tensor(where, "x", x, 2)
    v.tensor(where, "weight", weight, 2)
    v.dims(where, "weight", weight, (None, x.shape[1]))
    ctx.check_rows(where, x.shape[0])
    check_main_grad(where, weight)
    return _Linear.apply(x, weight, ctx, kernel_id)


DET_GEMM_KERNEL = f"ws1.cpu.det_gemm.rowblock{ROW_BLOCK}"
LM_HEAD_KERNEL = f"ws1.cpu.lm_head.rowblock{ROW_BLOCK}"


def det_gemm(x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """Linear projection ``[T,K] x [N,K]^T -> [T,N]``, bf16 in and out, fp32 accumulation."""
    return _linear("portable_cpu.det_gemm", DET_GEMM_KERNEL, x, weight, ctx)


def lm_head(x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """Logits ``[T,H] x [V,H]^T -> [T,V]``, bf16 in and out, fp32 accumulation."""
    return _linear("portable_cpu.lm_head", LM_HEAD_KERNEL, x, weight, ctx)


# The aten ops each candidate may dispatch, forward and backward, recorded over every layout type
# (tests/ws1_kernels/test_registry.py re-records them): anything else is a fallback the harness must see.
_DECLARED_DET_GEMM = frozenset(
    {
        "aten._to_copy",
        "aten.addmm_",
        "aten.alias",
        "aten.cat",
        "aten.clone",
        "aten.copy_",
        "aten.detach",
        "aten.empty",
        "aten.equal",
        "aten.index",
        "aten.lift_fresh",
        "aten.mm",
        "aten.new_zeros",
        "aten.select",
        "aten.slice",
        "aten.t",
        "aten.transpose",
        "aten.view",
        "aten.zeros",
    }
)
_DECLARED_LM_HEAD = _DECLARED_DET_GEMM  # the same ops: one path

OPS: dict[str, OpEntry] = {
    "det_gemm": OpEntry(det_gemm, DET_GEMM_KERNEL, _DECLARED_DET_GEMM),
    "lm_head": OpEntry(lm_head, LM_HEAD_KERNEL, _DECLARED_LM_HEAD),
}
