"""The GPU session's orchestration end to end on the CPU (noxfile `_gpu_session`), with the GPU probe faked.

CI has no GPU, so without this the session's wiring (profile environments, the job runner, each matrix's report
and gate, the session's failure list, `session-times.json`) would first run on a GPU machine. The run is the
smallest the session allows: the stock baseline on the short tier at the tiny widths, no build, no tests. The
control asks for a tier the manifest lacks: the matrix job fails and the session names it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from repo_scripts import load_noxfile


class _SessionError(Exception):
    pass


class _Session:
    """What `_gpu_session` uses of a nox session; `run` executes for real (the interpreter running the tests)."""

    venv_backend = "none"
    bin_paths = None

    def __init__(self, posargs: list[str]) -> None:
        self.posargs = posargs
        self.lines: list[str] = []

    def log(self, msg: str) -> None:
        self.lines.append(msg)

    def warn(self, msg: str) -> None:
        self.lines.append(f"WARN {msg}")

    def error(self, msg: str) -> None:
        raise _SessionError(msg)

    def run(self, *cmd: str, env: dict[str, str] | None = None, success_codes: Any = (0,), **_: Any) -> None:
        exe = [sys.executable if c == "python" else c for c in cmd]
        if exe[0] == "ws1":
            exe = [str(Path(sys.executable).parent / "ws1"), *exe[1:]]
        proc = subprocess.run(
            exe, env={**os.environ, **(env or {})}, capture_output=True, text=True, check=False
        )
        if proc.returncode not in success_codes:
            import nox

            raise nox.command.CommandFailed(proc.stderr[-500:])


@pytest.fixture()
def noxfile(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    nf = load_noxfile("ws1_noxfile_gpu_dry")
    real = subprocess.run

    def fake_probe(cmd: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(cmd, list) and len(cmd) > 2 and cmd[1] == "-c" and "get_device_capability" in cmd[2]:
            return subprocess.CompletedProcess(cmd, 0, "9.0\n", "")
        return real(cmd, *args, **kwargs)

    monkeypatch.setattr(nf.subprocess, "run", fake_probe)
    monkeypatch.setattr(nf, "GPU_MODELS", ("tiny",))
    monkeypatch.setattr(
        nf, "_install_packages", lambda session, dists: None
    )  # the test's environment has them
    monkeypatch.setattr(nf.sys, "argv", ["nox", "--no-venv"])  # one environment: no profile venv to build
    # the session finds `ws1` on PATH, as in a nox environment: this interpreter's
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    return nf


def _posargs(tier: str) -> list[str]:
    return ["--profile", "native_torch", "--tier", tier, "--no-tests", "--no-build"]


@pytest.mark.heavy(seconds=15)
def test_a_session_runs_its_matrix_reports_and_gates_it(
    noxfile: ModuleType, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("WS1_OUT", str(tmp_path))
    session = _Session(_posargs("short"))
    noxfile._gpu_session(session, "gpu_sm90")
    out = tmp_path / "gpu_sm90"
    times = json.loads((out / "session-times.json").read_text())
    assert [j["name"] for j in times["jobs"]] == ["matrix native_torch (tiny)"] and times["jobs"][0]["ok"]
    shard = out / "native_torch-tiny"
    assert len(list(shard.glob("*.json"))) == 1 and list(shard.glob("*.report.md")), sorted(shard.iterdir())
    assert any(line.startswith("start matrix native_torch (tiny)") for line in session.lines)


def test_a_failed_matrix_fails_the_session_by_name(noxfile: ModuleType, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("WS1_OUT", str(tmp_path))
    session = _Session(_posargs("no_such_tier"))
    with pytest.raises(_SessionError, match=r"gpu_sm90: not green: matrix native_torch \(tiny\)"):
        noxfile._gpu_session(session, "gpu_sm90")
    times = json.loads((tmp_path / "gpu_sm90" / "session-times.json").read_text())
    assert times["jobs"][0]["rc"] == 2 and not times["jobs"][0]["ok"]
    assert any(line.startswith("WARN matrix native_torch (tiny) failed") for line in session.lines)


@pytest.mark.heavy(seconds=15)
def test_each_profile_runs_in_its_own_environment(noxfile: ModuleType, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Without --no-venv the profile's environment is made (here under tmp_path) and its own `ws1` runs the
    matrix, added as soon as that environment exists."""
    monkeypatch.setenv("WS1_OUT", str(tmp_path / "out"))
    monkeypatch.setattr(noxfile.sys, "argv", ["nox"])
    real = noxfile.make_profile_venv
    made: list[Path] = []

    def make_here(venv: Path, run: Any) -> Path:
        made.append(tmp_path / "venvs" / venv.name)
        return real(made[-1], run)

    monkeypatch.setattr(noxfile, "make_profile_venv", make_here)
    session = _Session(_posargs("short"))
    noxfile._gpu_session(session, "gpu_sm90")
    assert [v.name for v in made] == ["gpu_sm90-native_torch"]
    times = json.loads((tmp_path / "out" / "gpu_sm90" / "session-times.json").read_text())
    assert times["jobs"][0]["ok"]
    log = (tmp_path / "out" / "gpu_sm90" / "logs" / "matrix-native_torch-tiny.log").read_text()
    assert "native_torch" in log
    assert any("environments native_torch" in line for line in session.lines)
