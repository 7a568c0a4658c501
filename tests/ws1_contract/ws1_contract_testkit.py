"""Helpers shared by the ws1_contract tests (a uniquely named module: importing `conftest` is ambiguous)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

SOURCE = "<test>"


def shipped_document() -> dict[str, Any]:
    """A fresh copy of the raw shipped contract, parsed with the plain json module (not the package's reader)."""
    text = resources.files("ws1_contract").joinpath("data", "tolerance.json").read_text(encoding="utf-8")
    doc = json.loads(text)
    assert isinstance(doc, dict)
    return doc


def cells(doc: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """Every (judgment, op class, dtype, cell) of a contract document, read from the document itself."""
    return [
        (judgment, op_class, dtype, cell)
        for judgment, rows in doc["judgments"].items()
        for op_class, row in rows.items()
        for dtype, cell in row.items()
    ]
