"""Strict reading of JSON documents and JSON-path spelling.

Python's json module accepts NaN/Infinity and silently keeps the last of two duplicate keys; a contract read
that way could hide a threshold. Here both are errors, and every read error names the file and line.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .errors import ContractError

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def json_path(parts: Iterable[str | int]) -> str:
    """Spell a location as a JSON path: `$.judgments.gemm[2]`, `$['odd key']`."""
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENTIFIER.fullmatch(part):
            out += f".{part}"
        else:
            out += "[" + json.dumps(part, ensure_ascii=False) + "]"
    return out


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(literal: str) -> float:
    """A JSON number that overflows a double (`1e400`) would read as inf, which canonical JSON cannot hold:
    refused here, where the file is known (it once surfaced later as "not canonical JSON", naming no file)."""
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError(f"number {literal} is out of range of a double")
    return value


def parse_json(text: str, source: str) -> Any:
    """Parse JSON text strictly (no NaN/Infinity, no duplicate keys); ContractError names source:line:col."""
    try:
        return json.loads(
            text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants, parse_float=_finite_float
        )
    except json.JSONDecodeError as exc:
        raise ContractError(f"invalid JSON: {exc.msg}", f"{source}:{exc.lineno}:{exc.colno}") from exc
    except (_DuplicateKey, ValueError) as exc:
        raise ContractError(f"invalid JSON: {exc}", source) from exc
    except RecursionError as exc:
        raise ContractError("invalid JSON: nested too deeply", source) from exc


def read_json(path: str | Path) -> Any:
    """Read and strictly parse a JSON file; every failure is a one-line ContractError naming the file."""
    where = str(path)
    if not where.strip():  # Path("") is the current folder: `--contract ""` once read "is a directory"
        raise ContractError("the path is empty: name a JSON file", "''")
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise ContractError("file not found", where) from exc
    except IsADirectoryError as exc:
        raise ContractError("is a directory, not a file", where) from exc
    except OSError as exc:
        raise ContractError(f"cannot read: {exc.strerror or exc}", where) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContractError(f"not UTF-8 text (byte {exc.start})", where) from exc
    return parse_json(text, where)
