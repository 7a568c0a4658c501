"""`ws1 gate --expect PROFILE:TIER+TIER`: the tiers a merged run's plan ran each profile on.

The merged CPU and GPU shards (the committed CPU shard runs the short and primary tiers, the GPU shard all three)
are the case: without a plan the CPU profile's long tier is missing, with it the run passes and says what it left
out. A plan only excuses absence: present cells stay expected."""

from __future__ import annotations

from pathlib import Path

import pytest
from evidence_files import merged_cpu_gpu

from ws1_harness.cli import main
from ws1_harness.verdict.cells import CellKey, ExpectedCell
from ws1_harness.verdict.evidence import load_evidence
from ws1_harness.verdict.gate import apply_tier_plans

GPU = ["--expect", "cuda_bf16@sm90"]


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return merged_cpu_gpu(tmp_path_factory.mktemp("cpu-gpu"))


def test_without_a_plan_the_cpu_profiles_long_tier_is_missing(
    merged: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["gate", "--full", "--expect", "portable_cpu", *GPU, str(merged)]) == 1
    out = capsys.readouterr().out
    assert "portable_cpu/attention/long/forward_accuracy: required cell missing" in out


def test_the_plan_passes_the_merge_and_says_what_it_left_out(
    merged: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["gate", "--full", "--expect", "portable_cpu:short+primary", *GPU, str(merged)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("ws1 gate: PASS (planned: portable_cpu tiers short+primary, ")
    assert "cells not run)" in first


def test_a_plan_never_drops_a_present_cell(merged: Path, capsys: pytest.CaptureFixture) -> None:
    """Planning the GPU profile on one tier while its shard holds all three: nothing is left out."""
    assert main(["gate", "--full", "--expect", "portable_cpu:short+primary", "--expect", "cuda_bf16@sm90:short",
                 str(merged)]) == 0  # fmt: skip
    first = capsys.readouterr().out.splitlines()[0]
    assert "cuda_bf16@sm90" not in first, first


def test_present_cells_stay_expected_and_absent_ones_go() -> None:
    keys = [CellKey("p", "op", t, "forward_accuracy") for t in ("short", "long")]
    expected = {k: ExpectedCell(k, required=True, na_reason=None) for k in keys}
    long_cell = {"profile": "p", "operator": "op", "tier": "long", "judgment": "forward_accuracy"}
    kept, dropped = apply_tier_plans(expected, {"cells": [long_cell]}, {"p": ("short",)})
    assert set(kept) == set(keys) and dropped == {}
    kept, dropped = apply_tier_plans(expected, {"cells": []}, {"p": ("short",)})
    assert set(kept) == {keys[0]} and dropped == {"p": 1}


@pytest.mark.parametrize(
    ("value", "message"),
    [("portable_cpu:longer", "tier 'longer' is not in the manifest"), ("portable_cpu:", "not profile@arch")],
)
def test_a_bad_plan_is_bad_input(
    merged: Path, capsys: pytest.CaptureFixture, value: str, message: str
) -> None:
    assert main(["gate", "--expect", value, str(merged)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_the_merged_cells_are_the_two_shards(merged: Path) -> None:
    doc = load_evidence(merged)
    assert sorted(doc["axes"]["profiles"]) == ["cuda_bf16@sm90", "portable_cpu"]


def test_the_report_gives_the_gates_verdict_under_the_plan(merged: Path, tmp_path: Path) -> None:
    """`ws1 report --expect` judges with the plan; without it (the control) the same file reports RED."""
    plan = ["--expect", "portable_cpu:short+primary", *GPU]
    assert main(["report", str(merged), "--out", str(tmp_path / "plan"), *plan]) == 0
    assert (
        "ws1 gate: PASS (planned: portable_cpu tiers short+primary"
        in (tmp_path / "plan" / "merged.report.md").read_text()
    )
    assert (tmp_path / "plan" / "merged.arch-heatmap.png").is_file()  # a cpu panel beside the sm90 one
    assert main(["report", str(merged), "--out", str(tmp_path / "none")]) == 0
    assert "ws1 gate: RED" in (tmp_path / "none" / "merged.report.md").read_text()


def test_the_report_refuses_a_malformed_plan(
    merged: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["report", str(merged), "--out", str(tmp_path), "--expect", "portable_cpu:"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not profile@arch" in err
    assert not list(tmp_path.iterdir()), "a refused report wrote files"


def test_the_report_refuses_a_plan_on_a_tier_the_manifest_lacks(
    merged: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Exit 2 and one line, as `ws1 gate` refuses it, never a report whose verdict is BAD INPUT (the control:
    the same plan on real tiers writes one, in the test above)."""
    bad = ["--expect", "portable_cpu:short+longer", *GPU]
    assert main(["report", str(merged), "--out", str(tmp_path), *bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tier 'longer' is not in the manifest" in err
    assert not list(tmp_path.iterdir()), "a refused report wrote files"
