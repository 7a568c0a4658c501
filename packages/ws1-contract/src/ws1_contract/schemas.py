"""Every ws1 JSON Schema, served from this package's data directory, and one-line validation.

ws1_contract ships the schemas of all ws1 documents (tolerance contract, workload manifest, evidence), so each
package validates against the same bytes that the repository's `contracts/` holds.
"""

from __future__ import annotations

import copy
import functools
import re
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match

from .documents import json_path, parse_json
from .errors import ContractError

_SCHEMA_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
_SUFFIX = ".schema.json"


def _data_dir() -> Any:
    return resources.files("ws1_contract").joinpath("data")


def schema_names() -> tuple[str, ...]:
    """Names of the schemas shipped in the package data (`<name>.schema.json`), sorted."""
    names = [entry.name[: -len(_SUFFIX)] for entry in _data_dir().iterdir() if entry.name.endswith(_SUFFIX)]
    return tuple(sorted(names))


@functools.cache
def _load_schema_cached(name: str) -> dict[str, Any]:
    where = f"ws1_contract/data/{name}{_SUFFIX}"
    entry = _data_dir().joinpath(name + _SUFFIX)
    if not entry.is_file():
        known = ", ".join(schema_names()) or "none"
        raise ContractError(f"unknown schema {name!r} (shipped: {known})", "load_schema")
    schema = parse_json(entry.read_text(encoding="utf-8"), where)
    if not isinstance(schema, dict):
        raise ContractError("a schema must be a JSON object", where)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ContractError(f"not a valid draft 2020-12 schema: {exc.message}", where) from exc
    return schema


def load_schema(name: str) -> dict[str, Any]:
    """Return the shipped JSON Schema `<name>.schema.json` (a fresh copy the caller may modify)."""
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise ContractError(f"bad schema name {name!r}", "load_schema")
    return copy.deepcopy(_load_schema_cached(name))


@functools.cache
def _validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(_load_schema_cached(name))


def validate_document(doc: Any, schema_name: str, source: str) -> None:
    """Validate `doc` against the shipped schema; raise ContractError("<source>: <json path>: <message>").

    Of all violations, jsonschema's `best_match` picks the most relevant one, so the user sees one line
    that says where and what, not a wall of text.
    """
    if not isinstance(schema_name, str) or not _SCHEMA_NAME.fullmatch(schema_name):
        raise ContractError(f"bad schema name {schema_name!r}", "validate_document")
    _load_schema_cached(schema_name)  # a clear error for an unknown schema before building a validator
    error = best_match(_validator(schema_name).iter_errors(doc))
    if error is not None:
        where = json_path(error.absolute_path)
        raise ContractError(f"{error.message} (schema {schema_name})", f"{source}: {where}")
