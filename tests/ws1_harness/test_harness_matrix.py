"""`ws1 matrix` end to end at the `tiny` widths: a plug-in profile with one broken operator turns exactly its
cells red, a hung candidate becomes a red `timeout` cell while the sweep goes on, shards merge to the full set.

The plug-in test runs the real command line in a subprocess (the one subprocess test of `ws1 matrix`); the others
call `cli.main` in this process (the hung candidate still runs in a real worker process that is killed). Bad
input is tested in-process in test_harness_cli_errors.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ws1_harness import cli

HERE = Path(__file__).resolve().parent


def ws1(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run(
        [sys.executable, "-m", "ws1_harness.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def ws1_in_process(*args: str) -> int:
    return cli.main(list(args))


def cells_of(path: Path) -> dict[tuple[str, str, str], tuple[str, str | None]]:
    doc = json.loads(path.read_text())
    return {(c["operator"], c["tier"], c["judgment"]): (c["status"], c["reason_code"]) for c in doc["cells"]}


def test_plugin_with_one_broken_operator_turns_exactly_its_invariance_cells_red(tmp_path: Path) -> None:
    ops = ["rms_norm", "det_gemm", "silu"]
    args = [
        "matrix",
        "--profile",
        "broken_det_gemm",
        "--candidates",
        "guard_profiles:BROKEN_DET_GEMM",
        "--model",
        "tiny",
        "--tier",
        "primary",
        "--out",
        str(tmp_path),
    ]
    for op in ops:
        args += ["--op", op]
    proc = ws1(*args, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    cells = cells_of(tmp_path / "broken_det_gemm.json")
    red = {k for k, (status, _) in cells.items() if status != "green"}
    assert red == {
        ("det_gemm", "primary@tiny", "forward_invariance"),
        ("det_gemm", "primary@tiny", "gradient_invariance"),
    }, cells
    assert len(cells) == len(ops) * 4  # derived from the axes: 3 operators x 1 tier x 4 judgments
    gate = ws1("gate", str(tmp_path / "broken_det_gemm.json"), cwd=tmp_path)
    assert gate.returncode == 1
    assert "det_gemm/primary@tiny/forward_invariance" in gate.stdout


@pytest.mark.heavy(seconds=25)  # waits out its 20 s unit limit
def test_hung_candidate_is_red_timeout_and_the_sweep_continues(tmp_path: Path) -> None:
    args = [
        "matrix",
        "--profile",
        "hang_silu",
        "--candidates",
        "guard_profiles:HANG_SILU",
        "--model",
        "tiny",
        "--tier",
        "short",
        "--op",
        "silu",
        "--op",
        "rms_norm",
        "--cell-timeout",
        "20",
        "--out",
        str(tmp_path),
    ]
    assert ws1_in_process(*args) == 1
    cells = cells_of(tmp_path / "hang_silu.json")
    for judgment in ("forward_accuracy", "forward_invariance", "gradient_accuracy", "gradient_invariance"):
        assert cells[("silu", "short@tiny", judgment)] == ("red", "timeout")
        assert cells[("rms_norm", "short@tiny", judgment)] == ("green", None)


def test_shards_merge_to_the_full_cell_set_and_gate_green(tmp_path: Path) -> None:
    base = [
        "--profile",
        "portable_cpu",
        "--model",
        "tiny",
        "--tier",
        "short",
        "--op",
        "silu",
        "--op",
        "rope",
        "--op",
        "pack",
        "--out",
        str(tmp_path),
        "--in-process",
    ]
    for i in range(2):
        assert ws1_in_process("matrix", *base, "--shard", f"{i}/2") == 0
    shards = sorted(str(p) for p in tmp_path.glob("portable_cpu.shard-*.json"))
    assert len(shards) == 2
    merged = tmp_path / "merged.json"
    assert ws1_in_process("merge", *shards, "--out", str(merged)) == 0
    assert ws1_in_process("gate", str(merged)) == 0
    assert ws1_in_process("gate", shards[0]) == 1  # one shard alone lacks cells: red
