"""A new operator needs its spec, its reference and a candidate, nothing else: `ws1 matrix` judges the toy
operator of `toy_operator.py` (all three in one test file) on all four judgments.

The healthy toy candidate is green; two broken ones are red on the judgment their fault breaks (the negative
controls: a green toy cell is earned, not given). The shipped gate does not know the operator, and says so:
a plug-in operator is judged by the matrix, never passed off as part of the shipped workload.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent


def _matrix(plugin: str, profile: str, out: Path) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    args = [
        sys.executable,
        "-m",
        "ws1_harness.cli",
        "matrix",
        "--profile",
        profile,
        "--candidates",
        f"toy_operator:{plugin}",
        "--op",
        "toy_cube",
        "--model",
        "tiny",
        "--tier",
        "short",
        "--out",
        str(out),
    ]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    path = out / f"{profile}.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    return proc.returncode, doc, proc.stdout + proc.stderr


def _cells(doc: dict[str, Any]) -> dict[str, str]:
    return {c["judgment"]: c["status"] for c in doc["cells"] if c["operator"] == "toy_cube"}


def test_the_toy_operator_is_judged_green(tmp_path: Path) -> None:
    rc, doc, text = _matrix("TOY", "toy_portable", tmp_path)
    assert doc, text
    assert _cells(doc) == {
        "forward_accuracy": "green",
        "forward_invariance": "green",
        "gradient_accuracy": "green",
        "gradient_invariance": "green",
    }, text
    cell = next(c for c in doc["cells"] if c["operator"] == "toy_cube")
    assert "ws1.test.toy_cube.pointwise" in cell["observed_kernels"]
    # the shipped gate judges the shipped workload: an operator it does not know is named, never waved through
    assert "operator 'toy_cube' is not in the manifest" in text or rc != 0, text


@pytest.mark.parametrize(
    ("plugin", "profile", "red"),
    [
        ("TOY_OFF", "toy_off", "forward_accuracy"),
        ("TOY_SMALL_CALLS", "toy_small_calls", "forward_invariance"),
    ],
)
def test_a_broken_toy_candidate_is_red(tmp_path: Path, plugin: str, profile: str, red: str) -> None:
    _, doc, text = _matrix(plugin, profile, tmp_path)
    assert doc, text
    assert _cells(doc)[red] == "red", (_cells(doc), text)
