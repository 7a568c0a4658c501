"""embedding (portable_cpu): an exact gather forward; a sorted, sample-ordered backward into ``main_grad``.

Backward never launches vocab x hidden work: the call's real tokens are put in logical order (sample id
ascending, position ascending), grouped per unique token id (sorted), and added into ``weight.main_grad`` one
occurrence at a time in that order.  Round r adds the r-th occurrence of every id at once; ids are unique within
a round, so each element gets exactly one fp32 add per round.  Across micro-batches (ascending sample order)
every element therefore sees the same sequence of additions as in one B=N call.
"""

from __future__ import annotations

import torch

from .. import _validate as v
from ..backend import OpEntry
from ..context import LayoutContext
from ..launches import record
from ..main_grad import check_main_grad, main_grad_of

KERNEL = "ws1.cpu.embedding.gather"


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, token_ids, weight, lctx):  # type: ignore[override]
        record(KERNEL, "fwd")
        ctx.save_for_backward(token_ids)
        ctx.weight = weight
        ctx.lctx = lctx
        return weight.index_select(0, token_ids)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        if not ctx.needs_input_grad[1]:
            return None, None, None
        record(KERNEL, "bwd")
        (token_ids,) = ctx.saved_tensors
        order = [
            r
            for seg in sorted(ctx.lctx.segments, key=lambda s: s.sample_id)
            for r in range(seg.start, seg.end)
        ]
        if order:
            rows = torch.tensor(order, dtype=torch.int64, device=dy.device)
            ids = token_ids[rows]
            ids_sorted, perm = torch.sort(ids, stable=True)
            rows = rows[perm]
            n = ids_sorted.shape[0]
            first = torch.ones(n, dtype=torch.bool, device=dy.device)
            first[1:] = ids_sorted[1:] != ids_sorted[:-1]
            starts = torch.cummax(torch.where(first, torch.arange(n, device=dy.device), 0), 0).values
            rank = torch.arange(n, device=dy.device) - starts
            mg = main_grad_of(ctx.weight)
            dyf = dy.float()
            for r in range(int(rank.max()) + 1):
                sel = rank == r
                idr = ids_sorted[sel]
                mg[idr] = mg[idr] + dyf[rows[sel]]
        return None, None, None


def embedding(token_ids: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``weight[token_ids]``: ``[T] x [V,H] -> [T,H]`` bf16; ids outside ``[0, V)`` are refused."""
    where = "portable_cpu.embedding"
    v.tensor(where, "weight", weight, 2)
    v.token_ids(where, "token_ids", token_ids, weight.shape[0])
    ctx.check_rows(where, token_ids.shape[0])
    check_main_grad(where, weight)
    return _Embedding.apply(token_ids, weight, ctx)


# The aten ops each candidate may dispatch, forward and backward, recorded over every layout type
# (tests/ws1_kernels/test_registry.py re-records them): anything else is a fallback the harness must see.
_DECLARED_EMBEDDING = frozenset(
    {
        "aten._local_scalar_dense",
        "aten._to_copy",
        "aten.add",
        "aten.aminmax",
        "aten.arange",
        "aten.copy_",
        "aten.cummax",
        "aten.eq",
        "aten.index",
        "aten.index_put_",
        "aten.index_select",
        "aten.lift_fresh",
        "aten.max",
        "aten.ne",
        "aten.ones",
        "aten.scalar_tensor",
        "aten.slice",
        "aten.sort",
        "aten.sub",
        "aten.where",
        "aten.zeros",
    }
)

OPS: dict[str, OpEntry] = {
    "embedding": OpEntry(embedding, KERNEL, _DECLARED_EMBEDDING),
}
