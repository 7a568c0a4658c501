"""Fixtures: tiers as the issue defines them, token ids inside the vocab, bytes identical across runs."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from ws1_workload import build_fixture, load_manifest
from ws1_workload.digest import fixture_digest


def test_tier_shapes(manifest):
    short, primary, long = (build_fixture(manifest, t) for t in ("short", "primary", "long"))
    assert [s.length for s in short.samples] == [8]
    assert [s.length for s in primary.samples] == [11, 16, 13, 19]
    lengths = [s.length for s in long.samples]
    for tile in (64, 128, 256, 1024):
        assert any(n > tile and n % tile for n in lengths), tile  # some sample crosses the tile boundary


def test_masks_ids_and_offsets(manifest):
    for tier in manifest.tiers:
        fx = build_fixture(manifest, tier)
        assert fx.case_id == f"{manifest.workload_id}/{tier}"
        for s in fx.samples:
            assert s.token_ids.dtype == torch.int64 and s.token_ids.shape == (s.length,)
            assert int(s.token_ids.min()) >= 0 and int(s.token_ids.max()) < manifest.token_id_limit
            assert not bool((s.token_ids == manifest.pad_id).any())
            assert torch.equal(s.active, torch.arange(s.length) >= s.prompt_len)
            assert 0 < s.prompt_len < s.length
        assert fx.offsets[0] == 0 and len(fx.logical_keys) == fx.total_tokens == len(fx.token_ids)
        for s in fx.samples:
            assert fx.logical_keys[fx.offsets[s.sample_id]] == (s.sample_id, 0)
        # position p is scored when its target p + 1 is a completion token
        assert int(fx.scored.sum()) == sum(s.length - s.prompt_len for s in fx.samples)
        assert torch.equal(fx.targets[:-1][fx.scored[:-1]], fx.token_ids[1:][fx.scored[:-1]])
        for tier_vocab in (manifest.model(m).vocab for m in manifest.models):
            assert int(fx.token_ids.max()) < tier_vocab


def test_fixture_bytes_identical_across_runs(manifest, source_manifest):
    here = {t: fixture_digest(build_fixture(manifest, t)) for t in manifest.tiers}
    code = (
        "import json,sys; from ws1_workload import load_manifest, build_fixture;"
        "from ws1_workload.digest import fixture_digest;"
        f"m = load_manifest({str(source_manifest)!r});"
        "print(json.dumps({t: fixture_digest(build_fixture(m, t)) for t in m.tiers}))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert json.loads(out) == here
    assert len(set(here.values())) == len(here)


def test_a_case_alone_sees_the_same_bytes(manifest, write_manifest):
    """Dropping or changing the other tiers must not change a tier's bytes (seeds come from ids, not indices)."""

    def edit(doc):
        doc["fixtures"]["tiers"]["short"]["samples"] = [{"length": 31, "prompt_len": 9}]
        doc["fixtures"]["tiers"]["long"]["samples"] = doc["fixtures"]["tiers"]["long"]["samples"][1:2]

    other = load_manifest(write_manifest(edit))
    assert other.fingerprint != manifest.fingerprint
    alone, swept = build_fixture(other, "primary"), build_fixture(manifest, "primary")
    assert fixture_digest(alone) == fixture_digest(swept)
    for a, b in zip(alone.samples, swept.samples, strict=True):
        assert torch.equal(a.token_ids, b.token_ids)
