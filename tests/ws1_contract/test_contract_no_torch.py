"""ws1_contract must install and run without torch (it is the gate's thresholds, readable anywhere)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).resolve().parents[2] / "packages" / "ws1-contract" / "pyproject.toml"


def test_import_and_use_does_not_import_torch() -> None:
    code = (
        "import sys, ws1_contract, ws1_contract.cli\n"
        "c = ws1_contract.load_contract()\n"
        "c.resolve('forward_accuracy', 'gemm', 'bf16')\n"
        "[ws1_contract.load_schema(n) for n in ws1_contract.schema_names()]\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'numpy', 'triton'})\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


def test_declared_dependencies_are_jsonschema_and_pyyaml_only() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    names = {
        dep.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip().lower()
        for dep in project["dependencies"]
    }
    assert names == {"jsonschema", "pyyaml"}
    assert project["scripts"] == {"ws1-contract": "ws1_contract.cli:main"}
