"""Gate exit codes for every way evidence can be wrong: empty or truncated files, a failing verdict kind that
went uncounted, hard-coded cell counts. Counts come from the axes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ws1_harness.verdict.gate import EXIT_BAD_INPUT, EXIT_PASS, EXIT_PENDING, EXIT_RED, gate


def _first(expected, *, na: bool | None = None, required: bool | None = None):
    """The first expected key matching the filters."""
    for key, exp in expected.items():
        if na is not None and (exp.na_reason is not None) != na:
            continue
        if required is not None and exp.required != required:
            continue
        return key
    raise AssertionError("no such cell in the synthetic axes")


def _codes(result) -> set[str]:
    return {p.code for p in result.problems}


def test_complete_green_matrix_passes(factory) -> None:
    writer, expected = factory.write("green")
    result = gate(writer.path)
    assert result.exit_code == EXIT_PASS, result.lines
    assert f"expected={len(expected)}" in result.lines[2]
    n_green = sum(1 for e in expected.values() if e.na_reason is None and e.required)
    assert f"green_required={n_green}" in result.lines[2]


def test_empty_file_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "e.json").write_text("")
    assert gate(tmp_path / "e.json").exit_code == EXIT_BAD_INPUT


def test_missing_file_is_bad_input(tmp_path: Path) -> None:
    result = gate(tmp_path / "nope.json")
    assert result.exit_code == EXIT_BAD_INPUT and len(result.lines) == 1


def test_truncated_file_is_bad_input(factory) -> None:
    writer, _ = factory.write("trunc")
    text = writer.path.read_text()
    writer.path.write_text(text[: len(text) // 2])
    assert gate(writer.path).exit_code == EXIT_BAD_INPUT


def test_empty_object_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "o.json").write_text("{}")
    assert gate(tmp_path / "o.json").exit_code == EXIT_BAD_INPUT


@pytest.mark.parametrize(
    "field", ["cells", "counts", "axes", "provenance", "finalised", "contract", "workload"]
)
def test_missing_field_is_bad_input(factory, field: str) -> None:
    writer, _ = factory.write("missing_" + field)
    doc = json.loads(writer.path.read_text())
    doc.pop(field)
    writer.path.write_text(json.dumps(doc))
    result = gate(writer.path)
    assert result.exit_code == EXIT_BAD_INPUT
    assert field in result.lines[0]


def test_missing_required_cell_is_red(factory) -> None:
    expected = factory.Synth().expected()
    key = _first(expected, na=False, required=True)
    writer, _ = factory.write("missing", factory.Synth(overrides={key: None}))
    result = gate(writer.path)
    assert result.exit_code == EXIT_RED
    assert "not_run" in _codes(result) and key.label() in "\n".join(result.lines)


def test_missing_optional_cell_is_allowed(factory) -> None:
    expected = factory.Synth().expected()
    optional = [k for k, e in expected.items() if not e.required]
    assert optional
    writer, _ = factory.write("optional", factory.Synth(overrides={k: None for k in optional}))
    result = gate(writer.path)
    assert result.exit_code == EXIT_PASS, result.lines
    assert f"optional_absent={len(optional)}" in result.lines[2]


def test_extra_cell_is_red(factory) -> None:
    writer, expected = factory.write("extra")
    synth = factory.Synth()
    # The same run judged against a narrower expected set: every cell outside it is extra.
    narrower = factory.Synth(tiers=synth.tiers[:1]).expected()
    result = gate(writer.path, expected_cells=narrower)
    assert result.exit_code == EXIT_RED
    n_extra = sum(p.code == "extra_cell" for p in result.problems)
    assert n_extra == len(expected) - len(narrower)


def test_unexplained_na_is_red(factory) -> None:
    expected = factory.Synth().expected()
    key = _first(expected, na=False, required=True)
    for reason in ("layout_only", "optional_not_provided", "not_differentiable"):
        writer, _ = factory.write("na_" + reason, factory.Synth(overrides={key: ("na", reason)}))
        result = gate(writer.path)
        assert result.exit_code == EXIT_RED, reason
        assert "unexplained_na" in _codes(result)


def test_layout_only_cell_reported_green_is_red(factory) -> None:
    expected = factory.Synth().expected()
    key = _first(expected, na=True)
    writer, _ = factory.write("na_green", factory.Synth(overrides={key: ("green", None)}))
    result = gate(writer.path)
    assert result.exit_code == EXIT_RED and "expected_na" in _codes(result)


def test_optional_not_provided_is_explained_for_optional_cells(factory) -> None:
    expected = factory.Synth().expected()
    key = _first(expected, na=False, required=False)
    writer, _ = factory.write("opt_na", factory.Synth(overrides={key: ("na", "optional_not_provided")}))
    assert gate(writer.path).exit_code == EXIT_PASS


@pytest.mark.parametrize(
    ("status", "reason"), [("red", "bits_differ"), ("red", "timeout"), ("error", "exception")]
)
def test_red_and_error_cells_are_red(factory, status: str, reason: str) -> None:
    expected = factory.Synth().expected()
    for required in (True, False):
        key = _first(expected, na=False, required=required)
        writer, _ = factory.write(
            f"{status}_{reason}_{required}", factory.Synth(overrides={key: (status, reason)})
        )
        result = gate(writer.path, allow_pending_arch=True)
        assert result.exit_code == EXIT_RED
        assert status in _codes(result)


def test_pending_arch_with_and_without_allow(factory) -> None:
    expected = factory.Synth().expected()
    key = _first(expected, na=False, required=True)
    writer, _ = factory.write("pending", factory.Synth(overrides={key: ("pending_arch", "arch_unavailable")}))
    assert gate(writer.path).exit_code == EXIT_PENDING
    assert gate(writer.path, allow_pending_arch=True).exit_code == EXIT_PASS


def test_pending_with_red_is_red(factory) -> None:
    expected = factory.Synth().expected()
    keys = [k for k, e in expected.items() if e.na_reason is None and e.required][:2]
    overrides = {keys[0]: ("pending_arch", "arch_unavailable"), keys[1]: ("red", "bits_differ")}
    writer, _ = factory.write("pending_red", factory.Synth(overrides=overrides))
    assert gate(writer.path).exit_code == EXIT_RED


def test_all_pending_is_red_for_lack_of_green_when_allowed(factory) -> None:
    expected = factory.Synth().expected()
    overrides = {k: ("pending_arch", "arch_unavailable") for k, e in expected.items() if e.na_reason is None}
    writer, _ = factory.write("all_pending", factory.Synth(overrides=overrides))
    assert gate(writer.path).exit_code == EXIT_RED  # zero green required cells: an empty run never passes
    result = gate(writer.path, allow_pending_arch=True)
    assert result.exit_code == EXIT_RED and "no_green" in _codes(result)


def test_zero_green_is_red(factory) -> None:
    # Only layout-only operators: every cell is an explained na, nothing was executed.
    synth = factory.Synth(operators=("pack",))
    writer, expected = factory.write("zero_green", synth)
    assert expected and all(e.na_reason for e in expected.values())
    result = gate(writer.path)
    assert result.exit_code == EXIT_RED and "no_green" in _codes(result)


def test_empty_axes_are_red(factory) -> None:
    writer, expected = factory.write("empty_axes", factory.Synth(profiles=()))
    assert expected == {}
    result = gate(writer.path)
    assert result.exit_code == EXIT_RED and "no_green" in _codes(result)


def test_not_finalised_is_red(factory) -> None:
    writer, _ = factory.write("partial", finalise=False)  # every cell written, finalise never called
    result = gate(writer.partial_path)
    assert result.exit_code == EXIT_RED and "not_finalised" in _codes(result)


def test_finalised_flag_forged_false_is_red(factory) -> None:
    writer, _ = factory.write("forged")
    doc = json.loads(writer.path.read_text())
    doc["finalised"] = False
    writer.path.write_text(json.dumps(doc))
    assert gate(writer.path).exit_code == EXIT_RED


def test_commit_and_clean_checks(factory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WS1_SOURCE_COMMIT", "b" * 40)
    monkeypatch.setenv("WS1_SOURCE_DIRTY", "1")
    writer, _ = factory.write("commit")
    assert gate(writer.path).exit_code == EXIT_PASS
    assert gate(writer.path, expect_commit="b" * 40).exit_code == EXIT_PASS
    result = gate(writer.path, expect_commit="c" * 40)
    assert result.exit_code == EXIT_RED and "commit_mismatch" in _codes(result)
    result = gate(writer.path, require_clean=True)
    assert result.exit_code == EXIT_RED and "dirty_tree" in _codes(result)


def test_gate_accepts_a_loaded_document(factory) -> None:
    writer, _ = factory.write("doc")
    doc = json.loads(writer.path.read_text())
    assert gate(doc).exit_code == EXIT_PASS
    doc["cells"] = []
    assert gate(doc).exit_code == EXIT_BAD_INPUT  # counts no longer match


def test_gate_red_when_inventory_is_missing(factory) -> None:
    writer, _ = factory.write("noinv", factory.Synth(inventory=False))
    result = gate(writer.path)
    assert result.exit_code == 1
    assert any(p.code == "inventory_missing" for p in result.problems)


@pytest.mark.parametrize("verdict", ["fail", "not_run"])
def test_gate_red_on_any_open_inventory_verdict(factory, verdict: str) -> None:
    writer, _ = factory.write("openinv", factory.Synth(inventory_verdicts={"dtype_cast": verdict}))
    result = gate(writer.path)
    assert result.exit_code == 1
    assert [p.code for p in result.problems] == ["inventory_open"]


def test_gate_rederives_node_items_from_cells(factory, monkeypatch) -> None:
    """A red rope cell fails the rope inventory item even though no stored entry says so: every failing kind counts."""
    from ws1_harness.verdict.cells import CellKey

    spec = {"op_class": "elementwise", "differentiable": True, "optional": False, "layout_only": False}
    monkeypatch.setitem(factory.operator_specs, "rope", spec)  # the very dict the synthetic writer reads
    key = CellKey("portable_cpu", "rope", "short", "gradient_invariance")
    synth = factory.Synth(operators=("rms_norm", "rope"), overrides={key: ("red", "bits_differ")})
    writer, _ = factory.write("noderope", synth)
    result = gate(writer.path)
    codes = sorted(p.code for p in result.problems)
    assert codes == ["inventory_open", "red"]


def _node_entry(doc, item: str = "silu") -> dict:
    return next(e for e in doc["inventory"] if e["item"] == item)


def test_a_deleted_node_inventory_entry_is_red(factory) -> None:
    """The cells carry a digest and the inventory does not: a node item's entry must be the one its cells give,
    so deleting it (the gate would otherwise re-derive it and pass) is red."""
    writer, _ = factory.write("delnode")
    doc = json.loads(writer.path.read_text())
    assert gate(doc).exit_code == EXIT_PASS  # the control: as written
    doc["inventory"].remove(_node_entry(doc))
    result = gate(doc)
    assert result.exit_code == EXIT_RED and _codes(result) == {"inventory_mismatch"}


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda e: e.update(profile="other_profile"), id="moved-to-another-profile"),
        pytest.param(lambda e: e.update(verdict="fail"), id="verdict"),
        pytest.param(lambda e: e.update(detail="edited"), id="detail"),
    ],
)
def test_an_edited_node_inventory_entry_is_red(factory, edit) -> None:
    writer, _ = factory.write("editnode")
    doc = json.loads(writer.path.read_text())
    edit(_node_entry(doc))
    result = gate(doc)
    assert result.exit_code == EXIT_RED and "inventory_mismatch" in _codes(result)


def test_a_stored_pass_over_a_red_node_cell_is_red_twice(factory, monkeypatch) -> None:
    """A node entry rewritten to `pass` over a red cell: the stored entry contradicts the cells, and the derived
    verdict is open."""
    from ws1_harness.verdict.cells import CellKey

    spec = {"op_class": "elementwise", "differentiable": True, "optional": False, "layout_only": False}
    monkeypatch.setitem(factory.operator_specs, "rope", spec)
    key = CellKey("portable_cpu", "rope", "short", "gradient_invariance")
    synth = factory.Synth(operators=("rms_norm", "rope"), overrides={key: ("red", "bits_differ")})
    writer, _ = factory.write("passoverred", synth)
    doc = json.loads(writer.path.read_text())
    _node_entry(doc, "rope").update(verdict="pass", detail="4 cells green")
    codes = sorted(p.code for p in gate(doc).problems)
    assert codes == ["inventory_mismatch", "inventory_open", "red"]
