"""logp and linear_logp in Triton: selected-token log-probability, vocab walked in fixed blocks.

Why a row's bits do not depend on the batch:

- ``logp``: one program per row reads its bf16 logits once, in ``BLOCK_V`` columns at a time in ascending order,
  keeping an fp32 online log-sum-exp ``(m, s)``.  Each block's max and sum are ``tl.max``/``tl.sum`` over a
  tile of fixed shape, so their order is fixed by ``BLOCK_V`` and ``num_warps``: the other rows, T and the grid
  never enter a row's arithmetic.  Backward is elementwise given the saved per-row logsumexp.
- ``linear_logp``: logits are never held.  A program owns ``BM`` rows (zero-filled past T) and one fixed vocab
  chunk of ``VCHUNK`` columns; it walks the chunk in ``BV`` column tiles, each tile's logits one fp32 dot over H
  in ascending ``BK`` steps, and folds them into a per-row online LSE.  A second kernel combines the per-chunk
  ``(m, s)`` of a row in ascending chunk order.  The vocab split is a fixed chunk SIZE (never a fixed number
  of splits), so every row's reduction tree depends on V only; splitting the vocab over programs is what keeps
  the GPU full (T/BM row blocks alone are 32 programs at T=4096 for 132 SMs).
- linear_logp backward walks the vocab in fixed ``bwd_chunk`` columns: recompute the chunk's logits with the
  forward's own tile function and tile shape (same columns at the same tile positions, so the same bits),
  ``dlogits = g*(onehot - exp(logit - lse))`` rounded once to the input dtype (bf16, as an unfused
  lm_head+logp backward would hand to its GEMMs) plus, for the weight gradient, its rounding residual in a
  second bf16 buffer, then ``dx += dlogits @ W_chunk`` into one fp32 accumulator
  per dx element carried across chunks in ascending order (one long K chain spilled to memory between
  chunks), and ``weight.main_grad[chunk] += dlogits_b^T @ x_b`` per 16-token block under
  ``sample_blocks_main_grad``, each block's product taken twice on one accumulator chain (high part, then
  residual: bf16 dlogits alone lost up to 0.02 of d_weight at the tiny widths, over the contract's gradient
  atol).  Extra memory: two ``[T, bwd_chunk]`` bf16 dlogits buffers and one fp32 ``[T, H]``.

Declared design choice: the fused forward does NOT give the bits of ``logp(lm_head(x))``: its logits stay fp32
and are never rounded to bf16, so it is closer to the fp32 reference than the unfused bf16 path.

Public operators take bf16 only.  ``logp_apply``/``linear_logp_apply`` also take fp32 (``allow_fp32``), for the
interpreter tests, and small test-only tile tables.  ``logp_forward``/``linear_logp_forward`` are plain forward
calls for benchmarks (no autograd, no ctx, no target range check: an out-of-range target gives NaN, and the
kernels never read outside the tensors).

Known host sync: the target range check (``_validate.token_ids``: one ``aminmax`` read back to the host).  The
kernels mask the target read anyway, so dropping the check could never read out of range, but the contract
wants a bad target refused with an error at the call, which needs the host to see the values.  The check runs
right after the forward launches (a bad call raises and its output is dropped): the host then waits while the
kernel runs, where a check before the launch left the GPU idle for the read-back and the launch (0.077 ms of
the 0.43 ms of a validated 4096 x 151936 logp on the H200, whose kernel takes 0.355 ms).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import _validate as v
from ..backend import OpEntry
from ..context import LayoutContext, Segment
from ..errors import KernelInputError
from ..main_grad import WGRAD_BLOCK, check_main_grad, main_grad_of
from . import triton_op
from ._launch import check_contiguous, check_device, launch

__all__ = [
    "LINEAR_TILES",
    "LOGP_TILES",
    "OPS",
    "LinearLogpTiles",
    "LogpTiles",
    "linear_logp",
    "linear_logp_apply",
    "linear_logp_forward",
    "logp",
    "logp_apply",
    "logp_forward",
    "wgrad_rows",
]


# --------------------------------------------------------------------------------------------------------------
# Kernels: logp
# --------------------------------------------------------------------------------------------------------------


@triton.jit
def ws1_logp_fwd(logits_ptr, tgt_ptr, out_ptr, lse_ptr, T, V, ROWS: tl.constexpr, BLOCK_V: tl.constexpr):
    """``ROWS`` rows (1 on the GPU): online LSE over ``BLOCK_V`` columns in ascending order; each row reduced
    on its own along the tile's columns.  ``out = logit[target] - lse``."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < T
    # rows past T (ROWS > 1 only) re-read row 0: valid memory, finite values, never stored
    base = logits_ptr + tl.where(rmask, rows, 0).to(tl.int64)[:, None] * V
    offs = tl.arange(0, BLOCK_V)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    s = tl.zeros([ROWS], tl.float32)
    for c0 in range(0, V, BLOCK_V):
        cols = c0 + offs
        x = tl.load(base + cols[None, :], mask=(cols < V)[None, :], other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=1))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        m = m_new
    lse = m + tl.log(s)
    tgt = tl.load(tgt_ptr + rows, mask=rmask, other=-1)
    ok = rmask & (tgt >= 0) & (tgt < V)  # never read outside the row, even unvalidated (benchmark entry)
    picked = tl.load(logits_ptr + rows.to(tl.int64) * V + tl.where(ok, tgt, 0), mask=ok, other=float("nan"))
    tl.store(out_ptr + rows, picked.to(tl.float32) - lse, mask=rmask)
    tl.store(lse_ptr + rows, lse, mask=rmask)


@triton.jit
def ws1_logp_bwd(
    logits_ptr, tgt_ptr, lse_ptr, g_ptr, g_stride, dl_ptr, T, V, ROWS: tl.constexpr, BLOCK_V: tl.constexpr
):
    """``dlogits[rows, block] = g * (onehot(target) - exp(logit - lse))``, rounded once to the logits dtype."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < T
    mask = rmask[:, None] & (cols < V)[None, :]
    offs = rows.to(tl.int64)[:, None] * V + cols[None, :]
    x = tl.load(logits_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    lse = tl.load(lse_ptr + rows, mask=rmask, other=0.0)
    g = tl.load(g_ptr + rows.to(tl.int64) * g_stride, mask=rmask, other=0.0).to(tl.float32)
    tgt = tl.load(tgt_ptr + rows, mask=rmask, other=-1)
    onehot = tl.where(cols[None, :] == tgt[:, None], 1.0, 0.0)
    d = g[:, None] * (onehot - tl.exp(x - lse[:, None]))
    tl.store(dl_ptr + offs, d.to(dl_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------------------------
# Kernels: linear_logp
# --------------------------------------------------------------------------------------------------------------


@triton.jit
def _logits_tile(
    x_ptr,
    w_ptr,
    rows,
    cols,
    T,
    V,
    H,
    BM: tl.constexpr,
    BV: tl.constexpr,
    BK: tl.constexpr,
    EVEN_K: tl.constexpr,
    IEEE: tl.constexpr,
):
    """fp32 ``x[rows] @ W[cols]^T``: H walked in ascending ``BK`` steps into one accumulator.

    Rows past T and columns past V load zeros (their values are masked by the callers).  Forward and backward
    both call this with the same tile shape and the same ``BV``-aligned columns, so they get the same bits.
    """
    rmask = rows < T
    cmask = cols < V
    offs_k = tl.arange(0, BK)
    a_ptrs = x_ptr + rows.to(tl.int64)[:, None] * H + offs_k[None, :]
    b_ptrs = w_ptr + cols.to(tl.int64)[None, :] * H + offs_k[:, None]
    acc = tl.zeros((BM, BV), dtype=tl.float32)
    for k in range(0, H, BK):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=rmask[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=cmask[None, :], other=0.0)
        else:
            kmask = (k + offs_k) < H
            a = tl.load(a_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=cmask[None, :] & kmask[:, None], other=0.0)
        if IEEE:  # noqa: SIM108 (constexpr branch: only one side is compiled)
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BK
        b_ptrs += BK
    return acc


@triton.jit
def ws1_linear_logp_fwd(
    x_ptr,
    w_ptr,
    tgt_ptr,
    part_m_ptr,
    part_s_ptr,
    picked_ptr,
    T,
    V,
    H,
    BM: tl.constexpr,
    BV: tl.constexpr,
    BK: tl.constexpr,
    VCHUNK: tl.constexpr,
    EVEN_K: tl.constexpr,
    IEEE: tl.constexpr,
):
    """Rows ``[pid_m*BM, +BM)`` x vocab chunk ``pid_c``: the chunk's online ``(m, s)`` per row, and the target
    logit for the rows whose target lies in the chunk (one writer per row: the chunk holding its target)."""
    pid_m = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    rmask = rows < T
    tgt = tl.load(tgt_ptr + rows, mask=rmask, other=-1)
    c0 = pid_c * VCHUNK
    c1 = tl.minimum(c0 + VCHUNK, V)
    m = tl.full([BM], float("-inf"), tl.float32)
    s = tl.zeros([BM], tl.float32)
    pick = tl.zeros([BM], tl.float32)
    for cb in range(c0, c1, BV):
        cols = cb + tl.arange(0, BV)
        logit = _logits_tile(x_ptr, w_ptr, rows, cols, T, V, H, BM, BV, BK, EVEN_K, IEEE)
        logit = tl.where((cols < V)[None, :], logit, float("-inf"))
        m_new = tl.maximum(m, tl.max(logit, axis=1))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(logit - m_new[:, None]), axis=1)
        m = m_new
        # exact: the target's logit plus zeros
        pick += tl.sum(tl.where(cols[None, :] == tgt[:, None], logit, 0.0), axis=1)
    off = pid_c.to(tl.int64) * T + rows
    tl.store(part_m_ptr + off, m, mask=rmask)
    tl.store(part_s_ptr + off, s, mask=rmask)
    tl.store(picked_ptr + rows, pick, mask=rmask & (tgt >= c0) & (tgt < c1))


@triton.jit
def ws1_linear_logp_combine(
    part_m_ptr, part_s_ptr, picked_ptr, tgt_ptr, out_ptr, lse_ptr, T, V, NCHUNK, BR: tl.constexpr
):
    """Per row: fold the chunks' ``(m, s)`` in ascending chunk order; ``out = picked - lse``."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    rmask = rows < T
    m = tl.full([BR], float("-inf"), tl.float32)
    s = tl.zeros([BR], tl.float32)
    for c in range(0, NCHUNK):
        off = c * T + rows.to(tl.int64)
        mc = tl.load(part_m_ptr + off, mask=rmask, other=0.0)
        sc = tl.load(part_s_ptr + off, mask=rmask, other=1.0)  # masked rows: lse = 0, not log(0)
        m_new = tl.maximum(m, mc)
        s = s * tl.exp(m - m_new) + sc * tl.exp(mc - m_new)
        m = m_new
    lse = m + tl.log(s)
    tgt = tl.load(tgt_ptr + rows, mask=rmask, other=0)
    ok = rmask & (tgt >= 0) & (tgt < V)  # an out-of-range target was never picked: NaN, not garbage
    picked = tl.load(picked_ptr + rows, mask=ok, other=float("nan"))
    tl.store(out_ptr + rows, picked - lse, mask=rmask)
    tl.store(lse_ptr + rows, lse, mask=rmask)


@triton.jit
def ws1_linear_logp_dlogits(
    x_ptr,
    w_ptr,
    tgt_ptr,
    lse_ptr,
    g_ptr,
    g_stride,
    dl_ptr,
    dl_lo_ptr,
    T,
    V,
    H,
    c0,
    LDC,
    BM: tl.constexpr,
    BV: tl.constexpr,
    BK: tl.constexpr,
    EVEN_K: tl.constexpr,
    IEEE: tl.constexpr,
    STORE_LO: tl.constexpr,
):
    """One ``[BM, BV]`` tile of the chunk's dlogits (``dl[T, LDC]``, columns relative to ``c0``).

    ``STORE_LO``: also store the rounding residual ``d - dl`` in the same dtype (``dl_lo``), so the weight
    gradient sees ``dl + dl_lo``: about 16 significant bits where bf16 alone keeps 8.  A bf16 ``dl`` alone put
    the tiny-width ``d_weight`` over the contract's gradient tolerance (docs/triton/logprob.md)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    lcols = tl.program_id(1) * BV + tl.arange(0, BV)
    cols = c0 + lcols
    rmask = rows < T
    logit = _logits_tile(x_ptr, w_ptr, rows, cols, T, V, H, BM, BV, BK, EVEN_K, IEEE)
    lse = tl.load(lse_ptr + rows, mask=rmask, other=0.0)
    g = tl.load(g_ptr + rows.to(tl.int64) * g_stride, mask=rmask, other=0.0).to(tl.float32)
    tgt = tl.load(tgt_ptr + rows, mask=rmask, other=-1)
    onehot = tl.where(cols[None, :] == tgt[:, None], 1.0, 0.0)
    d = g[:, None] * (onehot - tl.exp(logit - lse[:, None]))
    offs = rows.to(tl.int64)[:, None] * LDC + lcols[None, :]
    smask = rmask[:, None] & (cols < V)[None, :]
    hi = d.to(dl_ptr.dtype.element_ty)
    tl.store(dl_ptr + offs, hi, mask=smask)
    if STORE_LO:
        tl.store(dl_lo_ptr + offs, (d - hi.to(tl.float32)).to(dl_lo_ptr.dtype.element_ty), mask=smask)


@triton.jit
def ws1_linear_logp_dx(
    dl_ptr,
    w_ptr,
    acc_ptr,
    dx_ptr,
    T,
    H,
    c0,
    CW,
    LDC,
    BM: tl.constexpr,
    BH: tl.constexpr,
    BKV: tl.constexpr,
    FIRST: tl.constexpr,
    LAST: tl.constexpr,
    IEEE: tl.constexpr,
):
    """``dx[rows, hcols] (+)= dl[rows, :CW] @ W[c0:c0+CW, hcols]``, the chunk's columns in ascending ``BKV``
    steps into the fp32 accumulator carried from the previous chunk (``FIRST``: from zero; ``LAST``: round
    once to dx's dtype)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    hcols = tl.program_id(1) * BH + tl.arange(0, BH)
    rmask = rows < T
    hmask = hcols < H
    tile = rows.to(tl.int64)[:, None] * H + hcols[None, :]
    tmask = rmask[:, None] & hmask[None, :]
    if FIRST:  # noqa: SIM108 (constexpr branch)
        acc = tl.zeros((BM, BH), dtype=tl.float32)
    else:
        acc = tl.load(acc_ptr + tile, mask=tmask, other=0.0)
    offs_k = tl.arange(0, BKV)
    a_ptrs = dl_ptr + rows.to(tl.int64)[:, None] * LDC + offs_k[None, :]
    b_ptrs = w_ptr + (c0 + offs_k).to(tl.int64)[:, None] * H + hcols[None, :]
    for k in range(0, CW, BKV):
        kmask = (k + offs_k) < CW
        a = tl.load(a_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=kmask[:, None] & hmask[None, :], other=0.0)
        if IEEE:  # noqa: SIM108 (constexpr branch: only one side is compiled)
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BKV
        b_ptrs += BKV * H
    if LAST:
        tl.store(dx_ptr + tile, acc.to(dx_ptr.dtype.element_ty), mask=tmask)
    else:
        tl.store(acc_ptr + tile, acc, mask=tmask)


@triton.jit
def ws1_linear_logp_wgrad(
    dl_ptr,
    dl_lo_ptr,
    x_ptr,
    rows_ptr,
    mg_ptr,
    num_steps,
    c0,
    CW,
    LDC,
    H,
    BN: tl.constexpr,
    BH: tl.constexpr,
    ROWS_PER_STEP: tl.constexpr,
    BLOCK: tl.constexpr,
    IEEE: tl.constexpr,
):
    """``main_grad[c0+n, h] += dl_b^T @ x_b + dl_lo_b^T @ x_b`` for every 16-token block b of the call in rule
    order: the high part of block b, then its rounding residual (``dl_lo_ptr``), then block b+1.

    ``rows_ptr``: ``num_steps * ROWS_PER_STEP`` row indices (16 per block, -1 for an empty slot: zeros).  The
    accumulator starts from main_grad and goes back to it, so micro-batch calls chain exactly.  A step of
    several blocks is one ``tl.dot`` over ``K = 2 * ROWS_PER_STEP`` laid out ``hi_b0, lo_b0, hi_b1, lo_b1, ...``
    (16 each): the MMA walks K in ascending 16-wide instructions chained on the accumulator, i.e. the same as
    one block per step, whatever the step size (interpreter tests use one block per step with the raw numpy
    dot, which is not such a chain).  Two dots per step (all high parts, then all residuals) would make the
    order depend on the step grouping, and so on the layout: measured red on the H200.
    """
    vl = tl.program_id(0) * BN + tl.arange(0, BN)
    hcols = tl.program_id(1) * BH + tl.arange(0, BH)
    vmask = vl < CW
    hmask = hcols < H
    tmask = vmask[:, None] & hmask[None, :]
    mg_ptrs = mg_ptr + (c0 + vl).to(tl.int64)[:, None] * H + hcols[None, :]
    acc = tl.load(mg_ptrs, mask=tmask, other=0.0)
    offs_j = tl.arange(0, 2 * ROWS_PER_STEP)
    within = offs_j % (2 * BLOCK)
    slot = (offs_j // (2 * BLOCK)) * BLOCK + within % BLOCK  # the token row of K position j
    is_lo = within >= BLOCK  # the second 16 of each block's 32 K positions read the residual
    for st in range(0, num_steps):
        r = tl.load(rows_ptr + st * ROWS_PER_STEP + slot)
        valid = r >= 0
        r64 = tl.where(valid, r, 0).to(tl.int64)
        offs = r64[None, :] * LDC + vl[:, None]
        dlt = tl.load(
            tl.where(is_lo[None, :], dl_lo_ptr + offs, dl_ptr + offs),
            mask=valid[None, :] & vmask[:, None],
            other=0.0,
        )
        xb = tl.load(
            x_ptr + r64[:, None] * H + hcols[None, :], mask=valid[:, None] & hmask[None, :], other=0.0
        )
        if IEEE:  # noqa: SIM108 (constexpr branch: only one side is compiled)
            acc = tl.dot(dlt, xb, acc, input_precision="ieee")
        else:
            acc = tl.dot(dlt, xb, acc)
    tl.store(mg_ptrs, acc, mask=tmask)


LOGP_KERNELS = frozenset({"ws1_logp_fwd", "ws1_logp_bwd"})
LINEAR_LOGP_KERNELS = frozenset(
    {
        "ws1_linear_logp_fwd",
        "ws1_linear_logp_combine",
        "ws1_linear_logp_dlogits",
        "ws1_linear_logp_dx",
        "ws1_linear_logp_wgrad",
    }
)


# --------------------------------------------------------------------------------------------------------------
# Frozen tile tables (one entry each: nothing here depends on T, so there are no buckets)
# --------------------------------------------------------------------------------------------------------------


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True)
class LogpTiles:
    """``block_v``: vocab columns per step of the online LSE (part of the reduction order: frozen); ``rows``
    per program (1: one row per program; tests use more, the interpreter pays per program).

    4096 bf16 columns = 8 KiB per step, 16 per thread at 8 warps (two 16-byte loads in flight per thread and
    many rows resident per SM); 151936 columns take 38 steps, the last one 37% full.  Not tuned on a GPU yet.
    """

    block_v: int = 4096
    rows: int = 1
    num_warps: int = 8

    def __post_init__(self) -> None:
        if not _pow2(self.block_v) or not _pow2(self.rows):
            raise KernelInputError(f"LogpTiles: block_v and rows must be powers of two, got {self}")


@dataclass(frozen=True)
class LinearLogpTiles:
    """Tiles of linear_logp; ``bv``, ``vchunk``, ``bk`` and ``bwd_chunk`` fix reduction orders (frozen).

    - forward / dlogits tile 128x128, BK 64, 8 warps, 3 stages: the common Hopper bf16 GEMM tile (96 KiB of
      shared memory for the pipeline), and the SAME tile in both so the backward recomputes the forward's bits;
    - ``vchunk`` 1024 columns per forward program: 149 chunks of 151936, so even a T <= 128 call has 149
      programs for 132 SMs, and T=4096 has 4768; partial ``(m, s)`` cost 8 bytes per row and chunk;
    - ``bwd_chunk`` 8192 columns: the bf16 dlogits buffer is T x 16 KiB (64 MiB at T=4096, 1/40 of fp32 logits);
    - dx tile 128x128 over the chunk in 64-column steps; wgrad tile 128 vocab x 256 hidden, 4 blocks of 16
      tokens per dot step, each block's high part and residual (a K=128 MMA chain), 2 stages: chosen by
      ``ci/tune_linear_logp.py`` on the H200 among bit-identical tiles (backward at T=4096: 48.6 ms, against
      74.3 ms for 128x128, 2 blocks, 3 stages).
    """

    bm: int = 128
    bv: int = 128
    bk: int = 64
    vchunk: int = 1024
    fwd_warps: int = 8
    fwd_stages: int = 3
    combine_rows: int = 128
    bwd_chunk: int = 8192
    dx_bm: int = 128
    dx_bh: int = 128
    dx_bk: int = 64
    dx_warps: int = 8
    dx_stages: int = 3
    wg_bn: int = 128
    wg_bh: int = 256
    wg_blocks_per_step: int = 4
    wg_warps: int = 8
    wg_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("bm", "bv", "bk", "combine_rows", "dx_bm", "dx_bh", "dx_bk", "wg_bn", "wg_bh"):
            val = getattr(self, name)
            if not _pow2(val) or val < 16:
                raise KernelInputError(f"LinearLogpTiles: {name} must be a power of two >= 16, got {val}")
        if self.vchunk % self.bv or self.bwd_chunk % self.bv or self.bwd_chunk % self.dx_bk:
            raise KernelInputError("LinearLogpTiles: vchunk and bwd_chunk must be multiples of bv and dx_bk")
        if not _pow2(self.wg_blocks_per_step):
            raise KernelInputError("LinearLogpTiles: wg_blocks_per_step must be a power of two")


LOGP_TILES = LogpTiles()
LINEAR_TILES = LinearLogpTiles()


# --------------------------------------------------------------------------------------------------------------
# Launch wrappers (no validation beyond what the kernels need; callers validate)
# --------------------------------------------------------------------------------------------------------------


def _logp_fwd(logits: torch.Tensor, targets: torch.Tensor, tiles: LogpTiles, phase: str):
    t, vocab = logits.shape
    out = torch.empty((t,), dtype=torch.float32, device=logits.device)
    lse = torch.empty((t,), dtype=torch.float32, device=logits.device)
    launch(
        ws1_logp_fwd,
        (triton.cdiv(t, tiles.rows),),
        phase,
        logits,
        targets,
        out,
        lse,
        t,
        vocab,
        ROWS=tiles.rows,
        BLOCK_V=tiles.block_v,
        num_warps=tiles.num_warps,
    )
    return out, lse


def _linear_fwd(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, tiles: LinearLogpTiles, phase: str
):
    t, h = x.shape
    vocab = weight.shape[0]
    dev = x.device
    nchunk = triton.cdiv(vocab, tiles.vchunk)
    part_m = torch.empty((nchunk, t), dtype=torch.float32, device=dev)
    part_s = torch.empty((nchunk, t), dtype=torch.float32, device=dev)
    picked = torch.empty((t,), dtype=torch.float32, device=dev)
    ieee = x.dtype == torch.float32
    launch(
        ws1_linear_logp_fwd,
        (triton.cdiv(t, tiles.bm), nchunk),
        phase,
        x,
        weight,
        targets,
        part_m,
        part_s,
        picked,
        t,
        vocab,
        h,
        BM=tiles.bm,
        BV=tiles.bv,
        BK=tiles.bk,
        VCHUNK=tiles.vchunk,
        EVEN_K=h % tiles.bk == 0,
        IEEE=ieee,
        num_warps=tiles.fwd_warps,
        num_stages=tiles.fwd_stages,
    )
    out = torch.empty((t,), dtype=torch.float32, device=dev)
    lse = torch.empty((t,), dtype=torch.float32, device=dev)
    launch(
        ws1_linear_logp_combine,
        (triton.cdiv(t, tiles.combine_rows),),
        phase,
        part_m,
        part_s,
        picked,
        targets,
        out,
        lse,
        t,
        vocab,
        nchunk,
        BR=tiles.combine_rows,
    )
    return out, lse


def wgrad_rows(segments: tuple[Segment, ...], blocks_per_step: int) -> list[int]:
    """Row indices of a call's 16-token blocks in ``sample_blocks_main_grad`` order, flat, -1 for an empty slot.

    The rule of ``portable._blocks.wgrad_index``: samples in ascending id, each sample's rows in blocks of
    ``WGRAD_BLOCK`` positions aligned to position 0, pads skipped; then padded with empty blocks to whole steps
    of ``blocks_per_step`` blocks (an empty block adds exact zeros).
    """
    rows: list[int] = []
    for seg in sorted(segments, key=lambda s: s.sample_id):
        first = seg.first_position
        last = first + seg.length - 1
        for b in range(first // WGRAD_BLOCK, last // WGRAD_BLOCK + 1):
            slot = [-1] * WGRAD_BLOCK
            lo, hi = max(first, b * WGRAD_BLOCK), min(last, (b + 1) * WGRAD_BLOCK - 1)
            slot[lo - b * WGRAD_BLOCK : hi - b * WGRAD_BLOCK + 1] = range(
                seg.start + lo - first, seg.start + hi - first + 1
            )
            rows.extend(slot)
    rows.extend([-1] * (-len(rows) % (WGRAD_BLOCK * blocks_per_step)))
    return rows


def _linear_bwd(
    g: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    lctx: LayoutContext,
    tiles: LinearLogpTiles,
    need_x: bool,
    need_w: bool,
) -> torch.Tensor | None:
    t, h = x.shape
    vocab = weight.shape[0]
    dev = x.device
    ieee = x.dtype == torch.float32
    chunk = min(tiles.bwd_chunk, triton.cdiv(vocab, tiles.bv) * tiles.bv)
    nchunk = triton.cdiv(vocab, chunk)
    dl = torch.empty((t, chunk), dtype=x.dtype, device=dev)  # dlogits in x's dtype (dx and wgrad)
    # its rounding residual, for wgrad only (without wgrad the kernel never writes it: dl stands in)
    dl_lo = torch.empty((t, chunk), dtype=x.dtype, device=dev) if need_w else dl
    dx = acc = None
    if need_x:
        dx = torch.empty((t, h), dtype=x.dtype, device=dev)
        if nchunk > 1:
            acc = torch.empty((t, h), dtype=torch.float32, device=dev)
    rows = mg = None
    step = tiles.wg_blocks_per_step
    if need_w:
        rows = torch.tensor(wgrad_rows(lctx.segments, step), dtype=torch.int64).to(dev)
        mg = main_grad_of(weight)
    num_steps = 0 if rows is None else rows.numel() // (WGRAD_BLOCK * step)
    for ci in range(nchunk):
        c0 = ci * chunk
        cw = min(chunk, vocab - c0)
        launch(
            ws1_linear_logp_dlogits,
            (triton.cdiv(t, tiles.bm), triton.cdiv(cw, tiles.bv)),
            "bwd",
            x,
            weight,
            targets,
            lse,
            g,
            g.stride(0),
            dl,
            dl_lo,
            t,
            vocab,
            h,
            c0,
            chunk,
            BM=tiles.bm,
            BV=tiles.bv,
            BK=tiles.bk,
            EVEN_K=h % tiles.bk == 0,
            IEEE=ieee,
            STORE_LO=need_w,
            num_warps=tiles.fwd_warps,
            num_stages=tiles.fwd_stages,
        )
        if need_x:
            launch(
                ws1_linear_logp_dx,
                (triton.cdiv(t, tiles.dx_bm), triton.cdiv(h, tiles.dx_bh)),
                "bwd",
                dl,
                weight,
                acc if acc is not None else dx,
                dx,
                t,
                h,
                c0,
                cw,
                chunk,
                BM=tiles.dx_bm,
                BH=tiles.dx_bh,
                BKV=tiles.dx_bk,
                FIRST=ci == 0,
                LAST=ci == nchunk - 1,
                IEEE=ieee,
                num_warps=tiles.dx_warps,
                num_stages=tiles.dx_stages,
            )
        if need_w and num_steps:
            launch(
                ws1_linear_logp_wgrad,
                (triton.cdiv(cw, tiles.wg_bn), triton.cdiv(h, tiles.wg_bh)),
                "bwd",
                dl,
                dl_lo,
                x,
                rows,
                mg,
                num_steps,
                c0,
                cw,
                chunk,
                h,
                BN=tiles.wg_bn,
                BH=tiles.wg_bh,
                ROWS_PER_STEP=WGRAD_BLOCK * step,
                BLOCK=WGRAD_BLOCK,
                IEEE=ieee,
                num_warps=tiles.wg_warps,
                num_stages=tiles.wg_stages,
            )
    return dx


# --------------------------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------------------------


class _Logp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, tiles):  # type: ignore[override]
        out, lse = _logp_fwd(logits, targets, tiles, "fwd")
        ctx.save_for_backward(logits, targets, lse)
        ctx.tiles = tiles
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None, None, None
        logits, targets, lse = ctx.saved_tensors
        return logp_backward(logits, targets, lse, g, ctx.tiles), None, None


def logp_backward(
    logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, g: torch.Tensor, tiles: LogpTiles
) -> torch.Tensor:
    """d logits of ``g``-weighted selected logprobs: the candidate's backward and the compiled training op's."""
    t, vocab = logits.shape
    dl = torch.empty((t, vocab), dtype=logits.dtype, device=logits.device)
    launch(
        ws1_logp_bwd,
        (triton.cdiv(t, tiles.rows), triton.cdiv(vocab, tiles.block_v)),
        "bwd",
        logits,
        targets,
        lse,
        g,
        g.stride(0),
        dl,
        t,
        vocab,
        ROWS=tiles.rows,
        BLOCK_V=tiles.block_v,
        num_warps=tiles.num_warps,
    )
    return dl


class _LinearLogp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, lctx, tiles):  # type: ignore[override]
        out, lse = _linear_fwd(x, weight, targets, tiles, "fwd")
        ctx.save_for_backward(x, weight, targets, lse)
        ctx.lctx = lctx
        ctx.tiles = tiles
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (need_x or need_w):
            return None, None, None, None, None
        x, weight, targets, lse = ctx.saved_tensors
        dx = _linear_bwd(g, x, weight, targets, lse, ctx.lctx, ctx.tiles, need_x, need_w)
        return dx, None, None, None, None


# --------------------------------------------------------------------------------------------------------------
# Validation and entry points
# --------------------------------------------------------------------------------------------------------------


def _dtype_of(where: str, name: str, t: object, allow_fp32: bool) -> torch.dtype:
    """bf16, or fp32 when allowed (interpreter tests); anything else is refused."""
    v.tensor(where, name, t, 2, dtype=None)
    assert isinstance(t, torch.Tensor)
    allowed = (torch.bfloat16, torch.float32) if allow_fp32 else (torch.bfloat16,)
    if t.dtype not in allowed:
        raise KernelInputError(f"{where}: {name} must be {' or '.join(map(str, allowed))}, got {t.dtype}")
    return t.dtype


def _check_targets(where: str, targets: object, vocab: int, rows: int, *, check_range: bool) -> torch.Tensor:
    if not isinstance(targets, torch.Tensor) or targets.dim() != 1 or targets.dtype != torch.int64:
        got = (
            f"{targets.dtype} shape {tuple(targets.shape)}"
            if isinstance(targets, torch.Tensor)
            else type(targets)
        )
        raise KernelInputError(f"{where}: targets must be 1-D int64, got {got}")
    if targets.shape[0] != rows:
        raise KernelInputError(f"{where}: targets has {targets.shape[0]} rows but the input has {rows}")
    if check_range:
        v.token_ids(where, "targets", targets, vocab)  # one aminmax, read back to the host (known sync)
    return targets


def _check_logp(where: str, logits: object, targets: object, *, allow_fp32: bool, check_range: bool) -> None:
    _dtype_of(where, "logits", logits, allow_fp32)
    assert isinstance(logits, torch.Tensor)
    t, vocab = logits.shape
    if t == 0:
        raise KernelInputError(f"{where}: empty batch (0 rows)")
    if vocab == 0:
        raise KernelInputError(f"{where}: empty vocab")
    _check_targets(where, targets, vocab, t, check_range=False)
    assert isinstance(targets, torch.Tensor)
    check_device(where, logits, targets)
    check_contiguous(where, logits=logits, targets=targets)
    if check_range:  # last: the only check that reads device data (one sync)
        _check_targets(where, targets, vocab, t, check_range=True)


def _check_linear(
    where: str, x: object, weight: object, targets: object, *, allow_fp32: bool, check_range: bool
) -> None:
    dtype = _dtype_of(where, "x", x, allow_fp32)
    _dtype_of(where, "weight", weight, allow_fp32)
    assert isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)
    if weight.dtype != dtype:
        raise KernelInputError(f"{where}: weight is {weight.dtype} but x is {dtype}")
    v.dims(where, "weight", weight, (None, x.shape[1]))
    if x.shape[0] == 0:
        raise KernelInputError(f"{where}: empty batch (0 rows)")
    if 0 in weight.shape:
        raise KernelInputError(f"{where}: empty weight {tuple(weight.shape)}")
    _check_targets(where, targets, weight.shape[0], x.shape[0], check_range=False)
    assert isinstance(targets, torch.Tensor)
    check_device(where, x, weight, targets)
    check_contiguous(where, x=x, weight=weight, targets=targets)
    if check_range:  # last: the only check that reads device data (one sync)
        _check_targets(where, targets, weight.shape[0], x.shape[0], check_range=True)


def _check_ctx(where: str, ctx: object, rows: int) -> LayoutContext:
    if not isinstance(ctx, LayoutContext):
        raise KernelInputError(f"{where}: ctx must be a LayoutContext, got {type(ctx).__name__}")
    ctx.check_rows(where, rows)
    return ctx


def logp_apply(
    where: str,
    logits: torch.Tensor,
    targets: torch.Tensor,
    ctx: LayoutContext,
    *,
    allow_fp32: bool = False,
    tiles: LogpTiles | None = None,
) -> torch.Tensor:
    """Validated autograd entry of logp (fp32 too with ``allow_fp32``; ``tiles`` for tests only)."""
    if isinstance(logits, torch.Tensor) and logits.dim() == 2:
        _check_ctx(where, ctx, logits.shape[0])
    _check_logp(where, logits, targets, allow_fp32=allow_fp32, check_range=False)
    out = _Logp.apply(logits, targets, tiles or LOGP_TILES)
    # the range check reads the ids back to the host (one sync): after the launch, so the wait overlaps the
    # kernel instead of idling the GPU before it; the kernel never reads outside a row whatever the ids
    _check_targets(where, targets, logits.shape[1], logits.shape[0], check_range=True)
    return out


def linear_logp_apply(
    where: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ctx: LayoutContext,
    *,
    allow_fp32: bool = False,
    tiles: LinearLogpTiles | None = None,
) -> torch.Tensor:
    """Validated autograd entry of linear_logp (fp32 too with ``allow_fp32``; ``tiles`` for tests only)."""
    if isinstance(x, torch.Tensor) and x.dim() == 2:
        _check_ctx(where, ctx, x.shape[0])
    if isinstance(weight, torch.Tensor):
        check_main_grad(where, weight)  # host-only, before the target range check (the one sync)
    _check_linear(where, x, weight, targets, allow_fp32=allow_fp32, check_range=False)
    out = _LinearLogp.apply(x, weight, targets, ctx, tiles or LINEAR_TILES)
    # after the forward launches, as in logp_apply (the forward kernels mask every target read)
    _check_targets(where, targets, weight.shape[0], x.shape[0], check_range=True)
    return out


def logp(logits: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``log_softmax(logits)[t, targets[t]]``: bf16 ``[T,V]``, int64 ``[T]`` -> fp32 ``[T]``."""
    return logp_apply("triton_cuda_bf16.logp", logits, targets, ctx)


def linear_logp(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext
) -> torch.Tensor:
    """Fused ``logp(x @ W^T)`` that never holds ``[T,V]`` logits: bf16 ``[T,H], [V,H]``, int64 ``[T]`` -> fp32
    ``[T]``.  Logits stay fp32 (not rounded to bf16): not the bits of the unfused path, by design."""
    return linear_logp_apply("triton_cuda_bf16.linear_logp", x, weight, targets, ctx)


def logp_forward(
    logits: torch.Tensor, targets: torch.Tensor, *, tiles: LogpTiles | None = None
) -> torch.Tensor:
    """Benchmark entry: the logp forward kernel alone (no autograd, no ctx, no host sync; bf16 or fp32)."""
    _check_logp("triton.logp_forward", logits, targets, allow_fp32=True, check_range=False)
    return _logp_fwd(logits, targets, tiles or LOGP_TILES, "fwd")[0]


def linear_logp_forward(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, tiles: LinearLogpTiles | None = None
) -> torch.Tensor:
    """Benchmark entry: the fused linear_logp forward alone (no autograd, no ctx, no host sync)."""
    _check_linear("triton.linear_logp_forward", x, weight, targets, allow_fp32=True, check_range=False)
    return _linear_fwd(x, weight, targets, tiles or LINEAR_TILES, "fwd")[0]


# aten ops the entry points may dispatch around the launches: output/buffer allocation, the target range check
# (aminmax read back to the host), the wgrad rows table (built on the host, copied to the device), a main_grad
# created lazily
LOGP_DECLARED_OPS = frozenset({"aten.empty", "aten.aminmax", "aten._local_scalar_dense"})
LINEAR_LOGP_DECLARED_OPS = frozenset(
    {
        "aten.empty",
        "aten.aminmax",
        "aten._local_scalar_dense",
        "aten.lift_fresh",
        "aten._to_copy",
        "aten.zeros",
    }
)

OPS: dict[str, OpEntry] = {
    "logp": triton_op(logp, LOGP_KERNELS, LOGP_DECLARED_OPS, "ws1_logp_fwd"),
    "linear_logp": triton_op(
        linear_logp, LINEAR_LOGP_KERNELS, LINEAR_LOGP_DECLARED_OPS, "ws1_linear_logp_fwd"
    ),
}
