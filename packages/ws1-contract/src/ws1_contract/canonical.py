"""Canonical JSON and its SHA-256 fingerprint.

Evidence files record the fingerprint of the contract and of the workload they were judged under; merge refuses
shards whose fingerprints differ. The fingerprint must therefore depend on the content only: keys sorted, no
whitespace, UTF-8, no NaN/Infinity (which are not JSON).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .errors import ContractError

FINGERPRINT_PREFIX = "sha256:"


def canonical_json(obj: Any) -> str:
    """Serialise `obj` as canonical JSON: sorted keys, separators (",", ":"), non-ASCII kept, no NaN/Inf."""
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ContractError(f"not canonical JSON: {exc}", "canonical_json") from exc


def sha256_fingerprint(obj: Any) -> str:
    """Return "sha256:<hex>" of the UTF-8 bytes of `canonical_json(obj)`."""
    digest = hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()
    return FINGERPRINT_PREFIX + digest
