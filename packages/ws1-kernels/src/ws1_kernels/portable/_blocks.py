"""Fixed-shape building blocks of the portable_cpu profile.

Why fixed shapes: a CPU BLAS (MKL here) picks its code path and reduction order from the call's shape, so a row
alone (M=1, a GEMV) and the same row inside a batch (a GEMM) get different bits.  Every ``torch.mm`` here has
``ROW_BLOCK`` rows (zero-filled at the end), so each output row sees the same call whatever T is; measured
on this machine: a row's bits inside a fixed-shape ``mm``/``bmm`` do not depend on its index in the block or on
the other rows (tests/ws1_kernels/test_invariance.py checks it on every run).

Reductions over a row never go through torch's reduction kernels (their split depends on the number of
outputs): ``tree_sum`` adds halves elementwise, and each elementwise add is correctly rounded whatever the
vectorisation, so a row's sum depends only on its own values and the reduced length.

Why 48 rows: the block must be a whole number of the BLAS micro-kernel's row panels on every code path, or
the rows past the last full panel go through an edge kernel with its own order of additions, and a row's bits
then depend on where in the block the layout put it.  Measured with torch 2.13 and MKL on one Intel host: with
``MKL_ENABLE_INSTRUCTIONS=AVX2`` (the path AMD hosts take too) a 32-row block gave rows 30 and 31 other bits than
rows 0-29 (6-row panels, 32 = 5x6 + 2), while 24 and 48 rows were clean on the SSE, AVX2 and AVX-512 paths.
48 is a multiple of 6, 8, 12, 16 and 24.  ``tests/ws1_kernels/test_row_block_position.py`` checks the property
on every forced CPU path in CI, so a BLAS with other panels is caught rather than trusted.

Speed (fp32 [RB,4096]x[4096,4096], ms per 64 rows, 2 threads, AVX-512 path): RB=24 17.0, 32 13.8, 48 12.8,
64 11.1.  Zero-filling wastes up to RB-1 rows per call (the decode layout calls with one token per sample).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator

import torch

from ..context import Segment
from ..main_grad import WGRAD_BLOCK

ROW_BLOCK = 48  # rows per GEMM call (forward and dx); a multiple of every micro-kernel panel height seen
KEY_BLOCK = 64  # attention keys per block, aligned to logical key position 0
QUERY_BLOCK = 32  # attention queries per block, aligned to logical position 0
VOCAB_BLOCK = 8192  # vocab columns per block (lm_head weight chunk, logp/linear_logp online logsumexp)
WGRAD_COL_BLOCK = 512  # weight-gradient rows updated together (keeps the main_grad chunk in cache)


def pad_rows(x: torch.Tensor, block: int = ROW_BLOCK) -> torch.Tensor:
    """A fresh contiguous fp32 copy of ``x`` with rows zero-filled up to a multiple of ``block``."""
    t = x.shape[0]
    tp = -(-t // block) * block
    out = torch.zeros((tp, *x.shape[1:]), dtype=torch.float32, device=x.device)
    out[:t] = x
    return out


def row_blocks(rows: int, block: int = ROW_BLOCK) -> Iterator[int]:
    """Start row of every block of a zero-filled buffer of ``rows`` rows."""
    return iter(range(0, rows, block))


def blocked_mm(a_pad: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a_pad @ b`` with one fixed-shape ``mm`` per ROW_BLOCK rows (``a_pad`` from ``pad_rows``)."""
    if out is None:
        out = torch.empty((a_pad.shape[0], b.shape[1]), dtype=torch.float32, device=a_pad.device)
    for i in row_blocks(a_pad.shape[0]):
        torch.mm(a_pad[i : i + ROW_BLOCK], b, out=out[i : i + ROW_BLOCK])
    return out


def tree_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over ``dim`` by pairwise elementwise adds on a zero-filled power-of-two length (order fixed by length)."""
    dim = dim % x.dim()
    n = x.shape[dim]
    p = 1 << max(0, (n - 1).bit_length())
    if p != n:
        shape = list(x.shape)
        shape[dim] = p - n
        x = torch.cat([x, x.new_zeros(shape)], dim=dim)
    while p > 1:
        p //= 2
        x = x.narrow(dim, 0, p) + x.narrow(dim, p, p)
    return x.squeeze(dim)


def wgrad_index(segments: tuple[Segment, ...], zero_row: int, block: int = WGRAD_BLOCK) -> torch.Tensor:
    """Row index [nblocks, block] of the parameter-gradient blocks of a call.

    Samples in ascending id, each sample's rows in blocks of ``block`` positions aligned to position 0
    (``pos // block``), missing slots point at ``zero_row`` (a zero row the caller appends); pads are skipped.
    """
    rows: list[list[int]] = []
    for seg in sorted(segments, key=lambda s: s.sample_id):
        first = seg.first_position
        last = first + seg.length - 1
        for b in range(first // block, last // block + 1):
            slot = [zero_row] * block
            for p in range(max(first, b * block), min(last, (b + 1) * block - 1) + 1):
                slot[p - b * block] = seg.start + (p - first)
            rows.append(slot)
    if not rows:
        return torch.empty((0, block), dtype=torch.int64)
    return torch.tensor(rows, dtype=torch.int64)


def gather_blocks(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """fp32 ``[nblocks, block, *row]`` gathered through ``wgrad_index`` (the zero row appended here)."""
    xf = torch.cat([x.float(), x.new_zeros((1, *x.shape[1:]), dtype=torch.float32)], dim=0)
    return xf[index.to(x.device)]


# One fp32 copy of the last large weight seen, valid while that weight holds the same bits: decode and
# micro-batch layouts call lm_head many times with one weight, and converting [151936, 4096] bf16 to fp32
# cost ~1.1 s per call on two cores. The copy holds the same values as `weight[c0:c1].float()`, so the bits of
# every result are unchanged. A hit needs the same tensor (a weak reference, never a reused address), storage
# pointer, shape, stride and version counter, and the same content: a bf16 snapshot kept beside the copy is
# compared bit for bit with the weight, because a write through `.data` (a trainer syncing weights) bumps no
# version counter. Measured at [151936, 4096]: the comparison takes 0.16 s against 1.1 s for the conversion;
# the snapshot costs one more bf16 copy of the weight in memory.
# Bound and release: one slot, so at most one weight's fp32 copy and snapshot are held at a time (about 3.7 GB for
# the full-vocabulary lm_head); converting another weight frees the old pair first, the weight's death frees it,
# and `clear_fp32_cache()` frees it at once (a caller done with a model, or a test, calls it).
_FP32_CACHE: dict[
    str, tuple[object, tuple[int, tuple[int, ...], tuple[int, ...], int], torch.Tensor, torch.Tensor]
] = {}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(width), b.view(width))


def fp32_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight.float()``, cached while ``weight`` lives and holds the same bits. Call it once per call."""
    if weight.dtype == torch.float32:
        return weight
    key = (weight.data_ptr(), tuple(weight.shape), tuple(weight.stride()), weight._version)
    entry = _FP32_CACHE.get("weight")
    if entry is not None:
        ref, cached_key, snapshot, copy = entry
        if ref() is not None and cached_key == key and _same_bits(snapshot, weight.detach()):  # type: ignore[operator]
            return copy
    _FP32_CACHE.pop("weight", None)  # free the old copy before making the new one
    snapshot = weight.detach().clone()
    copy = snapshot.float()
    _FP32_CACHE["weight"] = (weakref.ref(weight, _drop_cache_entry), key, snapshot, copy)
    return copy


def _drop_cache_entry(ref: object) -> None:
    entry = _FP32_CACHE.get("weight")
    if entry is not None and entry[0] is ref:
        _FP32_CACHE.pop("weight", None)


def fp32_cache_bytes() -> int:
    """Bytes the fp32 weight cache holds now (the fp32 copy and its snapshot; 0 when empty)."""
    entry = _FP32_CACHE.get("weight")
    if entry is None:
        return 0
    _ref, _key, snapshot, copy = entry
    return snapshot.numel() * snapshot.element_size() + copy.numel() * copy.element_size()


def clear_fp32_cache() -> int:
    """Release the cached fp32 weight copy now; returns the bytes released. Results are unchanged: the next call
    converts again."""
    held = fp32_cache_bytes()
    _FP32_CACHE.pop("weight", None)
    return held
