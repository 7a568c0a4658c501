"""Physical layouts and restore: every layout round-trips, and a broken map fails loudly naming the key."""

from __future__ import annotations

import dataclasses
import math
from types import MappingProxyType

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ws1_workload import LayoutError, LayoutSpec, build_fixture, build_layout, make_fixture, restore
from ws1_workload.layouts import permutation

PAD_ID = 0


def _spec(type_: str, kind: str = "training", **params) -> LayoutSpec:
    return LayoutSpec(name=type_, kind=kind, type=type_, params=MappingProxyType(params))


def _key_outputs(layout) -> list[torch.Tensor]:
    """Per-call outputs that encode each row's own physical key, so restore must put it at its logical row."""
    return [torch.stack([c.sample_ids, c.positions, c.token_ids], dim=1) for c in layout.calls]


def _expected(fx) -> torch.Tensor:
    rows = [(s, p, int(fx.samples[s].token_ids[p])) for s, p in fx.logical_keys]
    return torch.tensor(rows, dtype=torch.int64)


@st.composite
def fixtures_(draw):
    n = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    prompts = [draw(st.integers(0, n_)) for n_ in lengths]
    return make_fixture(
        f"prop/{draw(st.integers(0, 10**6))}", lengths, prompts, pad_id=PAD_ID, token_id_limit=97
    )


@st.composite
def specs_(draw, num_samples):
    choice = draw(st.sampled_from(["packed", "split", "padded", "permuted", "chunked", "decode"]))
    if choice == "split":
        return _spec(
            "split", samples_per_call=draw(st.one_of(st.integers(1, num_samples + 1), st.just("half")))
        )
    if choice == "padded":
        return _spec(
            "padded", side=draw(st.sampled_from(["right", "left"])), pad_to_multiple=draw(st.integers(1, 16))
        )
    if choice == "permuted":
        return _spec("permuted", seed=draw(st.integers(0, 2**31)))
    if choice == "chunked":
        return _spec("chunked", "inference", chunk_size=draw(st.integers(1, 45)))
    return _spec(choice, "inference" if choice == "decode" else "training")


def _check_structure(fx, layout):
    for call in layout.calls:
        pad = call.sample_ids < 0
        assert torch.equal(pad, call.positions < 0)
        assert bool((call.token_ids[pad] == fx.pad_id).all())
        sids = call.sample_ids[~pad].tolist()
        runs = [s for i, s in enumerate(sids) if i == 0 or sids[i - 1] != s]
        assert len(runs) == len(set(runs)), "rows of one sample must be contiguous"
        assert set(runs) == set(call.prefix_lengths) or not runs
        for s in runs:
            pos = call.positions[call.sample_ids == s].tolist()
            start = call.prefix_lengths[s]
            assert pos == list(range(start, start + len(pos)))
        if call.grid is not None:
            assert call.grid[0] * call.grid[1] == call.num_rows


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_every_layout_round_trips(data):
    fx = data.draw(fixtures_())
    spec = data.draw(specs_(fx.num_samples))
    layout = build_layout(fx, spec)
    _check_structure(fx, layout)
    restored = restore(layout, _key_outputs(layout))
    assert torch.equal(restored, _expected(fx))
    # bits survive restore: a float payload comes back identical at the integer level
    payload = [torch.randn(c.num_rows, 3).to(torch.bfloat16) for c in layout.calls]
    back = restore(layout, payload)
    token = torch.cat([c.sample_ids for c in layout.calls]) >= 0
    assert torch.equal(
        torch.sort(back.view(torch.int16).flatten()).values,
        torch.sort(torch.cat(payload)[token].view(torch.int16).flatten()).values,
    )


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_missing_duplicate_and_extra_keys_raise(data):
    fx = data.draw(fixtures_())
    layout = build_layout(fx, data.draw(specs_(fx.num_samples)))
    real = [
        (ci, r) for ci, c in enumerate(layout.calls) for r in range(c.num_rows) if int(c.sample_ids[r]) >= 0
    ]
    ci, r = data.draw(st.sampled_from(real))
    key = (int(layout.calls[ci].sample_ids[r]), int(layout.calls[ci].positions[r]))

    def mutate(sids, pos):
        calls = list(layout.calls)
        calls[ci] = dataclasses.replace(calls[ci], sample_ids=sids, positions=pos)
        return dataclasses.replace(layout, calls=tuple(calls))

    call = layout.calls[ci]
    dropped_s, dropped_p = call.sample_ids.clone(), call.positions.clone()
    dropped_s[r], dropped_p[r] = -1, -1  # turn the row into a pad: its key goes missing
    with pytest.raises(LayoutError, match=rf"missing key \({key[0]}, {key[1]}\)"):
        restore(mutate(dropped_s, dropped_p), _key_outputs(layout))

    extra_s, extra_p = call.sample_ids.clone(), call.positions.clone()
    extra_p[r] = fx.samples[key[0]].length  # one past the end: not a key of the fixture
    with pytest.raises(LayoutError, match=r"extra key"):
        restore(mutate(extra_s, extra_p), _key_outputs(layout))

    if len(real) >= 2:
        cj, q = data.draw(st.sampled_from([x for x in real if x != (ci, r)]))
        other = (int(layout.calls[cj].sample_ids[q]), int(layout.calls[cj].positions[q]))
        dup_s, dup_p = call.sample_ids.clone(), call.positions.clone()
        dup_s[r], dup_p[r] = other  # row now repeats another key; its own key goes missing
        with pytest.raises(LayoutError, match=rf"duplicate key \({other[0]}, {other[1]}\)"):
            restore(mutate(dup_s, dup_p), _key_outputs(layout))


def test_restore_checks_outputs(manifest):
    layout = build_layout(build_fixture(manifest, "primary"), manifest.layout("split_1"))
    outs = _key_outputs(layout)
    with pytest.raises(LayoutError, match="expected 4 outputs"):
        restore(layout, outs[:3])
    with pytest.raises(LayoutError, match="call 1 has"):
        restore(layout, [outs[0], outs[1][:-1], outs[2], outs[3]])
    with pytest.raises(LayoutError, match="differs"):
        restore(layout, [outs[0].float(), *outs[1:]])


def test_manifest_layouts_on_primary(manifest):
    fx = build_fixture(manifest, "primary")
    lay = {s.name: build_layout(fx, s) for s in manifest.layouts}
    assert len(lay["packed"].calls) == 1 and lay["packed"].calls[0].sample_ids.unique().tolist() == [
        0,
        1,
        2,
        3,
    ]
    assert [c.sample_ids.unique().tolist() for c in lay["split_1"].calls] == [[0], [1], [2], [3]]
    assert [c.sample_ids.unique().tolist() for c in lay["split_half"].calls] == [[0, 1], [2, 3]]
    right, left = lay["padded_right"].calls[0], lay["padded_left"].calls[0]
    multiple = manifest.layout("padded_right").params["pad_to_multiple"]
    width = -(-max(s.length for s in fx.samples) // multiple) * multiple
    assert right.grid == left.grid == (4, width)
    grid_r, grid_l = right.sample_ids.view(4, width), left.sample_ids.view(4, width)
    n0 = fx.samples[0].length
    pads = width - n0
    assert pads > 0, "the padded layout must pad the first sample"
    assert (
        grid_r[0, n0 - 1] == 0 and grid_r[0, n0] == -1 and grid_l[0, pads - 1] == -1 and grid_l[0, pads] == 0
    )
    order = [
        s
        for i, s in enumerate(lay["permuted"].calls[0].sample_ids.tolist())
        if i == 0 or lay["permuted"].calls[0].sample_ids[i - 1] != s
    ]
    assert sorted(order) == [0, 1, 2, 3] and order != [0, 1, 2, 3]


def test_chunked_calls_hold_each_chunk_of_every_sample(manifest):
    fx = build_fixture(manifest, "primary")
    size = manifest.layout("chunked").params["chunk_size"]
    layout = build_layout(fx, manifest.layout("chunked"))
    assert len(layout.calls) == math.ceil(max(s.length for s in fx.samples) / size) >= 2
    for c, call in enumerate(layout.calls):
        for s in fx.samples:
            rows = call.positions[call.sample_ids == s.sample_id].tolist()
            assert rows == list(range(c * size, min(s.length, (c + 1) * size)))
            if rows:
                assert call.prefix_lengths[s.sample_id] == c * size


def test_decode_prefills_prompts_then_one_row_per_step(manifest):
    fx = build_fixture(manifest, "primary")
    layout = build_layout(fx, manifest.layout("decode"))
    prefill = layout.calls[0]
    for s in fx.samples:
        assert prefill.positions[prefill.sample_ids == s.sample_id].tolist() == list(range(s.prompt_len))
    assert len(layout.calls) == 1 + max(s.length - s.prompt_len for s in fx.samples)
    for k, call in enumerate(layout.calls[1:]):
        live = [s for s in fx.samples if s.prompt_len + k < s.length]
        assert call.sample_ids.tolist() == [s.sample_id for s in live]
        assert call.positions.tolist() == [s.prompt_len + k for s in live]
        assert dict(call.prefix_lengths) == {s.sample_id: s.prompt_len + k for s in live}


def test_permutation_is_seeded_and_never_identity():
    assert permutation(5, 7) == permutation(5, 7)
    for seed in range(200):
        assert permutation(2, seed) == [1, 0]
    assert permutation(1, 3) == [0]
