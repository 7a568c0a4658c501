"""embedding (triton_cuda_bf16): an exact gather forward; a sorted, sample-ordered backward into main_grad.

Forward: program ``(t, c)`` copies ``weight[id_t, c-slice]`` to row ``t`` (no arithmetic, so bits are exact).

Backward (``sample_blocks_main_grad``, blocks of one token): the call's real rows in logical order (sample
ascending, position ascending; a host-built table from ``ctx.segments``), their ids stable-sorted on the
device (``torch.sort(stable=True)``, deterministic), then program ``(i, c)`` of the sorted list starts work
only if ``i`` opens a run of equal ids: it loads ``main_grad[id, c-slice]`` (fp32) and adds the run's rows one
by one in logical order, one fp32 add per occurrence, then stores.  Each ``(id, slice)`` has one writer, so
no atomics; the grid is the call's tokens, never vocab x hidden.  Per element this is the sequence of
additions of the portable rule (its round ``r`` adds the ``r``-th occurrence in logical order), and
``main_grad`` carries it across micro-batches that run in ascending sample order.

Validation of the id range uses one ``aminmax`` and a host read (a device sync), as the portable and
reference candidates do: an out-of-range id must raise ``KernelInputError``, which needs the host to see it.
The kernels also mask out-of-range ids (a zero row, no add), so nothing is read or written out of bounds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _validate as v
from ..backend import OpEntry
from ..context import LayoutContext
from ..main_grad import check_main_grad, main_grad_of
from ..row_tables import logical_rows
from . import triton_op
from ._launch import check_contiguous, check_device, launch
from ._memops import COMPILE, float_dtype

# columns per program: forward 4 KB bf16 row slices (4 warps x 32 threads x 16 values; 4096 spilled 28
# bytes in ptxas for sm_90a, the 64-bit address per value); backward 1024 fp32
# main_grad columns (4 KB) per run, so a frequent id's walk is spread over H/1024 programs (not tuned yet)
FWD_COLUMNS = 2048
BWD_COLUMNS = 1024


@triton.jit
def ws1_embedding_gather(IDS, W, Y, V, H, BLOCK: tl.constexpr):  # pragma: no cover (Triton)
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    idx = tl.load(IDS + t)
    if (idx >= 0) & (idx < V):
        tl.store(Y + t * H + c, tl.load(W + idx * H + c, mask=c < H), mask=c < H)
    else:  # never reached after validation; a zero row, nothing read out of bounds
        tl.store(Y + t * H + c, tl.zeros([BLOCK], Y.dtype.element_ty), mask=c < H)


@triton.jit
def ws1_embedding_wgrad_runs(
    SORTED_IDS, SORTED_ROWS, DY, MG, n, V, H, BLOCK: tl.constexpr
):  # pragma: no cover
    i = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cm = c < H
    idx = tl.load(SORTED_IDS + i)
    prev = tl.load(SORTED_IDS + i - 1, mask=i > 0, other=-1)
    if ((i == 0) | (idx != prev)) & (idx >= 0) & (idx < V):  # i opens a run of idx
        acc = tl.load(MG + idx * H + c, mask=cm, other=0.0)
        j = i
        nxt = idx
        while nxt == idx:
            r = tl.load(SORTED_ROWS + j)
            acc = acc + tl.load(DY + r * H + c, mask=cm, other=0.0).to(tl.float32)
            j += 1
            nxt = tl.load(SORTED_IDS + j, mask=j < n, other=-1)
        tl.store(MG + idx * H + c, acc, mask=cm)


def gather_launch(token_ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``weight[token_ids]`` on inputs the caller validated (the candidate and the step op launch here)."""
    t, (vocab, h) = token_ids.shape[0], weight.shape
    y = torch.empty((t, h), dtype=weight.dtype, device=weight.device)
    block = min(FWD_COLUMNS, triton.next_power_of_2(h))
    launch(
        ws1_embedding_gather,
        (t, triton.cdiv(h, block)),
        "fwd",
        token_ids,
        weight,
        y,
        vocab,
        h,
        BLOCK=block,
        num_warps=4,
        **COMPILE,
    )
    return y


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, token_ids, weight, lctx):  # type: ignore[override]
        y = gather_launch(token_ids, weight)
        ctx.save_for_backward(token_ids)
        ctx.weight, ctx.lctx = weight, lctx
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        if not ctx.needs_input_grad[1]:
            return None, None, None
        (token_ids,) = ctx.saved_tensors
        rows = logical_rows(ctx.lctx, dy.device)
        mg = main_grad_of(ctx.weight)
        if rows is not None:  # None: only pads in this call
            embedding_backward(token_ids, dy, rows, mg)
        return None, None, None


def embedding_backward(
    token_ids: torch.Tensor, dy: torch.Tensor, rows: torch.Tensor, mg: torch.Tensor
) -> None:
    """``mg[id] += dy[row]`` for the call's real ``rows`` (logical order): ids sorted stably, then one program
    per run of equal ids adds its rows in logical order. The candidate's backward and the compiled training
    op (``train_ops``) both run here."""
    dy = dy.contiguous()
    ids_sorted, perm = torch.sort(token_ids[rows], stable=True)
    rows_sorted = rows[perm]
    n, (vocab, h) = rows.shape[0], mg.shape
    block = min(BWD_COLUMNS, triton.next_power_of_2(h))
    launch(
        ws1_embedding_wgrad_runs,
        (n, triton.cdiv(h, block)),
        "bwd",
        ids_sorted,
        rows_sorted,
        dy,
        mg,
        n,
        vocab,
        h,
        BLOCK=block,
        num_warps=4,
        **COMPILE,
    )


def embedding(token_ids: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``weight[token_ids]``: ``[T] x [V,H] -> [T,H]``; ids outside ``[0, V)`` are refused."""
    where = "triton_cuda_bf16.embedding"
    v.tensor(where, "weight", weight, 2, None)
    float_dtype(where, weight=weight)
    if not isinstance(token_ids, torch.Tensor):
        raise v.KernelInputError(f"{where}: token_ids must be a torch.Tensor, got {type(token_ids).__name__}")
    check_device(where, token_ids, weight)
    check_contiguous(where, token_ids=token_ids, weight=weight)
    v.token_ids(where, "token_ids", token_ids, weight.shape[0])  # one aminmax + host read (see module doc)
    ctx.check_rows(where, token_ids.shape[0])
    check_main_grad(where, weight)
    return _Embedding.apply(token_ids, weight, ctx)


_KERNELS = frozenset({"ws1_embedding_gather", "ws1_embedding_wgrad_runs"})
# aminmax + _local_scalar_dense: the id-range check; empty: the output; zeros: main_grad created lazily;
# lift_fresh/_to_copy: the host-built logical row order (once per call and device); index/sort: gather the
# ids in logical order, stable sort, permute the rows; clone: contiguous() of a non-contiguous upstream grad
_DECLARED = frozenset(
    {
        "aten.aminmax",
        "aten._local_scalar_dense",
        "aten.empty",
        "aten.zeros",
        "aten.lift_fresh",
        "aten._to_copy",
        "aten.index",
        "aten.sort",
        "aten.clone",
    }
)
OPS: dict[str, OpEntry] = {"embedding": triton_op(embedding, _KERNELS, _DECLARED, "ws1_embedding_gather")}
