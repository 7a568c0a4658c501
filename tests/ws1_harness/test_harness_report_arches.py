"""The per-arch heatmap (`<stem>.arch-heatmap.png`): one panel per arch side by side, same rows and columns in
every panel, each titled with its arch and its counts; written by `ws1 report` beside the single heatmap only for
a file of two or more arches. Checked on the committed CUDA shards (sm90 and the sm86 proxy, as one commit's pair: `evidence_files.merged_cuda_pair`) and on
small documents, on the grid data and the figure's axes, never on pixels."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from evidence_files import cuda_sm90, merged_cuda_pair

from ws1_harness.cli import main
from ws1_harness.verdict.evidence import load_evidence
from ws1_harness.verdict.report import (
    _BLANK,
    arch_heatmap_figure,
    arch_heatmap_grids,
    arch_heatmap_path,
    arch_panel_title,
    evidence_arches,
    grid_counts,
    heatmap_figure,
    write_report,
)

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return merged_cuda_pair(tmp_path_factory.mktemp("merged"))


@pytest.fixture(scope="module")
def merged_doc(merged: Path) -> dict[str, Any]:
    return load_evidence(merged)


def _flip_one(
    doc: dict[str, Any], arch: str = "sm86-proxy"
) -> tuple[dict[str, Any], tuple[str, str, str, str]]:
    """A copy of `doc` with one green cell of `cuda_bf16@<arch>` made red; and that cell's key."""
    flipped = copy.deepcopy(doc)
    victim = next(
        c for c in flipped["cells"] if c["profile"] == f"cuda_bf16@{arch}" and c["status"] == "green"
    )
    victim["status"], victim["reason_code"] = "red", "bits_differ"
    return flipped, (victim["operator"], victim["tier"], victim["judgment"], arch)


def test_one_arch_writes_no_per_arch_figure(merged: Path, tmp_path: Path) -> None:
    single = load_evidence(cuda_sm90())
    assert evidence_arches(single) == ["sm90"]
    stale = arch_heatmap_path(tmp_path / "single" / "cuda_bf16.sm90.heatmap.png")
    stale.parent.mkdir()
    stale.write_bytes(b"an older run's figure")  # it would describe other cells: the report removes it
    md, png = write_report(cuda_sm90(), tmp_path / "single")
    assert md.is_file() and png.read_bytes()[:8] == PNG  # the single heatmap as before
    assert arch_heatmap_path(png) == stale and not stale.exists()
    assert sorted(p.name for p in png.parent.iterdir()) == [
        "cuda_bf16.sm90.heatmap.png",
        "cuda_bf16.sm90.report.md",
    ]
    with pytest.raises(ValueError, match="two or more arches"):
        arch_heatmap_figure(single)
    # negative control: the merge of both arches, through the same code path, does write it
    _, both = write_report(merged, tmp_path / "both")
    assert arch_heatmap_path(both).read_bytes()[:8] == PNG


def test_a_cpu_profile_is_the_cpu_panel() -> None:
    doc = {"axes": {"profiles": ["portable_cpu", "cuda_bf16@sm90"]}}
    assert evidence_arches(doc) == ["sm90", "cpu"]  # the CPU shard's profile carries no arch: its own panel
    doc["axes"]["profiles"] = ["cuda_bf16@sm90"]  # negative control: without it, one arch, no per-arch figure
    assert evidence_arches(doc) == ["sm90"]
    doc["axes"]["profiles"].append("triton_cuda_bf16@sm86-proxy")
    assert evidence_arches(doc) == ["sm86-proxy", "sm90"]


def test_two_arches_give_two_panels_titled_by_arch(
    merged: Path, merged_doc: dict[str, Any], tmp_path: Path
) -> None:
    fig = arch_heatmap_figure(merged_doc, "merged.json: PASS")
    panels = fig.axes
    assert len(panels) == 2
    titles = [a.get_title() for a in panels]
    assert titles[0].startswith("sm86-proxy: ") and titles[1].startswith("sm90: ")
    arches, rows, cols, grids = arch_heatmap_grids(merged_doc)
    for arch, title in zip(arches, titles, strict=True):
        assert title == arch_panel_title(arch, grids[arch])
        counts = grid_counts(grids[arch])
        assert f"{sum(counts.values())} cells" in title and f"{counts['green']} green" in title
    # the same rows and columns, in the same order, in every panel; the row labels once, on the left
    assert all(len(g) == len(rows) and all(len(r) == len(cols) for r in g) for g in grids.values())
    assert all(a.get_ylim() == panels[0].get_ylim() and a.get_xlim() == panels[0].get_xlim() for a in panels)
    assert [t.get_text() for t in panels[0].get_yticklabels()] == [f"{p} / {o}" for p, o in rows]
    assert panels[1].get_yticklabels() == []  # hidden beside the first panel
    assert rows[0][0] == "cuda_bf16"  # the profile without its arch: one row set shared by the panels
    # negative control: the single heatmap of the same file is one panel
    assert len(heatmap_figure(merged_doc, "t").axes) == 1
    # `ws1 report` writes it beside the JSON's report and names it
    out = tmp_path / "rep"
    assert main(["report", str(merged), "--out", str(out)]) == 0
    written = out / "merged.arch-heatmap.png"
    assert written.read_bytes()[:8] == PNG and (out / "merged.heatmap.png").is_file()


def test_a_flipped_cell_differs_between_the_panels(merged_doc: dict[str, Any]) -> None:
    arches, rows, cols, grids = arch_heatmap_grids(merged_doc)
    # negative control: the committed shards agree on every cell, so the two panels' grids are equal
    assert grids["sm86-proxy"] == grids["sm90"]
    flipped, (op, tier, judgment, arch) = _flip_one(merged_doc)
    _, rows2, cols2, grids2 = arch_heatmap_grids(flipped)
    assert (rows2, cols2) == (rows, cols)  # a flipped cell moves nothing
    y, x = rows.index(("cuda_bf16", op)), cols.index((tier, judgment))
    assert grids2["sm86-proxy"][y][x] == "red" and grids2["sm90"][y][x] == "green"
    differ = [
        (yy, xx)
        for yy, row in enumerate(grids2["sm86-proxy"])
        for xx, st in enumerate(row)
        if st != grids2["sm90"][yy][xx]
    ]
    assert differ == [(y, x)]
    assert grid_counts(grids2["sm86-proxy"])["red"] == grid_counts(grids2["sm90"])["red"] + 1
    titles = [a.get_title() for a in arch_heatmap_figure(flipped).axes]
    assert "✗ 1 red" in titles[0] and "✗ 0 red" in titles[1]


def _doc(profiles: list[str], cells: list[tuple[str, str, str]]) -> dict[str, Any]:
    return {
        "axes": {
            "profiles": profiles,
            "operators": ["silu", "rope"],
            "tiers": ["short"],
            "judgments": ["fa"],
        },
        "cells": [
            {"profile": p, "operator": o, "tier": "short", "judgment": "fa", "status": s, "reason_code": None}
            for p, o, s in cells
        ],
    }


def test_a_profile_an_arch_did_not_run_is_blank_not_missing() -> None:
    doc = _doc(
        ["a@sm90", "b@sm90", "a@sm86", "portable_cpu"],
        [
            ("a@sm90", "silu", "green"),
            ("a@sm90", "rope", "green"),
            ("b@sm90", "silu", "green"),
            ("b@sm90", "rope", "red"),
            ("a@sm86", "silu", "green"),  # a@sm86 / rope absent: missing
            ("portable_cpu", "silu", "green"),
        ],
    )
    arches, rows, cols, grids = arch_heatmap_grids(doc)
    assert arches == ["sm86", "sm90", "cpu"] and cols == [("short", "fa")]
    assert rows == [
        ("a", "silu"), ("a", "rope"), ("b", "silu"), ("b", "rope"), ("portable_cpu", "silu"), ("portable_cpu", "rope")
    ]  # fmt: skip
    assert grids["sm90"] == [["green"], ["green"], ["green"], ["red"], [_BLANK], [_BLANK]]
    # b never ran on sm86: blank, counted for nothing; a's absent cell there is missing (the negative control)
    assert grids["sm86"] == [["green"], ["missing"], [_BLANK], [_BLANK], [_BLANK], [_BLANK]]
    assert grids["cpu"] == [[_BLANK], [_BLANK], [_BLANK], [_BLANK], ["green"], ["missing"]]
    assert grid_counts(grids["sm86"]) == {
        "green": 1,
        "red": 0,
        "error": 0,
        "na": 0,
        "pending_arch": 0,
        "missing": 1,
    }
    fig = arch_heatmap_figure(doc)
    assert [len(a.texts) for a in fig.axes] == [2, 4, 2]  # a glyph per cell, none on a blank place


def test_a_tier_the_plan_leaves_out_is_blank_not_missing() -> None:
    """The CPU shard runs the short tier only here: with its plan the long tier's absent cells are blank; without
    the plan (the control) they are missing. A present cell of a planned-out tier still shows."""
    doc = _doc(["portable_cpu"], [("portable_cpu", "silu", "green")])
    doc["axes"]["tiers"] = ["short", "long"]
    _, _, cols, grids = arch_heatmap_grids(doc)
    assert cols == [("short", "fa"), ("long", "fa")]
    assert grids["cpu"][0] == ["green", "missing"]
    _, _, _, planned = arch_heatmap_grids(doc, {"portable_cpu": ("short",)})
    assert planned["cpu"][0] == ["green", _BLANK] and planned["cpu"][1] == ["missing", _BLANK]
    doc["cells"].append({**doc["cells"][0], "tier": "long", "status": "red"})
    _, _, _, kept = arch_heatmap_grids(doc, {"portable_cpu": ("short",)})
    assert kept["cpu"][0] == ["green", "red"], "a plan hid a present cell"
