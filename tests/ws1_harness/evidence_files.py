"""Where the committed GPU evidence is and how its files are named: one place for the tests that read it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EVIDENCE = REPO / "docs" / "evidence"
#: Matrix evidence files are named `<profile>.<arch>.json`, the arch a proxy label where one ran
#: (`cuda_bf16.sm86-proxy.json`); chain files `chain-<profile>.<arch>-L<layers>.json`, bench files `bench-...`.
MATRIX_NAME = re.compile(r"^([a-z0-9_]+)\.sm\d+[a-z]?(-proxy)?\.json$")
CHAIN_NAME = re.compile(r"^chain-([a-z0-9_]+)\.sm\d+[a-z]?(-proxy)?-L\d+\.json$")


def matrix_files() -> list[Path]:
    return sorted(p for p in EVIDENCE.rglob("*.json") if MATRIX_NAME.match(p.name))


def evidence_files() -> list[tuple[Path, str, bool]]:
    """(path, profile, is a chain file) of every matrix and chain file."""
    out = []
    for path in sorted(EVIDENCE.rglob("*.json")):
        m, c = MATRIX_NAME.match(path.name), CHAIN_NAME.match(path.name)
        if m or c:
            out.append((path, (m or c).group(1), bool(c)))  # type: ignore[union-attr]
    return out
