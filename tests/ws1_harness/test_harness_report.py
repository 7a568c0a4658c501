"""Markdown table and heatmap: every row and column of the axes appears, missing cells are visible."""

from __future__ import annotations

from pathlib import Path

from ws1_harness.verdict.report import GLYPH, JUDGMENT_SHORT, write_report


def test_report_beside_the_json(factory) -> None:
    synth = factory.Synth()
    expected = synth.expected()
    missing = next(k for k, e in expected.items() if e.required and e.na_reason is None)
    red = next(k for k, e in expected.items() if e.required and e.na_reason is None and k != missing)
    writer, _ = factory.write("rep", factory.Synth(overrides={missing: None, red: ("red", "bits_differ")}))
    md, png = write_report(writer.path)
    assert md.parent == writer.path.parent and png.parent == writer.path.parent
    text = md.read_text()
    assert "ws1 gate: RED" in text and "(exit 1)" in text
    matrix = text.split("## Matrix", 1)[1].split("\n## ", 1)[0]
    table = [line for line in matrix.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(synth.profiles) * len(synth.operators)  # header + one row per (profile, op)
    assert all(line.count("|") == 3 + len(synth.tiers) * len(synth.judgments) for line in table)
    for j in synth.judgments:
        assert JUDGMENT_SHORT[j] in table[0]
    assert GLYPH["missing"] in text and f"{GLYPH['red']} bits_differ" in text and GLYPH["na"] in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_of_a_crashed_run(factory, tmp_path: Path) -> None:
    keys = list(factory.Synth().expected())[:3]
    writer, _ = factory.write("crashed", factory.Synth(only=keys), finalise=False)
    md, png = write_report(writer.partial_path, tmp_path / "rep")
    assert md.name == "crashed.partial.report.md" and png.is_file()  # never the complete file's report
    assert "finalised=false" in md.read_text()


def test_report_lists_where_bits_differ() -> None:
    """A failed invariance comparison shows its layout, tensor, count and first mismatching logical key."""
    from ws1_harness.verdict.report import mismatches

    cell = {
        "profile": "native_torch@sm90",
        "operator": "det_gemm",
        "tier": "primary",
        "judgment": "forward_invariance",
        "layouts": [
            {"layout": "packed_ok", "passed": True, "diagnostics": {}},
            {
                "layout": "split_1",
                "passed": False,
                "diagnostics": {
                    "split_1": {
                        "passed": False,
                        "reason_code": "bits_differ",
                        "diagnostics": {"n_mismatch": 3, "n_total": 10, "first_mismatch_key": [2, 5]},
                    }
                },
            },
        ],
    }
    rows = mismatches({"cells": [cell]})
    assert rows == [
        {
            "profile": "native_torch@sm90",
            "operator": "det_gemm",
            "tier": "primary",
            "judgment": "forward_invariance",
            "layout": "split_1",
            "tensor": "output",
            "reason": "bits_differ",
            "n_mismatch": 3,
            "n_total": 10,
            "first_key": [2, 5],
        }
    ]
    # a gradient comparison is named `<layout>.<tensor>`: the tensor column shows the tensor, not the layout
    grad = cell["layouts"][1]["diagnostics"].pop("split_1")
    cell["layouts"][1]["diagnostics"]["split_1.d_weight"] = grad
    assert [(r["layout"], r["tensor"]) for r in mismatches({"cells": [cell]})] == [("split_1", "d_weight")]
    cell["layouts"][1]["passed"] = True
    assert mismatches({"cells": [cell]}) == []


def _error_synth(factory):
    synth = factory.Synth()
    key = next(k for k, e in synth.expected().items() if e.required and e.na_reason is None)
    return key, factory.Synth(overrides={key: ("error", "exception")})


def test_report_never_prints_python_none(factory) -> None:
    """A CPU run has no driver, no CUDA and no capability: the report once printed `None` for each."""
    from ws1_harness.verdict.evidence import read_evidence
    from ws1_harness.verdict.report import render_markdown

    writer, _ = factory.write("none")
    doc = read_evidence(writer.path)
    doc["provenance"].update(driver=None, cuda=None, capability=None)  # what a CPU-only machine records
    assert "None" not in render_markdown(doc, "none.json")


def test_an_unknown_commit_is_said_plainly(factory, monkeypatch) -> None:
    """The heatmap title once read `file @ unknown: RED`."""
    import ws1_harness.verdict.provenance as prov
    from ws1_harness.verdict.evidence import read_evidence
    from ws1_harness.verdict.report import heatmap_title, render_markdown

    monkeypatch.delenv("WS1_SOURCE_COMMIT", raising=False)
    monkeypatch.setattr(prov.shutil, "which", lambda name: None)  # no git: the commit cannot be known
    writer, _ = factory.write("unknown")
    monkeypatch.undo()
    doc = read_evidence(writer.path)
    assert doc["provenance"]["git_commit"] == "unknown"
    title = heatmap_title(doc, "unknown.json", "RED")
    assert (
        "@ unknown" not in title
        and title == "unknown.json: RED, commit unknown (not run from a git checkout)"
    )
    assert "commit unknown (the code did not run from a git checkout" in render_markdown(doc, "unknown.json")
    monkeypatch.setenv("WS1_SOURCE_COMMIT", "a" * 40)  # the negative control: a known commit is named
    monkeypatch.setenv("WS1_SOURCE_DIRTY", "0")
    known, _ = factory.write("known")
    assert heatmap_title(read_evidence(known.path), "k.json", "PASS") == f"k.json: PASS, commit {'a' * 12}"


def test_an_error_cell_shows_the_candidate_message_and_location(factory) -> None:
    """An error cell once showed only `error:exception`."""
    from ws1_harness.verdict.evidence import cells_digest, read_evidence
    from ws1_harness.verdict.gate import gate
    from ws1_harness.verdict.report import render_markdown

    key, synth = _error_synth(factory)
    writer, _ = factory.write("err", synth)
    doc = read_evidence(writer.path)
    for cell in doc["cells"]:
        if cell["operator"] == key.operator and cell["tier"] == key.tier and cell["judgment"] == key.judgment:
            cell["diagnostics"] = {"why": "ValueError: bad | shape", "at": "my_kernel.py:42"}
    doc["cells_digest"] = cells_digest(doc["cells"])  # what the run would have written with that message
    text = render_markdown(doc, "err.json")
    errors = text.split("## Errors", 1)[1].split("\n## ", 1)[0]
    assert "ValueError: bad \\| shape" in errors and "`my_kernel.py:42`" in errors
    gate_text = "\n".join(gate(doc).lines)
    assert "ValueError: bad | shape (at my_kernel.py:42)" in gate_text


def test_a_merged_report_names_its_shards(factory, tmp_path) -> None:
    from ws1_harness.verdict.merge import merge
    from ws1_harness.verdict.report import render_markdown

    keys = list(factory.Synth().expected())
    a, _ = factory.write("shard_a", factory.Synth(only=keys[:5]))
    b, _ = factory.write("shard_b", factory.Synth(only=keys[5:]))
    text = render_markdown(merge([a.path, b.path]), "all.json")
    shards = text.split("## Shards", 1)[1]
    assert "| 0 | shard_a.json |" in shards and "| 1 | shard_b.json |" in shards
    # the merge's own provenance is labelled as the merging machine's, not read as where the cells ran
    assert "- merged on: device " in text and "- merged on: torch " in text
    single, _ = factory.write("single")  # the negative control: a single run has no shard list
    from ws1_harness.verdict.evidence import read_evidence

    alone = render_markdown(read_evidence(single.path), "single.json")
    assert "## Shards" not in alone
    assert "merged on" not in alone and "\n- device " in alone


def test_heatmap_has_a_glyph_per_cell_counts_in_the_legend_and_outlined_gaps(factory, recwarn) -> None:
    """Red and green once differed only by hue, and missing cells were white on white."""
    from matplotlib.patches import Rectangle

    from ws1_harness.verdict.evidence import read_evidence
    from ws1_harness.verdict.report import ORDER, PLOT_GLYPH, heatmap_figure, status_counts

    synth = factory.Synth()
    expected = synth.expected()
    open_keys = [k for k, e in expected.items() if e.required and e.na_reason is None]
    writer, _ = factory.write(
        "heat", factory.Synth(overrides={open_keys[0]: None, open_keys[1]: ("red", "bits_differ")})
    )
    doc = read_evidence(writer.path)
    counts = status_counts(doc)
    assert counts["missing"] == 1 and counts["red"] == 1 and sum(counts.values()) == len(expected)
    fig = heatmap_figure(doc, "t")
    axis = fig.axes[0]
    glyphs = [t.get_text() for t in axis.texts]
    assert len(glyphs) == len(expected)  # one glyph in every cell
    assert glyphs.count(PLOT_GLYPH["red"]) == 1 and glyphs.count(PLOT_GLYPH["missing"]) == 1
    assert len(set(PLOT_GLYPH.values())) == len(ORDER)  # the glyph alone tells every status apart
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [f"{PLOT_GLYPH[s]} {s} ({counts[s]})" for s in ORDER]
    hatched = [p for p in axis.patches if isinstance(p, Rectangle) and p.get_hatch()]
    assert len(hatched) == counts["missing"]

    fig.savefig(writer.path.parent / "heat.png")
    assert not [w for w in recwarn if "Glyph" in str(w.message)]  # every glyph exists in the font


def _accuracy_cell(op: str, judgment: str, status: str, ratio: float | None, max_abs: float) -> dict:
    diag = {"atol": 0.01, "rtol": 0.0, "max_abs": max_abs}
    if ratio is not None:
        diag["max_rule_ratio"] = ratio
    return {
        "profile": "p",
        "operator": op,
        "tier": "short",
        "judgment": judgment,
        "status": status,
        "diagnostics": {"output": {"passed": status == "green", "diagnostics": diag}},
    }


def test_accuracy_margins_rank_by_the_rule_and_skip_invariance() -> None:
    """A green cell once showed no margin: the report ranks accuracy comparisons by how close they came."""
    from ws1_harness.verdict.report import accuracy_margins

    doc = {
        "cells": [
            _accuracy_cell("silu", "forward_accuracy", "green", 0.2, 0.002),
            _accuracy_cell("rope", "gradient_accuracy", "green", 0.9, 0.009),
            _accuracy_cell("attention", "forward_invariance", "red", 5.0, 1.0),  # not an accuracy judgment
            _accuracy_cell(
                "embedding", "forward_accuracy", "green", None, 0.005
            ),  # older file: max_abs / atol
        ]
    }
    rows = accuracy_margins(doc)
    assert [(r["operator"], round(r["ratio"], 2), r["of_rule"]) for r in rows] == [
        ("rope", 0.9, True),
        ("embedding", 0.5, False),
        ("silu", 0.2, True),
    ]


def test_comparison_records_how_close_it_came_to_the_rule(forward_spec) -> None:
    import torch

    from ws1_harness.run.compare import tolerance_check

    ref = torch.tensor([1.0, 2.0, -4.0, 0.5])
    bound = forward_spec.atol + forward_spec.rtol * ref.abs()
    cand = (ref + bound * torch.tensor([0.0, 0.5, -0.75, 0.25])).to(torch.bfloat16)
    got = tolerance_check(cand, ref, forward_spec).diagnostics["max_rule_ratio"]
    want = float(((cand.float() - ref).abs() / bound).max())
    assert abs(got - want) < 1e-6 and got < 1.0


def test_heatmap_draws_chain_cells() -> None:
    """A chain-only file once drew an empty frame, and chain cells never appeared in a heatmap."""
    from ws1_harness.verdict.report import _heatmap_grid

    doc = {
        "axes": {"profiles": [], "operators": [], "tiers": [], "judgments": []},
        "cells": [],
        "chain_cells": [
            {"profile": "portable_cpu", "model": "tiny", "layers": 2, "tier": "short", "status": "green"},
            {"profile": "portable_cpu", "model": "tiny", "layers": 2, "tier": "primary", "status": "red"},
        ],
    }
    rows, cols, statuses = _heatmap_grid(doc)
    assert rows == [("portable_cpu", "chain tiny L2")]
    assert cols == [("short", "chain"), ("primary", "chain")]
    assert statuses == [["green", "red"]]


def test_heatmap_title_says_reduced(factory, monkeypatch) -> None:
    """The PNG title once said "PASS" where the gate line said "PASS (reduced: ...)"."""
    from ws1_harness.verdict import report

    titles: list[str] = []
    monkeypatch.setattr(report, "render_heatmap", lambda doc, png, title: titles.append(title) or png)
    writer, _ = factory.write("reduced")
    report.write_report(writer.path)
    line = report.gate(writer.path).lines[0]
    assert ("reduced" in line) == ("reduced" in titles[0]), (line, titles)
    assert "reduced" in titles[0]
