"""The rollout engine's KV cache (`integrations.kv_slots.SlotKVCache`): allocated once, a slot per running request,
rows written in place, the attention's prefix a view of the slot.

Each property has its control: the concatenating `qwen3.KVCache` gives the bits the slots must give, and a cache
that forgets to reset a slot when its request leaves is caught.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from ws1_kernels import KernelInputError, LayoutContext  # noqa: E402
from ws1_kernels.integrations import qwen3, rollout  # noqa: E402
from ws1_kernels.integrations.kv_slots import SlotKVCache  # noqa: E402


def _ctx(sample: int, first: int, n: int) -> LayoutContext:
    return LayoutContext(torch.full((n,), sample, dtype=torch.int64), torch.arange(first, first + n))


def _rows(n: int, fill: float) -> torch.Tensor:
    return torch.full((n, 2, 4), fill, dtype=torch.bfloat16)


def _write(c: SlotKVCache, sample: int, first: int, n: int, fill: float) -> None:
    """One call of ``n`` rows of ``sample`` through every layer of the cache."""
    for layer in range(c.num_layers):
        c.append(layer, _ctx(sample, first, n), _rows(n, fill), _rows(n, fill))


def test_a_joining_request_takes_the_lowest_free_slot() -> None:
    c = SlotKVCache(num_layers=1, slots=2, max_len=8)
    _write(c, 10, 0, 1, 1.0)
    _write(c, 11, 0, 1, 1.0)
    assert c.slot_of == {10: 0, 11: 1}
    c.drop(10)
    _write(c, 12, 0, 1, 1.0)
    assert c.slot_of == {11: 1, 12: 0}, "the freed slot is reused"


def test_a_full_cache_refuses_one_more_request_in_one_line() -> None:
    c = SlotKVCache(num_layers=1, slots=1, max_len=8)
    _write(c, 1, 0, 1, 1.0)
    with pytest.raises(KernelInputError, match="all 1 slots are taken") as exc:
        _write(c, 2, 0, 1, 1.0)
    assert "\n" not in str(exc.value)
    c.drop(1)
    _write(c, 2, 0, 1, 1.0)  # control: once the slot is free, the request gets it
    assert c.slot_of == {2: 0}


def test_rows_past_max_len_are_refused() -> None:
    c = SlotKVCache(num_layers=1, slots=1, max_len=4)
    _write(c, 0, 0, 4, 1.0)  # control: exactly max_len fits
    with pytest.raises(KernelInputError, match="past the cache's max_len 4"):
        c.append(0, _ctx(0, 4, 1), _rows(1, 1.0), _rows(1, 1.0))


def test_the_prefix_is_a_view_of_the_slab_and_holds_the_rows_written() -> None:
    c = SlotKVCache(num_layers=2, slots=2, max_len=8)
    for layer in range(2):
        c.append(layer, _ctx(5, 0, 3), _rows(3, 2.0), _rows(3, 3.0))
    k, v = c.prefix(1, _ctx(5, 3, 1))[5]
    assert k.shape == (3, 2, 4) and torch.equal(k, _rows(3, 2.0)) and torch.equal(v, _rows(3, 3.0))
    assert k.untyped_storage().data_ptr() == c.slab.k[1].untyped_storage().data_ptr(), "the prefix was copied"
    assert c.allocations == 1 and c.length(5) == 3


def test_a_call_that_does_not_continue_the_cache_is_refused() -> None:
    c = SlotKVCache(num_layers=1, slots=1, max_len=8)
    c.append(0, _ctx(0, 0, 2), _rows(2, 1.0), _rows(2, 1.0))
    assert set(c.prefix(0, _ctx(0, 2, 1))) == {0}  # control: position 2 continues
    with pytest.raises(KernelInputError, match="starts at position 3 but the cache holds 2 keys"):
        c.prefix(0, _ctx(0, 3, 1))


class _LeakySlots(SlotKVCache):
    """The mistake a slot cache can make: a request that leaves keeps its slot."""

    def drop(self, sample_id: int) -> None:
        pass


@pytest.mark.parametrize(("cache_type", "leaky"), [(SlotKVCache, False), (_LeakySlots, True)])
def test_a_reused_slot_shows_only_the_new_requests_rows(cache_type: type, leaky: bool) -> None:
    c = cache_type(num_layers=1, slots=1, max_len=8)
    _write(c, 1, 0, 3, 7.0)
    c.drop(1)
    assert c.prefix(0, _ctx(2, 0, 2)) == {}
    if leaky:  # the slot was never given back: the next request finds none
        with pytest.raises(KernelInputError, match="all 1 slots are taken"):
            _write(c, 2, 0, 2, 9.0)
        return
    _write(c, 2, 0, 2, 9.0)
    k, _v = c.prefix(0, _ctx(2, 2, 1))[2]
    assert torch.equal(k, _rows(2, 9.0)), "the slot shows rows of the request that left"


def test_a_call_cut_short_exposes_none_of_its_rows() -> None:
    """Only the last layer's append advances the length: a call stopped after layer 0 of 2 leaves the request
    where it was (the control: the finished call advances it)."""
    c = SlotKVCache(num_layers=2, slots=1, max_len=8)
    c.append(0, _ctx(0, 0, 2), _rows(2, 1.0), _rows(2, 1.0))
    assert c.length(0) == 0 and c.prefix(1, _ctx(0, 0, 2)) == {}
    c.append(1, _ctx(0, 0, 2), _rows(2, 1.0), _rows(2, 1.0))
    assert c.length(0) == 2


# ---- the engine on the slots


@pytest.fixture(scope="module")
def model_and_fixture(rollout_model_and_fixture):  # type: ignore[no-untyped-def]
    return rollout_model_and_fixture


def _requests(fx):
    return [
        rollout.Request(
            s.sample_id, s.token_ids[: s.prompt_len].clone(), s.length - s.prompt_len, s.sample_id
        )
        for s in fx.samples
    ]


class _ConcatEngine(rollout.Engine):
    """The engine on the concatenating cache it used before the slots: the bits the slots must reproduce."""

    def make_cache(self, requests):  # type: ignore[no-untyped-def]
        return qwen3.KVCache(len(self.model.model.layers))


def _serve(engine: rollout.Engine, fx):  # type: ignore[no-untyped-def]
    done = engine.run(_requests(fx))
    return {rid: c.tokens for rid, c in done.items()}, {rid: c.logprob_tensor for rid, c in done.items()}


def test_the_slots_give_the_bits_of_the_concatenating_cache(model_and_fixture) -> None:  # type: ignore[no-untyped-def]
    model, fx = model_and_fixture
    kw = {"chunk_size": 3, "max_running": 2}
    slots = rollout.Engine(model, rollout.GumbelSampler(5), **kw)
    tokens, lps = _serve(slots, fx)
    ref_tokens, ref_lps = _serve(_ConcatEngine(model, rollout.GumbelSampler(5), **kw), fx)
    assert tokens == ref_tokens
    for rid, lp in lps.items():
        assert torch.equal(lp.view(torch.int32), ref_lps[rid].view(torch.int32)), rid
    assert isinstance(slots.cache, SlotKVCache)


class _StaleValueSlots(SlotKVCache):
    """The control of the bit comparison: a cache that serves its first cached key in place of the last."""

    def prefix(self, layer, ctx):  # type: ignore[no-untyped-def]
        out = {}
        for sid, (k, v) in super().prefix(layer, ctx).items():
            k = k.clone()
            k[-1] = k[0]
            out[sid] = (k, v)
        return out


class _StaleValueEngine(rollout.Engine):
    def make_cache(self, requests):  # type: ignore[no-untyped-def]
        slots = super().make_cache(requests)
        return _StaleValueSlots(slots.num_layers, slots.slab.slots, slots.slab.max_len)


def test_a_wrong_cached_key_changes_the_bits(model_and_fixture) -> None:  # type: ignore[no-untyped-def]
    """The comparison above would see a cache that serves a wrong key: the recorded logprobs differ."""
    model, fx = model_and_fixture
    kw = {"chunk_size": 3, "max_running": 2}
    _tokens, lps = _serve(_StaleValueEngine(model, rollout.GumbelSampler(5), **kw), fx)
    _ref_tokens, ref_lps = _serve(_ConcatEngine(model, rollout.GumbelSampler(5), **kw), fx)
    assert any(
        lps[rid].shape != ref_lps[rid].shape
        or not torch.equal(lps[rid].view(torch.int32), ref_lps[rid].view(torch.int32))
        for rid in ref_lps
    )


def test_the_engine_allocates_once_and_reuses_slots(model_and_fixture) -> None:  # type: ignore[no-untyped-def]
    model, fx = model_and_fixture
    engine = rollout.Engine(model, rollout.GumbelSampler(5), chunk_size=4, max_running=2)
    seen: set[int] = set()
    engine.on_step = lambda *_: seen.update(engine.cache.slot_of.values())  # type: ignore[union-attr]
    engine.run(_requests(fx))
    cache = engine.cache
    assert isinstance(cache, SlotKVCache)
    assert fx.num_samples > cache.slab.slots == 2 and seen == {0, 1}, "four requests ran in two slots"
    assert cache.allocations == 1 and cache.slot_of == {}, "every slot was given back"


def test_a_rewound_request_decodes_the_same_position_again() -> None:
    c = SlotKVCache(num_layers=2, slots=2, max_len=8)
    _write(c, 0, 0, 3, 1.0)
    _write(c, 1, 0, 3, 2.0)
    c.rewind(0, 2)
    assert c.length(0) == 2 and c.length(1) == 3
    c.rewind_all(1)
    assert (c.length(0), c.length(1)) == (1, 1) and set(c.prefix(1, _ctx(0, 1, 1))) == {0}
    with pytest.raises(KernelInputError, match="cannot rewind request 0 to 2 keys: it holds 1"):
        c.rewind(0, 2)  # control: forward is not a rewind
    with pytest.raises(KernelInputError, match="cannot rewind every request to 5 keys"):
        c.rewind_all(5)
