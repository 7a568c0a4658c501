"""`ci/device_gpu_run.sh` (the GPU call's step runner, docs/gpu.md): every step it runs is named in the docs and
every name the docs give is a step, and the script parses. Controls: a docs list missing a step, and a script with
a planted syntax error, are both seen."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "ci" / "device_gpu_run.sh"
DOC = REPO / "docs" / "gpu.md"


def _script_steps(text: str) -> set[str]:
    """The labels of the script's `case "$s" in` (four-space indented `name)` or `a|b)` lines), less the catch-all."""
    labels = re.findall(r"^    ([a-z0-9|-]+)\)", text, flags=re.MULTILINE)
    return {name for label in labels for name in label.split("|")}


def _doc_steps(text: str) -> set[str]:
    """The names in the docs' "runs named steps under their own time limits (...)" parenthesis."""
    m = re.search(r"runs named steps under their own time limits \(([^)]*)\)", text)
    assert m is not None, "docs/gpu.md no longer lists the steps"
    return set(re.findall(r"`([a-z0-9-]+)`", m.group(1)))


def test_the_docs_name_every_step_and_nothing_else() -> None:
    script, doc = _script_steps(SCRIPT.read_text()), _doc_steps(DOC.read_text())
    assert len(script) >= 10, script
    assert script == doc, {"undocumented": sorted(script - doc), "not a step": sorted(doc - script)}


def test_the_control_a_docs_list_missing_a_step_is_seen() -> None:
    text = DOC.read_text().replace("`hopper`, ", "", 1)
    assert _doc_steps(text) != _script_steps(SCRIPT.read_text())


def _bash_n(path: Path) -> int:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    return subprocess.run([bash, "-n", str(path)], capture_output=True, text=True, timeout=60).returncode


def test_the_script_parses() -> None:
    assert _bash_n(SCRIPT) == 0


def test_the_control_a_planted_syntax_error_is_seen(tmp_path: Path) -> None:
    broken = tmp_path / "broken.sh"
    broken.write_text(SCRIPT.read_text().replace("esac", "", 1))
    assert _bash_n(broken) != 0
