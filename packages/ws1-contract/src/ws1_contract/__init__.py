"""ws1_contract: the numerical contract of ws1 (no torch).

Load and validate the tolerance contract, resolve the rule for one (judgment, op class, dtype) cell, read the
comparison roles and chain aggregates, fingerprint documents, and serve every ws1 JSON Schema.
"""

from __future__ import annotations

from .canonical import canonical_json, sha256_fingerprint
from .contract import Contract, load_contract
from .errors import ContractError
from .records import AggregateThresholds, CalibrationRecord, ComparisonRole, ToleranceSpec
from .schemas import load_schema, schema_names, validate_document

__all__ = [
    "AggregateThresholds",
    "CalibrationRecord",
    "ComparisonRole",
    "Contract",
    "ContractError",
    "ToleranceSpec",
    "canonical_json",
    "load_contract",
    "load_schema",
    "schema_names",
    "sha256_fingerprint",
    "validate_document",
]
