"""`ws1 matrix` end to end: a plug-in profile with one broken operator turns exactly its cells red, a hung
candidate becomes a red `timeout` cell while the sweep goes on, and bad input is one line with exit 2.

These run the real command line in a subprocess (worker processes and all) at the `tiny` widths.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    proc = ws1(*args, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    cells = cells_of(tmp_path / "hang_silu.json")
    for judgment in ("forward_accuracy", "forward_invariance", "gradient_accuracy", "gradient_invariance"):
        assert cells[("silu", "short@tiny", judgment)] == ("red", "timeout")
        assert cells[("rms_norm", "short@tiny", judgment)] == ("green", None)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--profile", "no_such_profile"], "unknown profile"),
        (["--profile", "portable_cpu", "--op", "no_such_op"], "unknown operator"),
        (["--profile", "portable_cpu", "--tier", "no_such_tier"], "unknown tier"),
        (["--profile", "portable_cpu", "--model", "no_such_model"], "unknown model"),
        (["--profile", "portable_cpu", "--candidates", "no_such_module:X"], "--candidates"),
        (["--profile", "portable_cpu", "--shard", "3/2"], "shard"),
    ],
)
def test_bad_matrix_input_is_one_line_exit_2(tmp_path: Path, args: list[str], fragment: str) -> None:
    proc = ws1("matrix", *args, "--out", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


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
    ]
    for i in range(2):
        proc = ws1("matrix", *base, "--shard", f"{i}/2", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    shards = sorted(str(p) for p in tmp_path.glob("portable_cpu.shard-*.json"))
    assert len(shards) == 2
    merged = tmp_path / "merged.json"
    assert ws1("merge", *shards, "--out", str(merged), cwd=tmp_path).returncode == 0
    assert ws1("gate", str(merged), cwd=tmp_path).returncode == 0
    assert ws1("gate", shards[0], cwd=tmp_path).returncode == 1  # one shard alone lacks cells: red
