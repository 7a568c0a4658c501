"""portable_cpu's GEMMs rest on one property of the host's BLAS: inside a ``ROW_BLOCK``-row ``mm`` (forward) or
``addmm_`` (dx), a row's bits do not depend on its index in the block.  A layout change moves a token to another
index, so if the BLAS computed some indices with another order of additions (an edge kernel for the rows past
the last full micro-kernel panel), the profile would stop being batch-invariant on that host.

CI runs this file on every forced CPU path (noxfile ``PLANTED_FAULT_TESTS``), so the property is checked on the
SSE, AVX2 and AVX-512 code paths rather than trusted; the control plants an edge kernel and must be caught.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from ws1_kernels.portable import ROW_BLOCK

MM = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# (K, N): tiny widths, the full-width hidden and MLP contractions, and an lm_head vocab chunk
SHAPES = ((64, 96), (192, 1500), (4096, 4096), (12288, 512), (4096, 8192))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _moved_rows(mm: MM, k: int, n: int, seed: int) -> list[tuple[int, int]]:
    """(shift, row) for every row whose bits change when the block's rows are rotated by ``shift``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(ROW_BLOCK, k, generator=g).bfloat16().float()
    w = torch.randn(k, n, generator=g).bfloat16().float()
    ref = _bits(mm(x, w))
    moved: list[tuple[int, int]] = []
    for shift in range(1, ROW_BLOCK):
        out = torch.roll(mm(torch.roll(x, shift, 0), w), -shift, 0)
        rows = (_bits(out) != ref).any(dim=1).nonzero().flatten().tolist()
        moved += [(shift, r) for r in rows]
    return moved


def _forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.mm(x, w)


def _dx(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The dx step: an fp32 accumulator that already holds an earlier vocab chunk's sum, plus one ``addmm_``."""
    acc = torch.full((x.shape[0], w.shape[1]), 0.375, dtype=torch.float32)
    return acc.addmm_(x, w)


def _planted_edge_kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A BLAS whose last two rows of the block come out one ulp higher, as an edge kernel's other order could."""
    out = torch.mm(x, w)
    out[-2:] = torch.nextafter(out[-2:], torch.full_like(out[-2:], float("inf")))
    return out


@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("mm", [_forward, _dx], ids=["forward_mm", "dx_addmm"])
def test_row_bits_do_not_depend_on_index_in_block(mm: MM, k: int, n: int) -> None:
    moved = _moved_rows(mm, k, n, seed=k + n)
    assert not moved, (
        f"{mm.__name__} [{ROW_BLOCK},{k}]x[{k},{n}] on the {torch.backends.cpu.get_cpu_capability()} path: "
        f"a row's bits depend on its index in the block at (shift, row) {moved[:6]}; ROW_BLOCK must be a whole "
        "number of this BLAS's micro-kernel panels"
    )


def test_planted_edge_kernel_is_caught() -> None:
    """Control: rows computed differently at the end of the block are found, on any host."""
    moved = _moved_rows(_planted_edge_kernel, 64, 96, seed=0)
    assert (1, ROW_BLOCK - 3) in moved and (1, ROW_BLOCK - 1) in moved
