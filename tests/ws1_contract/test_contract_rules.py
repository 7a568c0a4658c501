"""Every schema and semantic rule of the contract rejects its violation with its own message and JSON path.

Each case mutates the shipped contract in one place. A case names its rule; the distinctness test checks that a
rule's message fragment appears only in errors of that same rule, so no two rules can share one vague message.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from ws1_contract_testkit import SOURCE, shipped_document

from ws1_contract import Contract, ContractError

Doc = dict[str, Any]


@dataclass(frozen=True)
class Case:
    id: str
    rule: str
    mutate: Callable[[Doc], None]
    fragment: str
    path: str


def _set(*keys: str | int, value: Any) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        node: Any = doc
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return mutate


def _delete(*keys: str | int) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        node: Any = doc
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]

    return mutate


def _cell(judgment: str, op_class: str, dtype: str, **changes: Any) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        doc["judgments"][judgment][op_class][dtype].update(changes)

    return mutate


def _copy_cell(src: tuple[str, str, str], dst: tuple[str, str, str]) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        j, c, d = src
        tj, tc, td = dst
        doc["judgments"][tj][tc][td] = copy.deepcopy(doc["judgments"][j][c][d])

    return mutate


def _calibration(judgment: str, op_class: str, dtype: str, **changes: Any) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        doc["judgments"][judgment][op_class][dtype]["calibration"].update(changes)

    return mutate


_PROVISIONAL = {
    "status": "provisional",
    "source": "test",
    "date": "2026-01-01",
    "active_tokens": 0,
    "seeds": 0,
}
_NA = {"status": "not_applicable", "mode": None, "atol": None, "rtol": None}
_UNKNOWN = "Additional properties are not allowed ('bogus' was unexpected)"
J = "$.judgments"

CASES = [
    # invariance is raw bits
    Case(
        "invariance_nonzero_atol",
        "bitwise_zero",
        _cell("forward_invariance", "gemm", "bf16", atol=1e-3),
        "a bitwise cell has atol = rtol = 0",
        f"{J}.forward_invariance.gemm.bf16.atol",
    ),
    Case(
        "invariance_nonzero_rtol",
        "bitwise_zero",
        _cell("gradient_invariance", "reduction", "fp32", rtol=1e-6),
        "a bitwise cell has atol = rtol = 0",
        f"{J}.gradient_invariance.reduction.fp32.rtol",
    ),
    Case(
        "invariance_tolerance_mode",
        "invariance_bitwise",
        _cell("forward_invariance", "attention", "bf16", mode="tolerance", calibration=_PROVISIONAL),
        "invariance is judged on raw bits: mode must be 'bitwise'",
        f"{J}.forward_invariance.attention.bf16.mode",
    ),
    Case(
        "bitwise_with_calibration",
        "bitwise_no_calibration",
        _cell("gradient_invariance", "gemm", "bf16", calibration=_PROVISIONAL),
        "a bitwise cell has no threshold to calibrate",
        f"{J}.gradient_invariance.gemm.bf16.calibration",
    ),
    # the grid is complete
    Case(
        "missing_cell",
        "missing_cell",
        _delete("judgments", "forward_accuracy", "gemm", "fp16"),
        "cell (forward_accuracy, gemm, fp16) is missing",
        f"{J}.forward_accuracy.gemm",
    ),
    Case(
        "missing_op_class_row",
        "missing_row",
        _delete("judgments", "forward_invariance", "logprob"),
        "op class row 'logprob' is missing",
        f"{J}.forward_invariance",
    ),
    Case(
        "missing_judgment",
        "missing_judgment",
        _delete("judgments", "forward_invariance"),
        "judgment 'forward_invariance' is missing",
        J,
    ),
    Case(
        "gradient_row_missing",
        "gradient_row_missing",
        _delete("judgments", "gradient_accuracy", "gemm"),
        "gradient thresholds are never inherited from forward_accuracy",
        f"{J}.gradient_accuracy",
    ),
    Case(
        "gradient_judgment_missing",
        "gradient_judgment_missing",
        _delete("judgments", "gradient_accuracy"),
        "gradient rows are their own numbers and are never inherited",
        J,
    ),
    Case(
        "legacy_inherit_key",
        "unknown_key",
        _cell("gradient_accuracy", "gemm", "bf16", bogus="forward_accuracy"),
        _UNKNOWN,
        f"{J}.gradient_accuracy.gemm.bf16",
    ),
    # dtype policy per cell
    Case(
        "fp8_in_scope",
        "fp8_out_of_scope",
        _copy_cell(("forward_accuracy", "gemm", "bf16"), ("forward_accuracy", "gemm", "fp8")),
        "fp8 is out of scope (policy.fp8)",
        f"{J}.forward_accuracy.gemm.fp8.status",
    ),
    Case(
        "fp8_invariance_in_scope",
        "fp8_out_of_scope",
        _copy_cell(("gradient_invariance", "gemm", "bf16"), ("gradient_invariance", "gemm", "fp8")),
        "fp8 is out of scope (policy.fp8)",
        f"{J}.gradient_invariance.gemm.fp8.status",
    ),
    Case(
        "fp16_applicable",
        "fp16_optional",
        _cell("forward_accuracy", "reduction", "fp16", status="applicable"),
        "fp16 is optional (policy.fp16)",
        f"{J}.forward_accuracy.reduction.fp16.status",
    ),
    Case(
        "bf16_optional",
        "judged_dtype",
        _cell("forward_accuracy", "reduction", "bf16", status="optional"),
        "bf16 is always judged",
        f"{J}.forward_accuracy.reduction.bf16.status",
    ),
    Case(
        "bf16_out_of_scope",
        "judged_dtype",
        _set(
            "judgments",
            "gradient_accuracy",
            "gemm",
            "bf16",
            value={"status": "out_of_scope", "mode": None, "atol": None, "rtol": None},
        ),
        "bf16 is always judged",
        f"{J}.gradient_accuracy.gemm.bf16.status",
    ),
    # status and reason
    Case(
        "not_applicable_without_reason",
        "na_reason",
        _set("judgments", "forward_accuracy", "elementwise", "bf16", value=dict(_NA)),
        "status 'not_applicable' needs a non-empty 'reason'",
        f"{J}.forward_accuracy.elementwise.bf16.reason",
    ),
    Case(
        "not_applicable_blank_reason",
        "na_reason",
        _set("judgments", "forward_accuracy", "elementwise", "bf16", value={**_NA, "reason": "  "}),
        "status 'not_applicable' needs a non-empty 'reason'",
        f"{J}.forward_accuracy.elementwise.bf16.reason",
    ),
    Case(
        "not_applicable_with_thresholds",
        "unjudged_thresholds",
        _cell("forward_accuracy", "logprob", "bf16", status="not_applicable", reason="layout_only"),
        "cell is never judged and carries no 'mode'",
        f"{J}.forward_accuracy.logprob.bf16.mode",
    ),
    Case(
        "out_of_scope_with_calibration",
        "unjudged_calibration",
        _cell("forward_accuracy", "logprob", "fp8", calibration=_PROVISIONAL),
        "cell carries no calibration record",
        f"{J}.forward_accuracy.logprob.fp8.calibration",
    ),
    Case(
        "reason_on_applicable",
        "reason_in_scope",
        _cell("forward_accuracy", "gemm", "bf16", reason="why not"),
        "'reason' is only for not_applicable/out_of_scope cells",
        f"{J}.forward_accuracy.gemm.bf16.reason",
    ),
    Case(
        "applicable_null_atol",
        "in_scope_null",
        _cell("gradient_accuracy", "gemm", "bf16", atol=None),
        "applicable cell needs 'atol', found null",
        f"{J}.gradient_accuracy.gemm.bf16.atol",
    ),
    Case(
        "applicable_nan_rtol",
        "finite",
        _cell("gradient_accuracy", "gemm", "bf16", rtol=math.nan),
        "rtol must be a finite number",
        f"{J}.gradient_accuracy.gemm.bf16.rtol",
    ),
    # thresholds and calibration
    Case(
        "atol_1e308",
        "threshold_range",
        _cell("forward_accuracy", "gemm", "bf16", atol=1e308),
        "outside the range [0, 1.0] a threshold may take",
        f"{J}.forward_accuracy.gemm.bf16.atol",
    ),
    Case(
        "atol_integer_10_400",
        "threshold_range",
        _cell("gradient_accuracy", "logprob", "bf16", atol=10**400),
        "an integer of about 401 digits, outside the range",
        f"{J}.gradient_accuracy.logprob.bf16.atol",
    ),
    Case(
        "chain_threshold_above_range",
        "threshold_range",
        _set("chain", "thresholds", "bf16", "max_abs_dlogp", value=2.0),
        "max_abs_dlogp is 2.0, outside the range",
        "$.chain.thresholds.bf16.max_abs_dlogp",
    ),
    Case(
        "negative_atol",
        "minimum",
        _cell("forward_accuracy", "gemm", "bf16", atol=-1e-3),
        "is less than the minimum of 0",
        f"{J}.forward_accuracy.gemm.bf16.atol",
    ),
    Case(
        "negative_rtol_fp32",
        "minimum",
        _cell("gradient_accuracy", "attention", "fp32", rtol=-1.0),
        "is less than the minimum of 0",
        f"{J}.gradient_accuracy.attention.fp32.rtol",
    ),
    Case(
        "calibration_missing",
        "calibration_missing",
        _delete("judgments", "forward_accuracy", "gemm", "bf16", "calibration"),
        "accuracy threshold in tolerance mode needs a calibration record",
        f"{J}.forward_accuracy.gemm.bf16.calibration",
    ),
    Case(
        "calibrated_on_27_tokens",
        "calibration_tokens",
        _calibration("forward_accuracy", "gemm", "bf16", status="calibrated", active_tokens=27, seeds=5),
        "a 'calibrated' threshold needs >= 4096 active tokens",
        f"{J}.forward_accuracy.gemm.bf16.calibration.active_tokens",
    ),
    Case(
        "calibrated_one_seed",
        "calibration_seeds",
        _calibration("forward_accuracy", "gemm", "bf16", status="calibrated", active_tokens=20000, seeds=1),
        "a 'calibrated' threshold needs >= 3 seeds",
        f"{J}.forward_accuracy.gemm.bf16.calibration.seeds",
    ),
    Case(
        "calibration_bad_date",
        "calibration_date",
        _calibration("gradient_accuracy", "logprob", "fp32", date="2026-02-30"),
        "is not a real date",
        f"{J}.gradient_accuracy.logprob.fp32.calibration.date",
    ),
    Case(
        "calibration_bad_status",
        "enum",
        _calibration("gradient_accuracy", "logprob", "fp32", status="guessed"),
        "'guessed' is not one of",
        f"{J}.gradient_accuracy.logprob.fp32.calibration.status",
    ),
    # roles
    Case(
        "forbidden_role_bf16_reference",
        "forbidden_role",
        _set("roles", "forward_accuracy", "right", value="bf16_reference"),
        "role candidate vs bf16_reference is forbidden",
        "$.roles.forward_accuracy",
    ),
    Case(
        "forbidden_role_reversed",
        "forbidden_role",
        _set("roles", "gradient_accuracy", value={"left": "bf16_reference", "right": "candidate"}),
        "role bf16_reference vs candidate is forbidden",
        "$.roles.gradient_accuracy",
    ),
    Case(
        "forbidden_role_candidate_itself",
        "forbidden_role",
        _set("roles", "forward_accuracy", "right", value="candidate"),
        "role candidate vs candidate is forbidden",
        "$.roles.forward_accuracy",
    ),
    Case(
        "forbidden_role_reference_vs_reference",
        "forbidden_role",
        _set("roles", "gradient_accuracy", "left", value="fp32_reference"),
        "role fp32_reference vs fp32_reference is forbidden",
        "$.roles.gradient_accuracy",
    ),
    Case(
        "self_comparison_not_listed",
        "self_role",
        _set("roles", "chain_parity", value={"left": "rollout_decode", "right": "rollout_decode"}),
        "role compares 'rollout_decode' with itself",
        "$.roles.chain_parity",
    ),
    Case(
        "accuracy_against_layout",
        "accuracy_role",
        _set("roles", "gradient_accuracy", "right", value="canonical_layout"),
        "accuracy is judged against 'fp32_reference' only",
        "$.roles.gradient_accuracy.right",
    ),
    Case(
        "invariance_reversed",
        "invariance_role",
        _set(
            "roles", "forward_invariance", value={"left": "canonical_layout", "right": "transformed_layout"}
        ),
        "invariance compares transformed_layout with canonical_layout",
        "$.roles.forward_invariance",
    ),
    Case(
        "chain_role_reversed",
        "chain_role",
        _set("roles", "chain_parity", value={"left": "rollout_decode", "right": "training_teacher_forcing"}),
        "chain parity compares training_teacher_forcing with rollout_decode",
        "$.roles.chain_parity",
    ),
    Case(
        "unknown_role_side",
        "enum",
        _set("roles", "forward_accuracy", "left", value="oracle"),
        "'oracle' is not one of",
        "$.roles.forward_accuracy.left",
    ),
    Case(
        "missing_role",
        "required",
        _delete("roles", "chain_parity"),
        "'chain_parity' is a required property",
        "$.roles",
    ),
    Case(
        "no_forbidden_roles",
        "min_items",
        _set("forbidden_roles", value=[]),
        "should be non-empty",
        "$.forbidden_roles",
    ),
    # chain aggregates
    Case(
        "bad_formula_kl",
        "formula",
        _set("chain", "formulas", "approx_kl0", value="mean(d**2)/2"),
        "aggregate formula must be 'mean(exp(d)-1-d)'",
        "$.chain.formulas.approx_kl0",
    ),
    Case(
        "bad_formula_clipfrac",
        "formula",
        _set("chain", "formulas", "clipfrac0", value="mean(abs(d) > 0.2)"),
        "aggregate formula must be 'mean((exp(d) < clip_low) | (exp(d) > clip_high))'",
        "$.chain.formulas.clipfrac0",
    ),
    Case(
        "bad_difference",
        "difference",
        _set("chain", "difference", value="logp_right - logp_left"),
        "the chain difference must be 'logp_left - logp_right'",
        "$.chain.difference",
    ),
    Case(
        "clip_interval_wrong",
        "clip_interval",
        _set("chain", "clip_interval", value={"low": 0.9, "high": 1.1}),
        "clip interval must be [0.8, 1.2]",
        "$.chain.clip_interval",
    ),
    Case(
        "clip_interval_empty",
        "clip_empty",
        _set("chain", "clip_interval", value={"low": 1.2, "high": 0.8}),
        "clip interval is empty: low (1.2) must be < high (0.8)",
        "$.chain.clip_interval",
    ),
    Case(
        "non_finite_not_fail",
        "const",
        _set("chain", "non_finite", value="ignore"),
        "'fail' was expected",
        "$.chain.non_finite",
    ),
    Case(
        "empty_active_set_passes",
        "const",
        _set("chain", "empty_active_set", value="pass"),
        "'fail' was expected",
        "$.chain.empty_active_set",
    ),
    Case(
        "chain_dtype_missing",
        "chain_missing",
        _delete("chain", "thresholds", "fp16"),
        "chain thresholds for 'fp16' are missing",
        "$.chain.thresholds",
    ),
    Case(
        "chain_fp8_in_scope",
        "fp8_out_of_scope",
        _set(
            "chain",
            "thresholds",
            "fp8",
            value={
                "status": "applicable",
                "max_abs_dlogp": 1.0,
                "approx_kl0": 1.0,
                "clipfrac0": 1.0,
                "grad_rel_l2": 1.0,
                "grad_rel_max_abs": 1.0,
            },
        ),
        "fp8 is out of scope (policy.fp8)",
        "$.chain.thresholds.fp8.status",
    ),
    Case(
        "chain_calibration_missing",
        "chain_calibration",
        _delete("chain", "thresholds", "bf16", "calibration"),
        "chain thresholds need a calibration record",
        "$.chain.thresholds.bf16.calibration",
    ),
    Case(
        "chain_null_threshold",
        "in_scope_null",
        _set("chain", "thresholds", "bf16", "approx_kl0", value=None),
        "applicable cell needs 'approx_kl0', found null",
        "$.chain.thresholds.bf16.approx_kl0",
    ),
    Case(
        "chain_null_gradient_threshold",
        "in_scope_null",
        _set("chain", "thresholds", "bf16", "grad_rel_l2", value=None),
        "applicable cell needs 'grad_rel_l2', found null",
        "$.chain.thresholds.bf16.grad_rel_l2",
    ),
    Case(
        "chain_gradient_formula_redefined",
        "formula",
        _set("chain", "formulas", "grad_rel_l2", value="max(abs(g - g_ref))"),
        "aggregate formula must be",
        "$.chain.formulas.grad_rel_l2",
    ),
    Case(
        "chain_negative_threshold",
        "minimum",
        _set("chain", "thresholds", "bf16", "max_abs_dlogp", value=-0.1),
        "is less than the minimum of 0",
        "$.chain.thresholds.bf16.max_abs_dlogp",
    ),
    Case(
        "clipfrac_above_one",
        "maximum",
        _set("chain", "thresholds", "fp32", "clipfrac0", value=1.5),
        "is greater than the maximum of 1",
        "$.chain.thresholds.fp32.clipfrac0",
    ),
    # policy and versions
    Case(
        "per_backend_overrides",
        "const",
        _set("policy", "per_backend_overrides", value=True),
        "False was expected",
        "$.policy.per_backend_overrides",
    ),
    Case(
        "tf32_candidate",
        "const",
        _set("policy", "tf32_candidate", value=True),
        "False was expected",
        "$.policy.tf32_candidate",
    ),
    Case(
        "reference_bf16",
        "const",
        _set("policy", "reference_dtype", value="bf16"),
        "'fp32' was expected",
        "$.policy.reference_dtype",
    ),
    Case(
        "schema_version_2",
        "schema_version",
        _set("schema_version", value=2),
        "unsupported schema_version 2",
        "$.schema_version",
    ),
    Case(
        "schema_version_true",
        "schema_version",
        _set("schema_version", value=True),
        "unsupported schema_version True",
        "$.schema_version",
    ),
    # unknown keys at every depth
    Case("unknown_top_key", "unknown_key", _set("bogus", value=1), _UNKNOWN, "$"),
    Case("unknown_policy_key", "unknown_key", _set("policy", "bogus", value=1), _UNKNOWN, "$.policy"),
    Case("unknown_judgment", "unknown_key", _set("judgments", "bogus", value={}), _UNKNOWN, J),
    Case(
        "unknown_op_class",
        "unknown_key",
        _set("judgments", "forward_accuracy", "bogus", value={}),
        _UNKNOWN,
        f"{J}.forward_accuracy",
    ),
    Case(
        "unknown_dtype",
        "unknown_key",
        _set("judgments", "forward_accuracy", "gemm", "bogus", value={}),
        _UNKNOWN,
        f"{J}.forward_accuracy.gemm",
    ),
    Case(
        "unknown_calibration_key",
        "unknown_key",
        _calibration("forward_accuracy", "gemm", "bf16", bogus=1),
        _UNKNOWN,
        f"{J}.forward_accuracy.gemm.bf16.calibration",
    ),
    Case(
        "unknown_role_key",
        "unknown_key",
        _set("roles", "forward_accuracy", "bogus", value=1),
        _UNKNOWN,
        "$.roles.forward_accuracy",
    ),
    Case(
        "unknown_forbidden_key",
        "unknown_key",
        _set("forbidden_roles", 0, "bogus", value=1),
        _UNKNOWN,
        "$.forbidden_roles[0]",
    ),
    Case("unknown_chain_key", "unknown_key", _set("chain", "bogus", value=1), _UNKNOWN, "$.chain"),
    Case(
        "unknown_chain_threshold_key",
        "unknown_key",
        _set("chain", "thresholds", "bf16", "bogus", value=1),
        _UNKNOWN,
        "$.chain.thresholds.bf16",
    ),
    Case(
        "unknown_clip_key",
        "unknown_key",
        _set("chain", "clip_interval", "bogus", value=1),
        _UNKNOWN,
        "$.chain.clip_interval",
    ),
]


def _reject(case: Case) -> ContractError:
    doc = shipped_document()
    case.mutate(doc)
    with pytest.raises(ContractError) as info:
        Contract.from_document(doc, SOURCE)
    return info.value


@functools.cache
def _all_errors() -> dict[str, ContractError]:
    return {case.id: _reject(case) for case in CASES}


def test_shipped_contract_is_valid() -> None:
    contract = Contract.from_document(shipped_document(), SOURCE)
    assert contract.fingerprint.startswith("sha256:")


def test_case_ids_are_unique() -> None:
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_violation_is_rejected_with_message_and_path(case: Case) -> None:
    err = _reject(case)
    assert case.fragment in err.message, f"{case.id}: {err}"
    assert err.path == f"{SOURCE}: {case.path}", f"{case.id}: {err}"
    assert str(err) == f"{err.path}: {err.message}"
    assert "\n" not in str(err)


def test_each_rule_has_its_own_message() -> None:
    """A rule's fragment must not explain any other rule's error: no two rules share one message."""
    errors = _all_errors()
    for case in CASES:
        for other in CASES:
            if other.rule != case.rule:
                assert case.fragment not in errors[other.id].message, (case.id, other.id)


def test_every_semantic_rule_is_exercised() -> None:
    """Count the distinct semantic messages: each rule of semantics.py has at least one case here."""
    semantic_rules = {case.rule for case in CASES} - {
        "unknown_key",
        "enum",
        "const",
        "minimum",
        "maximum",
        "required",
        "min_items",
    }
    assert len(semantic_rules) >= 30
