"""resolve / role / aggregates: each cell resolves to its own numbers, and nothing ever falls back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from ws1_contract_testkit import SOURCE, cells, shipped_document

from ws1_contract import (
    AggregateThresholds,
    ComparisonRole,
    Contract,
    ContractError,
    ToleranceSpec,
    load_contract,
)

DOC = shipped_document()
IN_SCOPE = [(j, c, d, cell) for j, c, d, cell in cells(DOC) if cell["status"] in ("applicable", "optional")]
UNJUDGED = [
    (j, c, d, cell) for j, c, d, cell in cells(DOC) if cell["status"] not in ("applicable", "optional")
]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def contract() -> Contract:
    return load_contract()


def test_axes(contract: Contract) -> None:
    assert contract.judgments == (
        "forward_accuracy",
        "forward_invariance",
        "gradient_accuracy",
        "gradient_invariance",
    )
    assert contract.op_classes == ("elementwise", "reduction", "gemm", "attention", "logprob")
    assert set(contract.dtypes) == {"fp32", "bf16", "fp16", "fp8"}
    # the document holds exactly one cell per point of the grid (counts derived from the axes)
    assert len(cells(DOC)) == len(contract.judgments) * len(contract.op_classes) * len(contract.dtypes)
    assert len(IN_SCOPE) + len(UNJUDGED) == len(cells(DOC))
    assert IN_SCOPE and UNJUDGED


@pytest.mark.parametrize(
    ("judgment", "op_class", "dtype", "cell"), IN_SCOPE, ids=[f"{j}-{c}-{d}" for j, c, d, _ in IN_SCOPE]
)
def test_resolve_every_in_scope_cell(
    contract: Contract, judgment: str, op_class: str, dtype: str, cell: Any
) -> None:
    spec = contract.resolve(judgment, op_class, dtype)
    assert isinstance(spec, ToleranceSpec)
    assert (spec.judgment, spec.op_class, spec.dtype) == (judgment, op_class, dtype)
    assert (spec.status, spec.mode, spec.atol, spec.rtol) == (
        cell["status"],
        cell["mode"],
        cell["atol"],
        cell["rtol"],
    )
    assert spec.optional is (cell["status"] == "optional")
    if spec.mode == "bitwise":
        assert spec.atol == 0.0 and spec.rtol == 0.0 and spec.calibration is None
    else:
        assert spec.calibration is not None
        assert spec.calibration.to_json() == cell["calibration"]
    assert spec.to_json()["atol"] == cell["atol"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.atol = 1.0  # type: ignore[misc]


def test_invariance_is_bitwise_and_accuracy_is_tolerance(contract: Contract) -> None:
    for judgment, op_class, dtype, _ in IN_SCOPE:
        spec = contract.resolve(judgment, op_class, dtype)
        expected = "bitwise" if judgment.endswith("_invariance") else "tolerance"
        assert spec.mode == expected, (judgment, op_class, dtype)


def test_arch_never_changes_the_answer(contract: Contract) -> None:
    """One shared set of rows for every backend profile: no per-arch relaxation."""
    for judgment, op_class, dtype, _ in IN_SCOPE:
        base = contract.resolve(judgment, op_class, dtype)
        for arch in ("cpu", "sm86", "sm90", "sm90a"):
            assert contract.resolve(judgment, op_class, dtype, arch=arch) == base


def test_policy_forbids_per_backend_overrides(contract: Contract) -> None:
    policy = contract.policy
    assert policy["per_backend_overrides"] is False
    assert policy["tf32_reference"] is False and policy["tf32_candidate"] is False
    assert (policy["execution_dtype"], policy["accumulation_dtype"], policy["reference_dtype"]) == (
        "bf16",
        "fp32",
        "fp32",
    )
    assert (policy["fp8"], policy["fp16"]) == ("out_of_scope", "optional")


def test_provisional_bf16_cells_carry_the_published_figures(contract: Contract) -> None:
    """While a bf16 cell is provisional its numbers are the field's published ones (recalibration flips status)."""
    published = {
        "forward_accuracy": {
            "elementwise": (2e-2, 1.6e-2),
            "reduction": (5e-2, 2e-2),
            "gemm": (5e-2, 2e-2),
            "attention": (5e-2, 2e-2),
            "logprob": (6e-2, 0.0),
        },
        "gradient_accuracy": {
            "elementwise": (2e-2, 1.6e-2),
            "reduction": (1e-1, 2e-2),
            "gemm": (1e-1, 2e-2),
            "attention": (5e-2, 2e-2),
            "logprob": (5e-2, 0.0),
        },
    }
    # every committed calibration run (CPU and H200); a calibrated cell's atol is the largest of their figures
    files = (
        "docs/evidence/calibration-cpu/calibration.json",
        "docs/evidence/calibration-h200-dfd5964/calibration.json",
    )
    runs = {f: json.loads((REPO / f).read_text(encoding="utf-8")) for f in files}
    checked = 0
    for judgment, rows in published.items():
        for op_class, (atol, rtol) in rows.items():
            spec = contract.resolve(judgment, op_class, "bf16")
            assert spec.calibration is not None
            if spec.calibration.status == "provisional":
                assert (spec.atol, spec.rtol) == (atol, rtol), (judgment, op_class)
            else:  # a calibrated cell carries exactly the figures of the committed calibration evidence
                key = f"{judgment}/{op_class}/bf16"
                measured = [r["groups"][key] for r in runs.values() if key in r["groups"]]
                assert spec.atol == max(m["atol"] for m in measured), (judgment, op_class)
                assert {spec.rtol} == {m["rtol"] for m in measured}, (judgment, op_class)
                assert spec.calibration.active_tokens == sum(m["active_tokens"] for m in measured)
                assert all(f in spec.calibration.source for f in files)
            checked += 1
    assert checked == sum(len(rows) for rows in published.values())


def test_gradient_rows_are_their_own_numbers(doc: dict[str, Any]) -> None:
    """Changing a forward row leaves the gradient row alone and vice versa: nothing is inherited."""
    doc["judgments"]["forward_accuracy"]["gemm"]["bf16"]["atol"] = 0.123
    doc["judgments"]["gradient_accuracy"]["reduction"]["bf16"]["atol"] = 0.456
    contract = Contract.from_document(doc, SOURCE)
    shipped = load_contract()
    assert contract.resolve("forward_accuracy", "gemm", "bf16").atol == 0.123
    assert contract.resolve("gradient_accuracy", "gemm", "bf16") == shipped.resolve(
        "gradient_accuracy", "gemm", "bf16"
    )
    assert contract.resolve("gradient_accuracy", "reduction", "bf16").atol == 0.456
    assert contract.resolve("forward_accuracy", "reduction", "bf16") == shipped.resolve(
        "forward_accuracy", "reduction", "bf16"
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("forward_acc", "gemm", "bf16"), "unknown judgment 'forward_acc'"),
        (("chain_parity", "gemm", "bf16"), "unknown judgment 'chain_parity'"),
        (("forward_accuracy", "matmul", "bf16"), "unknown op class 'matmul'"),
        (("forward_accuracy", "gemm", "bfloat16"), "unknown dtype 'bfloat16'"),
        (("forward_accuracy", "gemm", "fp64"), "unknown dtype 'fp64'"),
    ],
)
def test_resolve_rejects_unknown_names(contract: Contract, args: tuple[str, str, str], fragment: str) -> None:
    with pytest.raises(ContractError) as info:
        contract.resolve(*args)
    assert fragment in str(info.value) and "known:" in str(info.value)


@pytest.mark.parametrize(
    ("judgment", "op_class", "dtype", "cell"), UNJUDGED, ids=[f"{j}-{c}-{d}" for j, c, d, _ in UNJUDGED]
)
def test_resolve_refuses_out_of_scope(
    contract: Contract, judgment: str, op_class: str, dtype: str, cell: Any
) -> None:
    with pytest.raises(ContractError) as info:
        contract.resolve(judgment, op_class, dtype)
    assert f"cell is {cell['status']}" in info.value.message
    assert info.value.path == f"resolve({judgment}, {op_class}, {dtype})"


def test_resolve_refuses_not_applicable_with_its_reason(doc: dict[str, Any]) -> None:
    doc["judgments"]["gradient_accuracy"]["logprob"]["bf16"] = {
        "status": "not_applicable",
        "mode": None,
        "atol": None,
        "rtol": None,
        "reason": "layout_only",
    }
    contract = Contract.from_document(doc, SOURCE)
    with pytest.raises(ContractError) as info:
        contract.resolve("gradient_accuracy", "logprob", "bf16")
    assert "cell is not_applicable: layout_only" in str(info.value)
    # and the neighbouring cells still resolve to their own rows (no fallback either way)
    assert (
        contract.resolve("forward_accuracy", "logprob", "bf16").atol
        == doc["judgments"]["forward_accuracy"]["logprob"]["bf16"]["atol"]
    )


@pytest.mark.parametrize("arch", ["", "sm 90", "sm90\n", 90])
def test_resolve_rejects_bad_arch(contract: Contract, arch: Any) -> None:
    with pytest.raises(ContractError, match="bad arch"):
        contract.resolve("forward_accuracy", "gemm", "bf16", arch=arch)


def test_roles(contract: Contract) -> None:
    for name in (*contract.judgments, "chain_parity"):
        role = contract.role(name)
        assert isinstance(role, ComparisonRole)
        assert role.to_json() == DOC["roles"][name]
    assert contract.role("forward_accuracy") == ComparisonRole("candidate", "fp32_reference")
    assert contract.role("gradient_invariance") == ComparisonRole("transformed_layout", "canonical_layout")
    assert contract.role("chain_parity") == ComparisonRole("training_teacher_forcing", "rollout_decode")
    forbidden = contract.forbidden_roles()
    assert ComparisonRole("candidate", "bf16_reference") in forbidden
    for name in (*contract.judgments, "chain_parity"):
        role = contract.role(name)
        assert all({role.left, role.right} != {f.left, f.right} for f in forbidden)
    with pytest.raises(ContractError, match="unknown judgment"):
        contract.role("chain")


def test_aggregates(contract: Contract) -> None:
    chain = DOC["chain"]
    for dtype, entry in chain["thresholds"].items():
        if entry["status"] not in ("applicable", "optional"):
            with pytest.raises(ContractError, match=f"chain thresholds are {entry['status']}"):
                contract.aggregates(dtype)
            continue
        agg = contract.aggregates(dtype)
        assert isinstance(agg, AggregateThresholds)
        assert (agg.max_abs_dlogp, agg.approx_kl0, agg.clipfrac0) == (
            entry["max_abs_dlogp"],
            entry["approx_kl0"],
            entry["clipfrac0"],
        )
        assert (agg.clip_low, agg.clip_high) == (0.8, 1.2)
        assert agg.optional is (entry["status"] == "optional")
        assert agg.calibration is not None and agg.calibration.to_json() == entry["calibration"]
    assert chain["formulas"]["approx_kl0"] == "mean(exp(d)-1-d)"
    assert (chain["non_finite"], chain["empty_active_set"]) == ("fail", "fail")
    with pytest.raises(ContractError, match="unknown dtype"):
        contract.aggregates("float32")
    with pytest.raises(ContractError, match="out_of_scope"):
        contract.aggregates("fp8")


def test_bf16_chain_bound_is_self_consistent(contract: Contract) -> None:
    """With |d| <= max_abs_dlogp no ratio leaves the clip interval, and approx_kl0 is below what |d| allows."""
    import math

    agg = contract.aggregates("bf16")
    assert math.exp(-agg.max_abs_dlogp) >= agg.clip_low and math.exp(agg.max_abs_dlogp) <= agg.clip_high
    bound = math.exp(agg.max_abs_dlogp) - 1 - agg.max_abs_dlogp
    assert 0 < agg.approx_kl0 <= bound
