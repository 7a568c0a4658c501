"""The evidence field tables in docs/evidence.md are generated from the schema and must be current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_evidence_doc_tables_match_the_schema() -> None:
    proc = subprocess.run(
        [sys.executable, "ci/schema_doc.py", "contracts/evidence.schema.json", "--check", "docs/evidence.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def test_shipped_schema_copy_is_identical() -> None:
    source = ROOT / "contracts" / "evidence.schema.json"
    copy = ROOT / "packages" / "ws1-contract" / "src" / "ws1_contract" / "data" / "evidence.schema.json"
    assert source.read_bytes() == copy.read_bytes()
