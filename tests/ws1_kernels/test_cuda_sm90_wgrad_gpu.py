"""The Hopper weight gradient (`torch.ops.ws1_sm90.wgrad`, csrc/sm90/wgrad_sm90.cu) on an sm_90 device.

What only the chip can show:
- it is right: main_grad + dY^T X over the table's blocks, against float64, with empty slots adding nothing, the
  starting main_grad kept (the control: an overwrite is refused), and with dY split as hi + lo;
- each element's chain is the rule's: a micro-batch split in ascending sample order, main_grad carried, gives the
  bits of one call, and so do permuted and padded physical rows (the control: the split in the other order gives
  other bits);
- it agrees with the generic kernel to the contract's kind of tolerance.
Which weights take it (their dims multiples of 128) is CPU-tested (tests/ws1_kernels/test_cuda_sm90_cpu.py).
"""

from __future__ import annotations

import pytest
import torch
from cuda_only import skip_module_without_hopper

from ws1_kernels import LayoutContext
from ws1_kernels.row_tables import block_table

pytestmark = [pytest.mark.gpu, pytest.mark.needs_build, pytest.mark.sm90]

skip_module_without_hopper()

DEV = "cuda"
LENGTHS = (5, 17, 33, 16, 1, 40)  # blocks with empty slots, a sample of exactly one block, a one-row sample


def _ctx(lengths: tuple[int, ...], order: list[int] | None = None) -> LayoutContext:
    """Samples of `lengths` packed in `order` (physical order of the sample ids; ascending when None)."""
    order = list(range(len(lengths))) if order is None else order
    ids = torch.cat([torch.full((lengths[s],), s, dtype=torch.int64) for s in order])
    pos = torch.cat([torch.arange(lengths[s], dtype=torch.int64) for s in order])
    return LayoutContext(ids, pos)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _data(n: int, k: int, rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=DEV).manual_seed(seed)
    dy = torch.randn(rows, n, device=DEV, generator=g).to(torch.bfloat16)
    x = torch.randn(rows, k, device=DEV, generator=g).to(torch.bfloat16)
    start = torch.randn(n, k, device=DEV, generator=g)
    return dy, x, start


def _run(
    dy: torch.Tensor,
    x: torch.Tensor,
    ctx: LayoutContext,
    mg: torch.Tensor,
    lo: torch.Tensor | None = None,
    consumers: int = 1,
    stage_rows: int = 64,
) -> None:
    table = block_table(ctx, x.shape[0], x.device)
    torch.ops.ws1_sm90.wgrad(dy, x, table.rows, table.n_blocks, mg, lo, consumers, stage_rows)


@pytest.mark.parametrize(("n", "k"), [(128, 128), (256, 384), (4096, 1024)])
def test_it_adds_the_blocks_into_main_grad(n: int, k: int) -> None:
    ctx = _ctx(LENGTHS)
    dy, x, start = _data(n, k, sum(LENGTHS), seed=n + k)
    mg = start.clone()
    _run(dy, x, ctx, mg)
    ref = start.double() + dy.double().t() @ x.double()

    def close(got: torch.Tensor) -> bool:
        return bool(((got.double() - ref).abs() <= 1e-3 * ref.abs().max()).all())

    assert close(mg)
    assert not close(dy.double().t() @ x.double())  # the control: an overwrite, not an accumulation


def test_the_split_dy_adds_both_halves() -> None:
    ctx = _ctx(LENGTHS)
    hi, x, start = _data(256, 128, sum(LENGTHS), seed=7)
    lo = (hi.float() * 2.0**-9).to(torch.bfloat16)
    mg = start.clone()
    _run(hi, x, ctx, mg, lo)
    ref = start.double() + (hi.double() + lo.double()).t() @ x.double()
    hi_only = start.double() + hi.double().t() @ x.double()
    err = (mg.double() - ref).abs().max()
    assert err <= 1e-4 * ref.abs().max()
    assert (hi_only - ref).abs().max() > 10 * err  # the control: dropping lo is seen


def test_a_micro_batch_split_gives_the_bits_of_one_call() -> None:
    """Samples 0-2 then 3-5, main_grad carried from one call to the next, against all six in one call; the
    control: the halves in the other order give other bits."""
    n, k = 256, 256
    whole_ctx = _ctx(LENGTHS)
    dy, x, start = _data(n, k, sum(LENGTHS), seed=11)
    one = start.clone()
    _run(dy, x, whole_ctx, one)
    cut = sum(LENGTHS[:3])
    first, second = _ctx(LENGTHS[:3]), _ctx(LENGTHS[3:])
    split = start.clone()
    _run(dy[:cut].contiguous(), x[:cut].contiguous(), first, split)
    _run(dy[cut:].contiguous(), x[cut:].contiguous(), second, split)
    assert torch.equal(_bits(split), _bits(one))
    swapped = start.clone()
    _run(dy[cut:].contiguous(), x[cut:].contiguous(), second, swapped)
    _run(dy[:cut].contiguous(), x[:cut].contiguous(), first, swapped)
    assert not torch.equal(_bits(swapped), _bits(one))


def test_permuted_and_padded_rows_give_the_bits_of_the_packed_call() -> None:
    n, k = 256, 128
    dy, x, start = _data(n, k, sum(LENGTHS), seed=13)
    packed = start.clone()
    _run(dy, x, _ctx(LENGTHS), packed)
    # the same samples in another physical order: move each sample's rows
    order = [3, 0, 5, 1, 4, 2]
    offsets = [sum(LENGTHS[:s]) for s in range(len(LENGTHS))]
    idx = torch.cat([torch.arange(offsets[s], offsets[s] + LENGTHS[s]) for s in order]).to(DEV)
    permuted = start.clone()
    _run(dy[idx].contiguous(), x[idx].contiguous(), _ctx(LENGTHS, order), permuted)
    assert torch.equal(_bits(permuted), _bits(packed))
    # right padding: pad rows (sample id and position -1) with garbage values weigh nothing
    pad = 7
    ids = torch.cat([_ctx(LENGTHS).sample_ids, torch.full((pad,), -1, dtype=torch.int64)])
    pos = torch.cat([_ctx(LENGTHS).positions, torch.full((pad,), -1, dtype=torch.int64)])
    g = torch.Generator(device=DEV).manual_seed(1)
    dy_p = torch.cat([dy, torch.randn(pad, n, device=DEV, generator=g).to(torch.bfloat16)])
    x_p = torch.cat([x, torch.randn(pad, k, device=DEV, generator=g).to(torch.bfloat16)])
    padded = start.clone()
    _run(dy_p, x_p, LayoutContext(ids, pos), padded)
    assert torch.equal(_bits(padded), _bits(packed))


def test_it_agrees_with_the_generic_kernel() -> None:
    n, k = 512, 256
    ctx = _ctx(LENGTHS)
    dy, x, start = _data(n, k, sum(LENGTHS), seed=17)
    table = block_table(ctx, x.shape[0], x.device)
    hopper, generic = start.clone(), start.clone()
    torch.ops.ws1_sm90.wgrad(dy, x, table.rows, table.n_blocks, hopper, None)
    torch.ops.ws1.gemm_wgrad(dy, x, table.rows, table.n_blocks, generic, None)
    assert ((hopper - generic).abs() <= 1e-4 * generic.abs().max()).all()


@pytest.mark.parametrize("split", [False, True])
def test_one_and_two_consumer_warpgroups_give_the_same_bits(split: bool) -> None:
    """The 128 x 256 CTA (two warpgroups) runs each element's chain on the same atom as the 128 x 128 one, so the
    bits are the same; the control: another starting main_grad gives other bits."""
    ctx = _ctx(LENGTHS)
    dy, x, start = _data(256, 512, sum(LENGTHS), seed=19)
    lo = (dy.float() * 2.0**-9).to(torch.bfloat16) if split else None
    one, two = start.clone(), start.clone()
    _run(dy, x, ctx, one, lo, consumers=1)
    _run(dy, x, ctx, two, lo, consumers=2)
    assert torch.equal(_bits(one), _bits(two))
    other = start * 2
    _run(dy, x, ctx, other, lo, consumers=2)
    assert not torch.equal(_bits(other), _bits(one))


@pytest.mark.parametrize(("consumers", "split"), [(1, False), (2, False), (2, True)])
def test_32_and_64_row_stages_give_the_same_bits(consumers: int, split: bool) -> None:
    """A 32-row stage holds two of a 64-row stage's four k-steps, in the same order, so every element's chain is
    the same; samples long enough for many stages of either size. The control: another starting main_grad."""
    ctx = _ctx((300, 257, 5, 64))
    dy, x, start = _data(256, 512, 626, seed=23)
    lo = (dy.float() * 2.0**-9).to(torch.bfloat16) if split else None
    wide, narrow = start.clone(), start.clone()
    _run(dy, x, ctx, wide, lo, consumers=consumers, stage_rows=64)
    _run(dy, x, ctx, narrow, lo, consumers=consumers, stage_rows=32)
    assert torch.equal(_bits(wide), _bits(narrow))
    other = start * 2
    _run(dy, x, ctx, other, lo, consumers=consumers, stage_rows=32)
    assert not torch.equal(_bits(other), _bits(wide))


def test_a_stage_size_other_than_32_or_64_is_refused() -> None:
    ctx = _ctx(LENGTHS)
    dy, x, start = _data(128, 128, sum(LENGTHS))
    with pytest.raises(RuntimeError, match="stage_rows must be 32 or 64"):
        _run(dy, x, ctx, start, stage_rows=16)
    _run(dy, x, ctx, start, stage_rows=32)  # the control: an allowed size runs


def test_a_weight_off_the_tile_is_refused_by_the_op() -> None:
    ctx = _ctx(LENGTHS)
    dy, x, start = _data(136, 128, sum(LENGTHS))
    with pytest.raises(RuntimeError, match="multiples of 128"):
        _run(dy, x, ctx, start)
