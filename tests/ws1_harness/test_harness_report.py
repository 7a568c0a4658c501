"""Markdown table and heatmap: every row and column of the axes appears, missing cells are visible."""

from __future__ import annotations

from pathlib import Path

from ws1_harness.report import GLYPH, JUDGMENT_SHORT, write_report


def test_report_beside_the_json(factory) -> None:
    synth = factory.Synth()
    expected = synth.expected()
    missing = next(k for k, e in expected.items() if e.required and e.na_reason is None)
    red = next(k for k, e in expected.items() if e.required and e.na_reason is None and k != missing)
    writer, _ = factory.write("rep", factory.Synth(overrides={missing: None, red: ("red", "bits_differ")}))
    md, png = write_report(writer.path)
    assert md.parent == writer.path.parent and png.parent == writer.path.parent
    text = md.read_text()
    assert "RED (exit 1)" in text
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
    assert md.name == "crashed.report.md" and png.is_file()
    assert "finalised=false" in md.read_text()


def test_report_lists_where_bits_differ() -> None:
    """A failed invariance comparison shows its layout, tensor, count and first mismatching logical key."""
    from ws1_harness.report import mismatches

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
            "tensor": "split_1",
            "reason": "bits_differ",
            "n_mismatch": 3,
            "n_total": 10,
            "first_key": [2, 5],
        }
    ]
    cell["layouts"][1]["passed"] = True
    assert mismatches({"cells": [cell]}) == []
