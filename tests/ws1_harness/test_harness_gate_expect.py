"""`ws1 gate --expect PROFILE@ARCH` and the environments it prints, on the committed CUDA shards (sm90 and the sm86
proxy of one commit): a merge that lost a shard cannot pass on the shards it kept, and the gate names what differs
between the shards' environments."""

from __future__ import annotations

from pathlib import Path

import pytest
from evidence_files import cuda_sm90, current_set, merged_cuda_pair

from ws1_harness.cli import main
from ws1_harness.verdict.environments import differences, environment_lines
from ws1_harness.verdict.evidence import load_evidence

BOTH = ["--expect", "cuda_bf16@sm90", "--expect", "cuda_bf16@sm86-proxy"]


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return merged_cuda_pair(tmp_path_factory.mktemp("merged"))


def test_the_merge_of_both_shards_passes_with_both_expected(
    merged: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["gate", "--full", *BOTH, str(merged)]) == 0
    out = capsys.readouterr().out
    assert "differ: code_objects: 90/90" in out and "90/86" in out


def test_a_lost_shard_is_red_when_expected(capsys: pytest.CaptureFixture) -> None:
    assert main(["gate", "--full", str(cuda_sm90())]) == 0  # control: alone it passes
    assert main(["gate", "--full", *BOTH, str(cuda_sm90())]) == 1
    assert "--expect cuda_bf16@sm86-proxy: no shard holds it" in capsys.readouterr().out
    # a CPU shard's profile carries no arch: a bare name is a valid expectation, and this file lacks it
    assert main(["gate", "--expect", "portable_cpu", str(cuda_sm90())]) == 1


def test_a_malformed_expectation_is_bad_input(capsys: pytest.CaptureFixture) -> None:
    assert main(["gate", "--expect", "cuda_bf16@", str(cuda_sm90())]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not profile@arch" in err


def test_environments_name_each_shard_and_only_real_differences(merged: Path) -> None:
    doc = load_evidence(merged)
    lines = environment_lines(doc)
    shards = len(current_set("cuda_bf16", "sm90").files) + len(current_set("cuda_bf16", "sm86-proxy").files)
    assert lines[0] == "environments:" and sum(line.startswith("  cuda_bf16.") for line in lines) == shards
    same = [
        ("a.json", {"torch": "2.11.0", "code_objects": []}),
        ("b.json", {"torch": "2.11.0", "code_objects": []}),
    ]
    assert differences(same) == []  # negative control: equal environments report nothing
    other = [same[0], ("b.json", {"torch": "2.13.0", "code_objects": []})]
    assert differences(other) == ["  differ: torch: 2.11.0 (a.json); 2.13.0 (b.json)"]


def test_the_report_says_where_the_arches_disagree(merged: Path) -> None:
    from ws1_harness.verdict.report import arch_disagreements, render_markdown

    doc = load_evidence(merged)
    multi, cells = arch_disagreements(doc)
    assert multi == {"cuda_bf16": ["sm86-proxy", "sm90"]} and cells == []
    assert "`cuda_bf16` on sm86-proxy, sm90: every cell agrees" in render_markdown(doc, "m.json")
    # negative control: one cell red on one arch only is listed, with both statuses
    flipped = dict(doc)
    flipped["cells"] = [dict(c) for c in doc["cells"]]
    victim = next(
        c for c in flipped["cells"] if c["profile"] == "cuda_bf16@sm86-proxy" and c["status"] == "green"
    )
    victim["status"] = "red"
    _, cells = arch_disagreements(flipped)
    assert len(cells) == 1 and cells[0]["statuses"] == {"sm86-proxy": "red", "sm90": "green"}


def test_an_arch_less_shard_is_the_cpu_panel_in_the_disagreements_as_in_the_heatmap() -> None:
    from ws1_harness.verdict.report import CPU_PANEL, arch_disagreements, panel_of

    cell = {"operator": "det_gemm", "tier": "short", "judgment": "forward_accuracy"}
    doc = {
        "axes": {"profiles": ["native_torch", "native_torch@sm90"]},
        "cells": [
            {**cell, "profile": "native_torch", "status": "green"},
            {**cell, "profile": "native_torch@sm90", "status": "red"},
        ],
    }
    multi, cells = arch_disagreements(doc)
    assert multi == {"native_torch": sorted([CPU_PANEL, "sm90"])}
    assert cells[0]["statuses"] == {CPU_PANEL: "green", "sm90": "red"}
    assert panel_of("native_torch") == ("native_torch", CPU_PANEL)  # the heatmap's own name for that panel
