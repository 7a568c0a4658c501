"""Evidence files: schema round trip, crash-safe partial files, refusals (empty, truncated, overwritten or
in-checkout files)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ws1_harness.verdict.cells import Cell, CellKey
from ws1_harness.verdict.evidence import (
    SCHEMA_VERSION,
    EvidenceError,
    EvidenceWriter,
    counts_of,
    load_evidence,
    partial_path_for,
    read_evidence,
)
from ws1_harness.verdict.gate import gate


def test_round_trip_through_the_schema(factory) -> None:
    writer, expected = factory.write("run")
    doc = load_evidence(writer.path)
    assert doc["finalised"] is True
    assert doc["schema_version"] == SCHEMA_VERSION
    assert [Cell.from_json(c).key for c in doc["cells"]] == list(expected)
    assert doc["counts"]["total"] == len(expected) == len(doc["cells"])
    assert doc["counts"]["green"] + doc["counts"]["na"] == len(expected)
    assert doc["provenance"]["git_commit"]  # collected by the writer, never passed in
    assert not writer.partial_path.exists()
    assert gate(writer.path).exit_code == 0


def test_partial_file_survives_a_crash(factory) -> None:
    synth = factory.Synth()
    two = list(synth.expected())[:2]
    writer, _ = factory.write("crash", factory.Synth(only=two), finalise=False)
    assert not writer.path.exists()
    doc = read_evidence(writer.partial_path)
    assert doc["finalised"] is False
    assert [Cell.from_json(c).key for c in doc["cells"]] == two
    with pytest.raises(EvidenceError, match="not finalised"):
        load_evidence(writer.partial_path)
    result = gate(writer.partial_path)
    assert result.exit_code == 1
    assert any(p.code == "not_finalised" for p in result.problems)
    # A crash in the middle of a line: bad input for the gate, still readable for a report.
    text = writer.partial_path.read_text()
    writer.partial_path.write_text(text[:-15])
    assert gate(writer.partial_path).exit_code == 2
    assert len(read_evidence(writer.partial_path, tolerate_torn_tail=True)["cells"]) == 1


def test_existing_final_file_is_refused_without_force(factory) -> None:
    writer, _ = factory.write("stale")
    before = writer.path.read_bytes()
    with pytest.raises(EvidenceError, match="--force"):
        factory.write("stale", finalise=False)
    assert writer.path.read_bytes() == before


def test_forced_writer_keeps_the_final_file_until_it_finalises(factory) -> None:
    """A run once deleted the complete file at start-up; with --force it is replaced only by finalise()."""
    writer, _ = factory.write("kept")
    before = writer.path.read_bytes()
    again = EvidenceWriter(writer.path, writer.header, force=True)
    assert writer.path.read_bytes() == before and partial_path_for(writer.path).exists()
    again.close()
    assert writer.path.read_bytes() == before  # interrupted: nothing complete was touched


def test_writer_refuses_duplicate_and_foreign_cells(factory) -> None:
    writer, expected = factory.write("dup", finalise=False)
    key = next(iter(expected))
    writer2 = EvidenceWriter(factory.dir / "dup2.json", writer.header)
    cell = Cell(key, "green", None, True)
    writer2.write_cell(cell)
    with pytest.raises(EvidenceError, match="twice"):
        writer2.write_cell(cell)
    with pytest.raises(EvidenceError, match="outside the axes"):
        writer2.write_cell(
            Cell(CellKey("other_profile", key.operator, key.tier, key.judgment), "green", None, True)
        )
    writer2.finalise()
    with pytest.raises(EvidenceError, match="already finalised"):
        writer2.write_cell(cell)


def test_non_finite_diagnostics_are_written_as_strings(factory) -> None:
    writer, expected = factory.write("nan", finalise=False)
    writer2 = EvidenceWriter(factory.dir / "nan2.json", writer.header)
    diag = {"max_abs": float("inf"), "max_rel": float("nan"), "per_layout": {"padded": float("-inf")}}
    writer2.write_cell(Cell(next(iter(expected)), "red", "tolerance_exceeded", True, diag))
    doc = load_evidence(writer2.finalise())
    assert doc["cells"][0]["diagnostics"] == {
        "max_abs": "inf",
        "max_rel": "nan",
        "per_layout": {"padded": "-inf"},
    }


def _edit(path: Path, fn) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("mutation", "message"),
    [
        (lambda d: d["counts"].__setitem__("green", d["counts"]["green"] + 1), "counts"),
        (lambda d: d["cells"].append(dict(d["cells"][0])), "counts"),
        (
            lambda d: (
                d["cells"].append(dict(d["cells"][0])),
                d.__setitem__("counts", counts_of(d["cells"])),
            ),
            "duplicate",
        ),
        (lambda d: d["workload"].__setitem__("revision", 7), "revision"),
        (lambda d: d.pop("provenance"), "provenance"),
        (lambda d: d.__setitem__("schema_version", SCHEMA_VERSION + 1), "schema_version"),
        (lambda d: d.__setitem__("extra", 1), "extra"),
        (lambda d: d["cells"][0].__setitem__("reason_code", "made_up"), "reason_code"),
    ],
)
def test_reader_rejects_inconsistent_files(factory, mutation, message: str) -> None:
    writer, _ = factory.write("bad")
    _edit(writer.path, mutation)
    with pytest.raises(EvidenceError, match=message):
        load_evidence(writer.path)


def test_refuses_to_write_inside_a_checkout(factory, tmp_path: Path) -> None:
    if subprocess.run(["git", "--version"], capture_output=True).returncode != 0:
        pytest.skip("git not installed")
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("/ignored/\n")
    writer, _ = factory.write("hdr", finalise=False)
    with pytest.raises(EvidenceError, match="inside the git checkout"):
        EvidenceWriter(repo / "out" / "ev.json", writer.header)
    EvidenceWriter(repo / "ignored" / "ev.json", writer.header).close()
    EvidenceWriter(repo / "out" / "ev.json", writer.header, allow_in_checkout=True).close()


def test_only_the_judged_plugins_are_recorded() -> None:
    """A process may have loaded plug-ins it does not judge (a test session did): their records stay out, so a
    file's provenance does not depend on what else ran in its process. Control: a judged plug-in is kept."""
    from ws1_harness.verdict.evidence import _judged_plugins

    entry = {"profile": "mine", "module": "m", "file": "m.py", "sha256": None}
    other = {"profile": "theirs", "module": "t", "file": "t.py", "sha256": None}
    kept = _judged_plugins({"plugins": [entry, other]}, {"axes": {"profiles": ["mine@sm90"]}})
    assert kept["plugins"] == [entry]
    none = _judged_plugins({"plugins": [entry, other]}, {"axes": {"profiles": ["portable_cpu"]}})
    assert none["plugins"] == []


def test_an_older_evidence_version_is_refused_by_its_version(factory) -> None:
    """A schema-3 file (no `cells_digest` yet) is refused with one line naming the version, not the first field
    the schema happens to miss; the gate says so as bad input (exit 2)."""
    writer, _ = factory.write("old")
    _edit(writer.path, lambda d: (d.__setitem__("schema_version", 3), d.pop("cells_digest")))
    with pytest.raises(
        EvidenceError, match=rf"schema_version 3; this ws1 reads version {SCHEMA_VERSION} only"
    ):
        load_evidence(writer.path)
    result = gate(writer.path)
    assert result.exit_code == 2 and "schema_version 3" in result.lines[0]
