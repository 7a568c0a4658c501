"""Fixtures: tiers, token ids inside the vocab, every hard case present, bytes identical across runs."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from ws1_workload import WorkloadError, build_fixture, load_manifest
from ws1_workload.digest import fixture_digest
from ws1_workload.fixtures import make_fixture
from ws1_workload.hardcase_checks import check_block_edge_coverage, check_case, check_hard_cases
from ws1_workload.hardcases import KNOWN_CASES


def test_tier_shapes(manifest):
    short, primary, long = (build_fixture(manifest, t) for t in ("short", "primary", "long"))
    assert [s.length for s in short.samples] == [15, 17]
    assert [s.length for s in primary.samples] == [31, 33, 16, 2]
    lengths = [s.length for s in long.samples]
    for tile in (64, 128, 256, 1024):
        assert any(n > tile and n % tile for n in lengths), tile  # some sample crosses the tile boundary


@pytest.mark.parametrize("model", [None, "tiny", "qwen3-8b"])
def test_every_hard_case_is_present_in_every_tier_it_lists(manifest, model):
    findings = check_hard_cases(manifest, model)
    listed = {(name, tier) for name, spec in manifest.hard_cases.items() for tier in spec.tiers}
    assert listed <= {(f.case, f.tier) for f in findings}
    assert set(manifest.hard_cases) == set(KNOWN_CASES)  # every case the checks know is named in the manifest
    missing = [f for f in findings if not f.present]
    assert not missing, missing


def test_edge_ids_follow_the_model_vocab(manifest):
    for model in manifest.models:
        fx = build_fixture(manifest, "short", model)
        vocab = manifest.model(model).vocab
        assert fx.vocab == vocab and int(fx.token_ids.max()) == vocab - 1
        assert int(fx.token_ids.min()) == 0


@pytest.mark.parametrize(
    ("case", "lengths", "prompts"),
    [
        ("repeated_id_within_sample", [3, 3], [1, 1]),  # two completion tokens per sample: 0/V-1 once each
        ("repeated_id_across_samples", [2], [1]),  # one sample
        ("block_edge_lengths", [20, 40], [5, 5]),
        ("padded_layouts_pad", [8, 8], [3, 3]),  # lengths equal to the pad multiple
        ("single_row_call", [6, 6], [5, 5]),  # both samples decode together
        ("decode_crosses_key_block", [60, 30], [10, 10]),
        ("id_last", [8], [3]),
    ],
)
def test_a_fixture_without_the_case_fails_its_check(manifest, case, lengths, prompts):
    """Negative controls: each check says absent where the case is absent."""
    fx = make_fixture(
        "negative",
        lengths,
        prompts,
        pad_id=0,
        token_id_limit=manifest.token_id_limit,
        hard_rows=manifest.hard_rows,
    )
    if case == "id_last":
        fx = replace(fx, vocab=fx.vocab + 1)  # V-1 never drawn: the fixture's ids stop below it
    assert not check_case(manifest.hard_cases[case], manifest, fx).present


def test_row_cases_fail_without_hard_rows(manifest):
    fx = make_fixture("negative", [17, 15], [12, 11], pad_id=0, token_id_limit=manifest.token_id_limit)
    for case in ("signed_zero_rows", "tiny_norm_rows", "large_logit_rows"):
        assert not check_case(manifest.hard_cases[case], manifest, fx).present, case


def test_unknown_or_malformed_hard_cases_are_refused(write_manifest):
    def unknown(doc):
        doc["fixtures"]["hard_cases"]["nan_rows"] = {"what": "x", "tiers": ["short"]}

    def no_inputs(doc):
        del doc["fixtures"]["hard_cases"]["tiny_norm_rows"]["inputs"]

    def bad_input(doc):
        doc["fixtures"]["hard_cases"]["tiny_norm_rows"]["inputs"] = ["norm.x"]

    for edit, words in ((unknown, "unknown hard case"), (no_inputs, "needs 'inputs'"), (bad_input, "chain")):
        with pytest.raises(WorkloadError, match=words):
            load_manifest(write_manifest(edit))


def test_coverage_of_block_edges_is_checked_across_tiers(manifest):
    spec = manifest.hard_cases["block_edge_lengths"]
    assert check_block_edge_coverage(spec, manifest).present
    wider = replace(spec, blocks=(*spec.blocks, 256))  # 255 and 257 are no sample's length
    finding = check_block_edge_coverage(wider, manifest)
    assert not finding.present and "255" in finding.detail


def test_masks_ids_and_offsets(manifest):
    for tier in manifest.tiers:
        fx = build_fixture(manifest, tier)
        assert fx.case_id == f"{manifest.workload_id}/{tier}"
        for s in fx.samples:
            assert s.token_ids.dtype == torch.int64 and s.token_ids.shape == (s.length,)
            assert int(s.token_ids.min()) >= 0 and int(s.token_ids.max()) < manifest.token_id_limit
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
