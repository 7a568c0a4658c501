"""The one place this package touches ws1_contract: schema validation, fingerprints and the operator spec."""

from __future__ import annotations

from typing import Any

from ws1_contract import ContractError, canonical_json, load_schema, validate_document
from ws1_contract import operators as spec
from ws1_contract.operators import OperatorSpec, ProfileEntry

from .errors import WorkloadError

__all__ = [
    "OperatorSpec",
    "ProfileEntry",
    "canonical_json",
    "fingerprint",
    "spec",
    "validate_manifest_document",
]


def validate_manifest_document(doc: Any, source: str) -> None:
    """Validate against the shipped manifest schema; re-raise as WorkloadError with the contract's one line."""
    load_schema("manifest")  # fails loudly if the contract package ships no manifest schema
    try:
        validate_document(doc, "manifest", source)
    except ContractError as exc:
        raise WorkloadError(str(exc)) from None


def fingerprint(doc: Any) -> str:
    """The workload fingerprint of a manifest document: `sha256:<hex>` of the canonical JSON of the document
    together with the shipped operator spec (`ws1_contract.operators.workload_fingerprint`)."""
    return spec.workload_fingerprint(doc)
