"""`draw_rows` and `logical_tensor` give the bits of the row-by-row definition, in any number of threads.

Why it matters: every tier's inputs are drawn on the host; drawing them into one tensor (instead of row by row and
stacked), in threads where asked, is only a speed change if no value moves."""

from __future__ import annotations

import pytest
import torch

from ws1_workload import inputs as I

SHAPE = (3, 40)


def _one_by_one(seeds: list[int], shape: tuple[int, ...], scales: dict[int, float]) -> torch.Tensor:
    """The definition: each row from a fresh tensor and a generator seeded with its seed, scaled, then stacked."""
    gen = torch.Generator(device="cpu")
    rows = []
    for i, seed in enumerate(seeds):
        gen.manual_seed(seed)
        row = torch.empty(shape, dtype=torch.float32).normal_(generator=gen)
        rows.append(row * scales[i] if i in scales else row)
    return torch.stack(rows)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_rows_drawn_in_threads_are_the_definition_s_bits(
    threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(I, "PARALLEL_DRAW_MIN", 0)  # the pool even at this small size
    seeds = [I.derive_seed("t", str(i)) for i in range(23)]
    scales = {4: I.TINY_ROW_SCALE, 9: I.LARGE_ROW_SCALE}
    want = _one_by_one(seeds, SHAPE, scales)
    assert torch.equal(_bits(I.draw_rows(seeds, SHAPE, scales, threads=threads)), _bits(want))


def test_a_row_s_values_follow_its_own_seed() -> None:
    """Negative control: the same seeds in another order give other rows (the comparison above has teeth)."""
    seeds = [I.derive_seed("t", str(i)) for i in range(6)]
    got = I.draw_rows(seeds[::-1], SHAPE, threads=2)
    assert not torch.equal(got, _one_by_one(seeds, SHAPE, {}))
    assert torch.equal(got, _one_by_one(seeds, SHAPE, {}).flip(0))


def test_logical_tensor_with_every_hard_row_kind_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole tensor (hard rows, zero replacement, rounding) against the row-by-row definition of its
    values, with the pool forced on."""
    keys = [(s, p) for s in range(3) for p in range(9)]
    kinds = tuple(I.HARD_ROW_KINDS)
    one = I.logical_tensor("case", "x", keys, 256, hard_rows=kinds)
    monkeypatch.setattr(I, "PARALLEL_DRAW_MIN", 0)
    monkeypatch.setattr(I, "DRAW_THREADS", 4)
    many = I.logical_tensor("case", "x", keys, 256, hard_rows=kinds)
    assert torch.equal(one.view(torch.int16), many.view(torch.int16))
    seeds = [I.derive_seed("logical", "case", "x", I.canonical_key(k)) for k in keys]
    plain = [i for i, k in enumerate(keys) if I.hard_row_kind(k, kinds) is None]
    want = I.round_to_bf16(_one_by_one(seeds, (256,), {}))
    assert torch.equal(many[plain].view(torch.int16), want[plain].view(torch.int16))


def test_rounding_replaces_zeros_in_place_of_a_new_tensor() -> None:
    x = torch.tensor([0.0, -0.0, 1e-45, 1.5], dtype=torch.float32)
    y = I.round_to_bf16(x)
    assert y.dtype == torch.bfloat16
    assert bool((y != 0).all())
    assert y[3].item() == 1.5


class _PoolSeen(Exception):
    pass


def _no_pool(*args: object, **kwargs: object) -> None:
    raise _PoolSeen


def test_one_thread_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool is opt-in: threads each calling torch's own parallel `normal_` oversubscribed a 16-core GPU host
    (13.1 s against 2.3 s for logp's long-tier logits). With no thread count named, no pool is made."""
    monkeypatch.setattr(I, "PARALLEL_DRAW_MIN", 0)
    monkeypatch.setattr(I, "ThreadPoolExecutor", _no_pool)
    seeds = [I.derive_seed("t", str(i)) for i in range(8)]
    assert torch.equal(_bits(I.draw_rows(seeds, SHAPE)), _bits(_one_by_one(seeds, SHAPE, {})))


def test_the_control_a_named_thread_count_makes_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(I, "PARALLEL_DRAW_MIN", 0)
    monkeypatch.setattr(I, "ThreadPoolExecutor", _no_pool)
    seeds = [I.derive_seed("t", str(i)) for i in range(8)]
    with pytest.raises(_PoolSeen):
        I.draw_rows(seeds, SHAPE, threads=2)
