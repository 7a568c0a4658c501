"""The `ws1` command line as a subprocess: exit codes, one-line stderr, never a traceback (traps 15, 17, 21)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _ws1(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ws1_harness.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def _assert_bad_input(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_gate_pass_and_red(factory) -> None:
    green, expected = factory.write("green")
    proc = _ws1("gate", green.path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout
    key = next(k for k, e in expected.items() if e.na_reason is None and e.required)
    red, _ = factory.write("red", factory.Synth(overrides={key: ("red", "bits_differ")}))
    proc = _ws1("gate", red.path)
    assert proc.returncode == 1
    assert key.label() in proc.stdout  # the summary is printed before the non-zero exit (trap 21)


def test_gate_pending_exit_3_and_allow(factory) -> None:
    expected = factory.Synth().expected()
    key = next(k for k, e in expected.items() if e.na_reason is None and e.required)
    pending, _ = factory.write(
        "pending", factory.Synth(overrides={key: ("pending_arch", "arch_unavailable")})
    )
    assert _ws1("gate", pending.path).returncode == 3
    assert _ws1("gate", pending.path, "--allow-pending-arch").returncode == 0


@pytest.mark.parametrize("content", ["", "{", '{"cells": []}', "[1, 2]", '{"a": NaN}'])
def test_gate_bad_files(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    _assert_bad_input(_ws1("gate", path))


def test_gate_unknown_file(tmp_path: Path) -> None:
    _assert_bad_input(_ws1("gate", tmp_path / "absent.json"))


def test_gate_truncated_file(factory) -> None:
    writer, _ = factory.write("t")
    text = writer.path.read_text()
    writer.path.write_text(text[: len(text) - 40])
    _assert_bad_input(_ws1("gate", writer.path))


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("nonsense",),
        ("gate",),
        ("gate", "a", "b"),
        ("merge", "--out", "x.json"),
        ("matrix", "--out", "d"),
        ("matrix", "--profile", "p", "--out", "d", "--shard", "3/2"),
        ("matrix", "--profile", "p", "--out", "d", "--cell-timeout", "-1"),
        ("gate", "x.json", "--bogus-flag"),
    ],
)
def test_bad_arguments(args: tuple[str, ...]) -> None:
    _assert_bad_input(_ws1(*args))


def test_merge_then_gate_then_report(factory, monkeypatch, tmp_path: Path) -> None:
    env = {"WS1_SOURCE_COMMIT": "f" * 40, "WS1_SOURCE_DIRTY": "0"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    keys = list(factory.Synth().expected())
    a, _ = factory.write("a", factory.Synth(only=keys[:5]))
    b, _ = factory.write("b", factory.Synth(only=keys[5:]))
    out = tmp_path / "merged" / "all.json"
    proc = _ws1("merge", a.path, b.path, "--out", out, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["finalised"] is True
    assert _ws1("gate", out, "--expect-commit", "f" * 40, "--require-clean").returncode == 0
    assert _ws1("gate", out, "--expect-commit", "0" * 40).returncode == 1
    proc = _ws1("report", out)
    assert proc.returncode == 0, proc.stderr
    assert (out.parent / "all.report.md").is_file() and (out.parent / "all.heatmap.png").is_file()
    # Overlapping shards: one line, exit 2
    _assert_bad_input(_ws1("merge", a.path, a.path, "--out", tmp_path / "o.json", env=env))


def test_merge_disagreeing_shards(factory, monkeypatch, tmp_path: Path) -> None:
    keys = list(factory.Synth().expected())
    monkeypatch.setenv("WS1_SOURCE_COMMIT", "1" * 40)
    a, _ = factory.write("a", factory.Synth(only=keys[:5]))
    monkeypatch.setenv("WS1_SOURCE_COMMIT", "2" * 40)
    b, _ = factory.write("b", factory.Synth(only=keys[5:]))
    proc = _ws1("merge", a.path, b.path, "--out", tmp_path / "m.json")
    _assert_bad_input(proc)
    assert "git commit" in proc.stderr


def test_matrix_without_matrix_module_is_one_line(tmp_path: Path) -> None:
    """Until (and unless) ws1_harness.matrix exists, `ws1 matrix` still fails cleanly."""
    proc = _ws1("matrix", "--profile", "no_such_profile", "--out", tmp_path / "m")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
