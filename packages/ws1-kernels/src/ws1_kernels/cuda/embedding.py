"""embedding (cuda_bf16): ``torch.ops.ws1.embedding_fwd`` (an exact gather) and ``embedding_bwd``.

The backward puts the call's real rows in logical order (``row_tables.logical_rows``, host-built once per call
and device), stable-sorts their ids on the device (``torch.sort(stable=True)``, deterministic), and the kernel
adds each run of one id into ``weight.main_grad`` one occurrence at a time, in logical order (csrc/kernels/
embedding.cu): one writer per element, no atomics; the portable rule's sequence of additions.

The id range is checked on the host (``_validate.token_ids``: one ``aminmax`` and a read, a device sync) so an
out-of-range id is a ``KernelInputError``; the kernels also mask such an id (a zero row, no add).
"""

from __future__ import annotations

import torch

from .. import _validate as v
from ..backend import OpEntry
from ..context import LayoutContext
from ..launches import record
from ..main_grad import check_main_grad, main_grad_of
from ..row_tables import logical_rows
from ._common import check_inputs

KERNEL = "ws1.cuda.embedding.gather"


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, token_ids, weight, lctx):  # type: ignore[override]
        record(KERNEL, "fwd")
        ctx.save_for_backward(token_ids)
        ctx.weight, ctx.lctx = weight, lctx
        return torch.ops.ws1.embedding_fwd(token_ids, weight)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        if not ctx.needs_input_grad[1]:
            return None, None, None
        record(KERNEL, "bwd")
        (token_ids,) = ctx.saved_tensors
        mg = main_grad_of(ctx.weight)
        rows = logical_rows(ctx.lctx, dy.device)
        if rows is not None:
            ids_sorted, perm = torch.sort(token_ids[rows], stable=True)
            torch.ops.ws1.embedding_bwd(ids_sorted, rows[perm], dy.contiguous(), mg)
        return None, None, None


def embedding(token_ids: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``weight[token_ids]``: ``[T] ids, [V,H] -> [T,H]``."""
    where = "cuda_bf16.embedding"
    v.tensor(where, "weight", weight, 2, None)
    ids = v.token_ids(where, "token_ids", token_ids, weight.shape[0])
    check_inputs(where, ctx, ids.shape[0], weight=weight)
    if ids.device != weight.device:
        raise v.KernelInputError(f"{where}: token_ids on {ids.device}, weight on {weight.device}")
    check_main_grad(where, weight)
    return _Embedding.apply(ids.contiguous(), weight, ctx)


# aminmax/_local_scalar_dense: the host check of the id range; index/sort: the logical rows' ids, stable-sorted;
# lift_fresh/_to_copy: the logical-row table (once per call and device); zeros: main_grad created lazily;
# clone: contiguous() of a non-contiguous upstream gradient; detach: autograd's bookkeeping
_DECLARED = frozenset(
    {
        "ws1.embedding_fwd",
        "ws1.embedding_bwd",
        "aten.aminmax",
        "aten._local_scalar_dense",
        "aten.index",
        "aten.sort",
        "aten.lift_fresh",
        "aten._to_copy",
        "aten.zeros",
        "aten.clone",
        "aten.detach",
    }
)
OPS: dict[str, OpEntry] = {"embedding": OpEntry(embedding, KERNEL, _DECLARED)}
