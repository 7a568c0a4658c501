"""Explicit fp32 summation orders, computed one correctly rounded add at a time (host-independent).

Why not the host's matmul or `torch.sum`: their order is the BLAS's or the vectoriser's, and it differs between
hosts (an AVX-512 path and an AVX2 path of one machine reduce K differently), so a test built on them proves
nothing about another host. Here every order is a sequence of elementwise fp32 adds over the rows of a
`[rows, n]` array of terms; an elementwise add is correctly rounded whatever the SIMD width, so each function
below gives the same bits on every host.

The orders are the ways kernels really reduce: one sequential walk (a GEMM's K loop with one accumulator), a
split into P equal parts added at the end (split-K, split-KV), blocks of a fixed size added into the
accumulator (a K-blocked loop or an MMA chunk chain), the blocks walked backwards (a reordered or rotated walk),
and a pairwise tree (a `tl.sum`, a warp shuffle reduction).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Order = Callable[[np.ndarray], np.ndarray]


def _as_terms(terms: np.ndarray) -> np.ndarray:
    if terms.dtype != np.float32 or terms.ndim != 2:
        raise ValueError(f"terms must be a [rows, n] float32 array, got {terms.dtype} {terms.shape}")
    return terms


def sequential(terms: np.ndarray) -> np.ndarray:
    """((t0 + t1) + t2) + ...: one accumulator walking the axis in ascending order."""
    terms = _as_terms(terms)
    acc = np.zeros(terms.shape[0], dtype=np.float32)
    for k in range(terms.shape[1]):
        acc = acc + terms[:, k]
    return acc


def split(parts: int) -> Order:
    """The axis cut into `parts` near-equal contiguous parts, each walked sequentially, partials added in order."""

    def order(terms: np.ndarray) -> np.ndarray:
        terms = _as_terms(terms)
        n = terms.shape[1]
        bounds = [round(i * n / parts) for i in range(parts + 1)]
        acc = np.zeros(terms.shape[0], dtype=np.float32)
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            acc = acc + sequential(terms[:, lo:hi])
        return acc

    order.__name__ = f"split{parts}"
    return order


def blocked(block: int, *, reverse: bool = False) -> Order:
    """Blocks of `block` terms, each summed from zero, added into one accumulator (backwards if `reverse`)."""

    def order(terms: np.ndarray) -> np.ndarray:
        terms = _as_terms(terms)
        starts = list(range(0, terms.shape[1], block))
        acc = np.zeros(terms.shape[0], dtype=np.float32)
        for lo in reversed(starts) if reverse else starts:
            acc = acc + sequential(terms[:, lo : lo + block])
        return acc

    order.__name__ = f"blocked{block}{'_reversed' if reverse else ''}"
    return order


def pairwise(terms: np.ndarray) -> np.ndarray:
    """A balanced binary tree over the zero-filled power-of-two length (halves added elementwise)."""
    terms = _as_terms(terms)
    n = terms.shape[1]
    p = 1 << max(0, (n - 1).bit_length())
    x = np.concatenate([terms, np.zeros((terms.shape[0], p - n), dtype=np.float32)], axis=1)
    while x.shape[1] > 1:
        half = x.shape[1] // 2
        x = x[:, :half] + x[:, half:]
    return x[:, 0]


#: Every order the probes must tell from the sequential walk.
ALTERNATIVES: tuple[Order, ...] = (
    split(2),
    split(3),
    split(4),
    blocked(16, reverse=True),
    blocked(64, reverse=True),
    pairwise,
)


def bits(values: np.ndarray) -> np.ndarray:
    """The raw fp32 bits (so +0 and -0 differ and NaNs compare by payload)."""
    return np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
