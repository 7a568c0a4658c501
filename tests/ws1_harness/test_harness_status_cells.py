"""Status/reason registry, cell records, and the expected cell set derived from the axes (never a
hard-coded count)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from ws1_harness.verdict.cells import Cell, CellError, CellKey, LayoutResult, expected_cells
from ws1_harness.verdict.status import NA_REASONS, REASONS, CellStatus, StatusError, check_status_reason

ROOT = Path(__file__).resolve().parents[2]


def test_schema_enumerates_exactly_the_registered_reasons() -> None:
    schema = json.loads((ROOT / "contracts" / "evidence.schema.json").read_text())
    assert set(schema["$defs"]["reason_code"]["enum"]) == set(REASONS)
    assert set(schema["$defs"]["cell"]["properties"]["status"]["enum"]) == {s.value for s in CellStatus}


def test_na_needs_an_explaining_reason() -> None:
    assert {"layout_only", "not_differentiable", "optional_not_provided"} == NA_REASONS
    for reason in NA_REASONS:
        check_status_reason("na", reason)
    for bad in (None, "bits_differ", "exception", "made_up"):
        with pytest.raises(StatusError):
            check_status_reason("na", bad)


def test_status_reason_pairs() -> None:
    check_status_reason("green", None)
    with pytest.raises(StatusError):
        check_status_reason("green", "bits_differ")
    for status in ("red", "error", "pending_arch"):
        with pytest.raises(StatusError):
            check_status_reason(status, None)
    check_status_reason("red", "timeout")
    check_status_reason("pending_arch", "arch_unavailable")
    with pytest.raises(StatusError):
        check_status_reason("pending_arch", "bits_differ")
    with pytest.raises(StatusError):
        check_status_reason("red", "layout_only")


def test_expected_cells_is_the_product_of_the_axes(factory) -> None:
    synth = factory.Synth()
    exp = synth.expected()
    axes = (synth.profiles, synth.operators, synth.tiers, synth.judgments)
    assert set(exp) == {CellKey(*k) for k in itertools.product(*axes)}
    for key, cell in exp.items():
        spec = factory.operator_specs[key.operator]
        assert cell.required is (not spec["optional"])
        if spec["layout_only"]:
            assert cell.na_reason == "layout_only"
        elif key.judgment.startswith("gradient") and not spec["differentiable"]:
            assert cell.na_reason == "not_differentiable"
        else:
            assert cell.na_reason is None


def test_expected_cells_refuses_unknown_operator_and_duplicates(factory) -> None:
    with pytest.raises(CellError):
        expected_cells(["p"], ["no_such_op"], ["short"], factory.judgments, factory.operator_specs)
    with pytest.raises(CellError):
        expected_cells(["p", "p"], ["rms_norm"], ["short"], factory.judgments, factory.operator_specs)


def test_cell_round_trip_and_validation() -> None:
    key = CellKey("portable_cpu", "rms_norm", "short", "forward_invariance")
    cell = Cell(
        key,
        CellStatus.RED,
        "bits_differ",
        True,
        {"n_mismatch": 3},
        ("k1",),
        ("aten.mm",),
        0.5,
        (LayoutResult("padded_left", False, "bits_differ", {"n_mismatch": 3}),),
    )
    assert Cell.from_json(json.loads(json.dumps(cell.to_json()))) == cell
    with pytest.raises(CellError):
        Cell(key, "na", None, True)
    with pytest.raises(CellError):
        Cell(key, "green", None, True, wall_s=-1.0)
