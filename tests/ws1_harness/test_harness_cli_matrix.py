"""What `ws1 matrix` tells its user, in-process and with stand-in units (no kernel runs): Ctrl-C, the closing
verdict and next command, error messages, the exit code the gate agrees with, a dead worker's cause, and the
optional node a plug-in leaves out.
"""

from __future__ import annotations

import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from standin_units import error_records

from ws1_harness import cli
from ws1_harness.run import matrix
from ws1_harness.run.tasks import UnitTask
from ws1_harness.run.unit import JUDGMENTS
from ws1_harness.verdict.gate import EXIT_PASS, EXIT_RED, GateResult

TINY = ["--model", "tiny", "--tier", "short", "--in-process"]


def _records(task: UnitTask, status: str = "error", reason: str | None = "exception") -> list[dict[str, Any]]:
    return error_records(task, status, reason)


def test_ctrl_c_exits_130_and_names_the_partial_file(tmp_path: Path, capsys, monkeypatch) -> None:
    """Ctrl-C once exited 2 (the bad-input code) and did not say which partial file it kept."""

    def execute(task: UnitTask) -> list[dict[str, Any]]:
        if task.operator == "rms_norm":
            raise KeyboardInterrupt
        return _records(task)

    monkeypatch.setattr(matrix, "execute_task", execute)
    args = [
        "matrix",
        "--profile",
        "portable_cpu",
        "--op",
        "silu",
        "--op",
        "rms_norm",
        *TINY,
        "--out",
        tmp_path,
    ]
    code = cli.main([str(a) for a in args])
    err = capsys.readouterr().err
    partial = tmp_path / "portable_cpu.partial.jsonl"
    assert code == 130
    assert "interrupted after 1 of 2 units" in err and str(partial) in err
    assert partial.is_file() and len(partial.read_text().splitlines()) == 1 + len(JUDGMENTS)


def test_summary_shows_the_error_and_ends_with_verdict_and_next_command(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """An error cell once showed only `error:exception`, and the summary ended without a verdict."""
    monkeypatch.setattr(matrix, "execute_task", _records)
    args = ["matrix", "--profile", "portable_cpu", "--op", "silu", *TINY, "--out", tmp_path]
    assert cli.main([str(a) for a in args]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    final = tmp_path / "portable_cpu.json"
    assert "  silu/short@tiny: ValueError: the candidate's own message (at my_kernel.py:42)" in out
    assert out[-2].startswith("verdict: RED")
    assert out[-1] == f"next: ws1 gate {final}; ws1 report {final}"


@pytest.mark.parametrize(
    ("verdict", "expected"), [(EXIT_RED, 1), (EXIT_PASS, 0)], ids=["gate-red", "gate-pass"]
)
def test_exit_code_agrees_with_the_gate(
    tmp_path: Path, capsys, monkeypatch, verdict: int, expected: int
) -> None:
    """`ws1 matrix --op pack` once exited 0 while `ws1 gate` said RED: a whole run exits 1 unless the gate passes."""
    monkeypatch.setattr(matrix, "execute_task", lambda task: _records(task, "na", "optional_not_provided"))
    monkeypatch.setattr(matrix, "gate", lambda path: GateResult(verdict, ("stub",)))
    args = ["matrix", "--profile", "portable_cpu", "--op", "linear_logp", *TINY, "--out", tmp_path]
    assert cli.main([str(a) for a in args]) == expected
    assert (
        capsys.readouterr()
        .out.strip()
        .splitlines()[-2]
        .startswith("verdict: " + ("RED" if expected else "PASS"))
    )


def test_a_shard_names_the_merge_as_its_next_step(tmp_path: Path) -> None:
    lines = matrix._next_steps(tmp_path / "p.shard-1-of-2.json", (1, 2), "RED")
    assert lines[0].startswith("verdict: shard 1/2 done")
    assert f"ws1 merge {tmp_path}/p.shard-*-of-2.json --out ALL.json" in lines[1]


# ------------------------------------------------------------------------------------------------ worker


@pytest.mark.parametrize(
    ("exitcode", "message"),
    [
        (-signal.SIGKILL, "killed by SIGKILL (out of memory?)"),
        (-signal.SIGSEGV, "killed by SIGSEGV"),
        (3, "exited with status 3"),
        (None, "stopped replying and did not exit"),
    ],
)
def test_a_dead_worker_says_how_it_died(exitcode: int | None, message: str) -> None:
    """It once read "worker died: worker exited: " with nothing after it."""
    from ws1_harness.run.worker import death_message

    assert death_message(exitcode) == message


def test_the_pool_records_the_death_in_the_cells(monkeypatch) -> None:
    from ws1_harness.run import worker

    class DeadProcess:
        exitcode = -signal.SIGKILL

        def is_alive(self) -> bool:
            return True  # alive when the task is sent; it dies before it answers

        def join(self, timeout: float | None = None) -> None:
            pass

        def kill(self) -> None:
            pass

    class ClosedConnection:
        def send(self, obj: object) -> None:
            pass

        def poll(self, timeout: float) -> bool:
            return True  # readable: the other end has closed

        def recv(self) -> object:
            raise EOFError

    pool = worker.WorkerPool()
    monkeypatch.setattr(pool, "_start", lambda: worker._Live(DeadProcess(), ClosedConnection()))
    records = pool.run(UnitTask("portable_cpu", "silu", "short", model="tiny"), 5.0)
    assert {r["diagnostics"]["why"] for r in records} == {"worker died: killed by SIGKILL (out of memory?)"}
    assert {r["status"] for r in records} == {"error"}


# ------------------------------------------------------------------------------------------------ optional node


def test_a_plugin_without_the_optional_node_is_na_optional_not_provided(monkeypatch) -> None:
    """docs/gate.md promises `na optional_not_provided`; a plug-in without linear_logp was red
    `candidate_unavailable`. A required node the plug-in leaves out stays red (the negative control)."""
    from ws1_harness.run.tasks import execute_task
    from ws1_kernels import registry

    monkeypatch.setattr(registry, "_PROFILES", dict(registry._PROFILES))
    silu = registry.resolve("portable_cpu", "silu", device="cpu")
    registry.register_profile("ws1_only_silu", [replace(silu, profile="ws1_only_silu")])
    optional = execute_task(UnitTask("ws1_only_silu", "linear_logp", "short", model="tiny", device="cpu"))
    assert {(r["status"], r["reason_code"]) for r in optional} == {("na", "optional_not_provided")}
    required = execute_task(UnitTask("ws1_only_silu", "rms_norm", "short", model="tiny", device="cpu"))
    assert {(r["status"], r["reason_code"]) for r in required} == {("red", "candidate_unavailable")}


def test_the_gate_passes_the_optional_na_it_promises(factory) -> None:
    from ws1_harness.verdict.gate import gate

    synth = factory.Synth()
    keys = [k for k in synth.expected() if k.operator == "linear_logp"]
    writer, _ = factory.write(
        "opt", factory.Synth(overrides={k: ("na", "optional_not_provided") for k in keys})
    )
    assert gate(writer.path).passed


# ------------------------------------------------------------------------------------------------ provenance


def test_a_run_outside_a_checkout_says_how_to_record_its_commit(tmp_path: Path, capsys, monkeypatch) -> None:
    """A non-editable install records commit `unknown`, so `--require-clean` / `--expect-commit` are always red;
    the run says so up front and how to fix it, and WS1_SOURCE_COMMIT records the commit for such an install."""
    from ws1_harness.verdict import provenance

    installed = tmp_path / "site-packages" / "ws1_harness"  # where a non-editable install puts the code
    installed.mkdir(parents=True)
    monkeypatch.setattr(provenance, "source_dir", lambda: installed)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.delenv("WS1_SOURCE_COMMIT", raising=False)
    monkeypatch.setattr(matrix, "execute_task", _records)
    out = tmp_path / "out"
    args = ["matrix", "--profile", "portable_cpu", "--op", "silu", *TINY, "--out", out]
    cli.main([str(a) for a in args])
    err = capsys.readouterr().err
    assert "ws1 matrix: warning: the commit is unknown" in err and "WS1_SOURCE_COMMIT=<sha>" in err
    assert "pip install -e" in err
    # the way out for such an install: state the commit; then it is recorded and no warning is printed
    monkeypatch.setenv("WS1_SOURCE_COMMIT", "c" * 40)
    monkeypatch.setenv("WS1_SOURCE_DIRTY", "0")
    assert provenance.unknown_commit_hint() is None
    prov = provenance.collect_provenance([]).to_json()
    assert (prov["git_commit"], prov["git_dirty"], prov["git_source"]) == ("c" * 40, False, "env")
