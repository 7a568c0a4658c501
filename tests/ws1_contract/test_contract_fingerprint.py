"""The fingerprint depends on content only: not on key order or whitespace, but on every number."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from ws1_contract_testkit import SOURCE

from ws1_contract import Contract, ContractError, canonical_json, load_contract, sha256_fingerprint


def _reverse_keys(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {key: _reverse_keys(obj[key]) for key in reversed(list(obj))}
    if isinstance(obj, list):
        return [_reverse_keys(item) for item in obj]
    return obj


def test_fingerprint_format_and_definition(doc: dict[str, Any]) -> None:
    contract = Contract.from_document(doc, SOURCE)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", contract.fingerprint)
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert contract.fingerprint == "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert contract.fingerprint == sha256_fingerprint(contract.document())


def test_fingerprint_ignores_key_order_and_whitespace(doc: dict[str, Any], tmp_path: Path) -> None:
    reordered = _reverse_keys(doc)
    assert list(reordered) != list(doc)
    assert (
        Contract.from_document(reordered, SOURCE).fingerprint
        == Contract.from_document(doc, SOURCE).fingerprint
    )
    compact, spaced = tmp_path / "compact.json", tmp_path / "spaced.json"
    compact.write_text(json.dumps(reordered, separators=(",", ":")), encoding="utf-8")
    spaced.write_text(json.dumps(doc, indent=7), encoding="utf-8")
    assert (
        load_contract(compact).fingerprint == load_contract(spaced).fingerprint == load_contract().fingerprint
    )


@pytest.mark.parametrize(
    "path",
    [
        ("judgments", "gradient_accuracy", "gemm", "bf16", "atol"),
        ("judgments", "forward_accuracy", "logprob", "fp32", "rtol"),
        ("chain", "thresholds", "bf16", "approx_kl0"),
    ],
)
def test_fingerprint_changes_when_a_number_changes(doc: dict[str, Any], path: tuple[str, ...]) -> None:
    before = Contract.from_document(doc, SOURCE).fingerprint
    node: Any = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = node[path[-1]] * 1.5 + 1e-9
    assert Contract.from_document(doc, SOURCE).fingerprint != before


def test_fingerprint_changes_with_calibration_text(doc: dict[str, Any]) -> None:
    before = Contract.from_document(doc, SOURCE).fingerprint
    doc["judgments"]["forward_accuracy"]["gemm"]["bf16"]["calibration"]["source"] += "."
    assert Contract.from_document(doc, SOURCE).fingerprint != before


def test_canonical_json() -> None:
    assert canonical_json({"b": 1, "a": [1.5, "é", None, True]}) == '{"a":[1.5,"é",null,true],"b":1}'
    assert sha256_fingerprint({"a": 1, "b": 2}) == sha256_fingerprint({"b": 2, "a": 1})
    assert sha256_fingerprint({"a": 1}) != sha256_fingerprint({"a": 2})
    with pytest.raises(ContractError, match="not canonical JSON"):
        canonical_json({"x": float("nan")})
    with pytest.raises(ContractError, match="not canonical JSON"):
        canonical_json({"x": object()})


def test_contract_document_is_a_copy() -> None:
    contract = load_contract()
    contract.document()["judgments"]["forward_accuracy"]["gemm"]["bf16"]["atol"] = 99.0
    contract.policy["fp8"] = "applicable"
    assert contract.resolve("forward_accuracy", "gemm", "bf16").atol != 99.0
    assert contract.fingerprint == sha256_fingerprint(contract.document())
