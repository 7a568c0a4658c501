"""Schemas are served from the package data; loading files is strict; errors are one line with a JSON path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from ws1_contract import ContractError, load_contract, load_schema, schema_names, validate_document


def _object_schemas(node: Any, where: str = "#") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        if node.get("type") == "object" or "properties" in node:
            out.append((where, node))
        for key, value in node.items():
            out += _object_schemas(value, f"{where}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out += _object_schemas(value, f"{where}/{index}")
    return out


def test_tolerance_schema_is_strict_draft_2020_12() -> None:
    schema = load_schema("tolerance")
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)
    assert schema["properties"]["schema_version"] == {"const": 1}
    objects = _object_schemas(schema)
    assert len(objects) > 10
    for where, node in objects:
        assert node.get("additionalProperties") is False, f"{where} allows unknown keys"


def test_every_shipped_schema_loads_and_is_valid() -> None:
    names = schema_names()
    assert "tolerance" in names
    for name in names:
        Draft202012Validator.check_schema(load_schema(name))


def test_load_schema_returns_a_copy() -> None:
    first = load_schema("tolerance")
    first["properties"].clear()
    assert load_schema("tolerance")["properties"]


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("nope", "unknown schema 'nope'"),
        ("../tolerance", "bad schema name"),
        ("tolerance.schema", "bad schema name"),
        ("", "bad schema name"),
    ],
)
def test_load_schema_rejects_bad_names(name: str, fragment: str) -> None:
    with pytest.raises(ContractError) as info:
        load_schema(name)
    assert fragment in str(info.value)


def test_validate_document_reports_source_and_json_path(doc: dict[str, Any]) -> None:
    validate_document(doc, "tolerance", "ok.json")
    doc["judgments"]["forward_accuracy"]["gemm"]["bf16"]["calibration"]["active_tokens"] = "many"
    with pytest.raises(ContractError) as info:
        validate_document(doc, "tolerance", "c.json")
    assert str(info.value).startswith(
        "c.json: $.judgments.forward_accuracy.gemm.bf16.calibration.active_tokens: "
    )
    assert "'many' is not of type 'integer'" in str(info.value)
    with pytest.raises(ContractError, match="unknown schema"):
        validate_document(doc, "nope", "c.json")


def test_validate_document_quotes_odd_keys(doc: dict[str, Any]) -> None:
    doc["policy"]["odd key"] = 1
    with pytest.raises(ContractError, match=r"x: \$\.policy: Additional properties"):
        validate_document(doc, "tolerance", "x")
    doc["policy"].pop("odd key")
    doc["forbidden_roles"][1]["left"] = "someone else"
    with pytest.raises(
        ContractError, match=r"x: \$\.forbidden_roles\[1\]\.left: 'someone else' is not one of"
    ):
        validate_document(doc, "tolerance", "x")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"a": 1, "a": 2}', "duplicate key 'a'"),
        ('{"a": NaN}', "NaN is not valid JSON"),
        ('{"a": -Infinity}', "-Infinity is not valid JSON"),
        ('{"a": ', "invalid JSON: Expecting value"),
        ("[1, 2]", "is not of type 'object'"),
        ("", "invalid JSON"),
    ],
)
def test_strict_json_files(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert fragment in str(info.value)
    assert str(info.value).startswith(str(path))


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match="file not found"):
        load_contract(tmp_path / "missing.json")
    with pytest.raises(ContractError, match="is a directory"):
        load_contract(tmp_path)
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(ContractError, match="not UTF-8"):
        load_contract(bad)


def test_json_error_names_line_and_column(tmp_path: Path, doc: dict[str, Any]) -> None:
    path = tmp_path / "c.json"
    lines = json.dumps(doc, indent=2).splitlines()
    lines[3] = lines[3] + " oops"
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert info.value.path.startswith(f"{path}:4:")
