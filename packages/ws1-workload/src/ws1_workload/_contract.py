"""The one place this package touches ws1_contract: schema validation and fingerprints."""

from __future__ import annotations

from typing import Any

from ws1_contract import ContractError, canonical_json, load_schema, sha256_fingerprint, validate_document

from .errors import WorkloadError

__all__ = ["canonical_json", "fingerprint", "validate_manifest_document"]


def validate_manifest_document(doc: Any, source: str) -> None:
    """Validate against the shipped manifest schema; re-raise as WorkloadError with the contract's one line."""
    load_schema("manifest")  # fails loudly if the contract package ships no manifest schema
    try:
        validate_document(doc, "manifest", source)
    except ContractError as exc:
        raise WorkloadError(str(exc)) from None


def fingerprint(doc: Any) -> str:
    """`sha256:<hex>` of the canonical JSON of `doc` (sorted keys, no whitespace), as the contract defines it."""
    return sha256_fingerprint(doc)
