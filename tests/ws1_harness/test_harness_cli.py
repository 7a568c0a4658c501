"""The `ws1` command line as a real subprocess: one test per command proves the entry point, the exit codes and
the streams end to end (`ws1 matrix`'s is in test_harness_matrix.py). Every bad-input case runs in-process in
test_harness_cli_errors.py: a subprocess costs seconds of torch import each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ws1_harness import cli


def _ws1(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ws1_harness.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_gate_subprocess_pass_then_a_closed_pipe(factory) -> None:
    """`ws1 gate FILE` passes; `ws1 gate FILE | head -0` (the reader gone before the first line) is quiet and
    keeps the verdict (it once printed "internal error: BrokenPipeError" with exit 2)."""
    green, _ = factory.write("green")
    proc = _ws1("gate", green.path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout and proc.stderr == ""
    piped = subprocess.Popen(
        [sys.executable, "-m", "ws1_harness.cli", "gate", str(green.path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert piped.stdout is not None and piped.stderr is not None
    piped.stdout.close()  # before the child has started: its first write meets a closed pipe
    err = piped.stderr.read().decode()
    assert piped.wait(timeout=120) == 0
    assert err == ""


def test_gate_red_prints_the_summary_before_exit_1(factory, capsys) -> None:
    expected = factory.Synth().expected()
    key = next(k for k, e in expected.items() if e.na_reason is None and e.required)
    red, _ = factory.write("red", factory.Synth(overrides={key: ("red", "bits_differ")}))
    assert cli.main(["gate", str(red.path)]) == 1
    assert key.label() in capsys.readouterr().out  # the summary is printed before the non-zero exit


def test_merge_then_gate_then_report(factory, monkeypatch, tmp_path: Path, capsys) -> None:
    """`ws1 merge` and `ws1 report` as subprocesses; the gate's flags in-process."""
    env = {"WS1_SOURCE_COMMIT": "f" * 40, "WS1_SOURCE_DIRTY": "0"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    keys = list(factory.Synth().expected())
    a, _ = factory.write("a", factory.Synth(only=keys[:5]))
    b, _ = factory.write("b", factory.Synth(only=keys[5:]))
    out = tmp_path / "merged" / "all.json"
    proc = _ws1("merge", a.path, b.path, "--out", out, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"ws1 gate {out}" in proc.stdout  # the next command
    assert json.loads(out.read_text())["finalised"] is True
    assert cli.main(["gate", str(out), "--expect-commit", "f" * 40, "--require-clean"]) == 0
    assert cli.main(["gate", str(out), "--expect-commit", "0" * 40]) == 1
    capsys.readouterr()
    proc = _ws1("report", out)
    assert proc.returncode == 0, proc.stderr
    assert (out.parent / "all.report.md").is_file() and (out.parent / "all.heatmap.png").is_file()
    # overlapping shards: one line, exit 2
    assert cli.main(["merge", str(a.path), str(a.path), "--out", str(tmp_path / "o.json")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
