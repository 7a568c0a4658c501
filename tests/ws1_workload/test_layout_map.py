"""The workload owns the layout map both ways: `call_rows` (logical row of each physical row) is the inverse of
`restore` on every layout of every tier, and `sample_runs` finds each sample's rows in a call."""

from __future__ import annotations

import pytest
import torch

from ws1_workload import build_fixture, build_layout, call_rows, load_manifest, restore, sample_runs

MANIFEST = load_manifest()


@pytest.mark.parametrize("tier", MANIFEST.tiers)
def test_call_rows_is_the_inverse_of_restore(tier: str) -> None:
    fx = build_fixture(MANIFEST, tier, "tiny")
    for spec in MANIFEST.layouts:
        layout = build_layout(fx, spec)
        rows = [call_rows(call, fx.offsets) for call in layout.calls]
        assert torch.equal(restore(layout, rows), torch.arange(fx.total_tokens)), spec.name
        for call, r in zip(layout.calls, rows, strict=True):
            assert bool(((r == -1) == (call.sample_ids == -1)).all())  # pads and only pads map to -1


def test_a_wrong_offset_table_does_not_invert() -> None:
    """Negative control: offsets shifted by one row give a map that restore cannot take for the identity."""
    fx = build_fixture(MANIFEST, "short", "tiny")
    layout = build_layout(fx, next(s for s in MANIFEST.layouts if s.type == "packed"))
    shifted = [o + 1 for o in fx.offsets]
    rows = [call_rows(call, shifted) for call in layout.calls]
    assert not torch.equal(restore(layout, rows), torch.arange(fx.total_tokens))


def test_sample_runs_cover_every_real_row_once() -> None:
    fx = build_fixture(MANIFEST, "primary", "tiny")
    for spec in MANIFEST.layouts:
        for call in build_layout(fx, spec).calls:
            covered = torch.zeros(call.num_rows, dtype=torch.int64)
            for s, first, n in sample_runs(call):
                assert bool((call.sample_ids[first : first + n] == s).all())
                covered[first : first + n] += 1
            assert torch.equal(covered, (call.sample_ids >= 0).to(torch.int64)), spec.name
