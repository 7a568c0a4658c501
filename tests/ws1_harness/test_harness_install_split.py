"""The verdict side installs and runs without torch; the execution commands say what they lack.

A machine that only merges, gates and reports evidence (a CI gate job, a reviewer's laptop) installs
`ws1-harness` alone: its base dependencies carry no torch, no kernels and no workload, and `ws1 gate`,
`merge` and `report` work in a process where those cannot be imported. `ws1 matrix` and `ws1 bench` there
stop with one line naming what to install.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from ws1_harness import cli, cli_support
from ws1_harness.errors import HarnessError

ROOT = Path(__file__).resolve().parents[2]
RUN_SIDE = ("torch", "ws1_kernels", "ws1_workload", "triton")

_SCRIPT = """
import json, sys
for m in {blocked!r}:
    sys.modules[m] = None  # as if not installed: import fails and importlib.util.find_spec returns None
from ws1_harness.cli import main
out = {{}}
for name, argv in {commands!r}:
    out[name] = main(argv)
out["loaded"] = [m for m in {blocked!r} if sys.modules.get(m) is not None]
print("RESULT " + json.dumps(out))
"""


def _run_without_torch(commands: list[tuple[str, list[str]]], blocked: tuple[str, ...]) -> dict:
    script = _SCRIPT.format(blocked=blocked, commands=commands)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stderr
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_base_dependencies_carry_no_torch() -> None:
    project = tomllib.loads((ROOT / "packages/ws1-harness/pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"])
    for dist in ("torch", "ws1-kernels", "ws1-workload", "triton"):
        assert dist not in base, f"ws1-harness's base dependencies pull {dist}"
    run = " ".join(project["optional-dependencies"]["run"])
    assert all(dist in run for dist in ("torch", "ws1-kernels", "ws1-workload"))


def test_gate_merge_report_run_without_torch(real_evidence: Path, tmp_path: Path) -> None:
    commands = [
        ("gate", ["gate", str(real_evidence)]),
        ("merge", ["merge", str(real_evidence), "--out", str(tmp_path / "merged.json")]),
        ("report", ["report", str(real_evidence), "--out", str(tmp_path / "report")]),
        ("matrix", ["matrix", "--profile", "portable_cpu", "--out", str(tmp_path / "m")]),
        ("bench", ["bench", "--profile", "portable_cpu", "--out", str(tmp_path / "b")]),
        ("chain", ["chain", "--profile", "portable_cpu", "--out", str(tmp_path / "c")]),
    ]
    got = _run_without_torch(commands, RUN_SIDE)
    assert got["loaded"] == []
    assert (got["gate"], got["merge"], got["report"]) == (0, 0, 0)
    # one line naming what to install, not a traceback (`ws1 chain` once said "internal error")
    assert (got["matrix"], got["bench"], got["chain"]) == (2, 2, 2)
    assert (tmp_path / "merged.json").exists() and list((tmp_path / "report").glob("*.md"))


def test_run_commands_name_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    cli.require_run_extra("matrix")  # negative control: everything is installed here
    monkeypatch.setattr(cli_support, "RUN_MODULES", ("torch", "ws1_no_such_module"))
    with pytest.raises(
        HarnessError, match=r"ws1 matrix: needs ws1_no_such_module, .*ws1-harness\[run\]"
    ) as info:
        cli.require_run_extra("matrix")
    # the packages are on no index: the hint names the checkout's paths, never a bare `pip install ws1-harness`
    assert "-e packages/ws1-contract" in str(info.value) and "on no index" in str(info.value)
