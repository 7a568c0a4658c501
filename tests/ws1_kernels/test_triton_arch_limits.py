"""Every Triton kernel compiles for sm_80, sm_86, sm_89 and sm_90 within that arch's limits: every tile of the GEMM's
frozen tables, and every kernel the operators launch at full Qwen3-8B widths, forward and backward.

The tables were tuned on the H200 (sm_90: 227 KB of shared memory per block, TMA). An sm_86 card has 99 KB and no
TMA; nothing ran there. Triton compiles for any arch on this CPU machine (its own ptxas), so each tile is compiled
for each arch (`triton_arch_measure.py`, in a process without TRITON_INTERPRET) and its shared memory and
registers are held to the arch's per-block shared-memory limit and the 64K-register file. Stack use (spills) is
reported, not judged: the production tiles use some on sm_90 too. The negative control feeds the check a tile over
the sm_86 limit. `triton_launch_measure.py` finds the other kernels' launches by running every operator on CPU
tensors with a recording launcher (nothing runs), then compiles each for each arch; a kernel that an operator
declares but no recorded launch reached fails the coverage test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("triton")
# one block: the module-scoped compile runs (`measured`, `launched`) are built once, 50-120 s together
pytestmark = pytest.mark.heavy(seconds=60)

HERE = Path(__file__).resolve().parent
#: the largest dynamic shared memory one block may opt into, in bytes, and the register file per SM
SHARED_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
REGISTER_FILE = 65536


def limit_problems(cc: int, shared: int, registers: int, warps: int) -> list[str]:
    """Why a compiled tile does not fit the arch (empty when it fits)."""
    out = []
    if shared > SHARED_LIMIT[cc]:
        out.append(f"shared memory {shared} B over sm_{cc}'s {SHARED_LIMIT[cc]} B")
    if registers < 0 or registers * warps * 32 > REGISTER_FILE:
        out.append(f"{registers} registers x {warps * 32} threads over the {REGISTER_FILE}-register file")
    return out


def _run_measure(script: str) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run(
        [sys.executable, str(HERE / script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows: list[dict[str, Any]] = json.loads(proc.stdout)
    return rows


@pytest.fixture(scope="module")
def measured() -> list[dict[str, Any]]:
    return _run_measure("triton_arch_measure.py")


@pytest.fixture(scope="module")
def launched() -> list[dict[str, Any]]:
    return _run_measure("triton_launch_measure.py")


def _problems(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    for row in rows:
        print(
            f"sm_{row['cc']} {row['tile']}: shared {row['shared']} B, {row['registers']} registers, stack {row['stack']} B"
        )
    bad = {
        f"sm_{r['cc']} {r['tile']}": limit_problems(r["cc"], r["shared"], r["registers"], r["warps"])
        for r in rows
    }
    return {k: v for k, v in bad.items() if v}


def test_every_tile_fits_every_arch(measured: list[dict[str, Any]]) -> None:
    assert {r["cc"] for r in measured} == set(SHARED_LIMIT) and len(measured) >= 4 * 5
    assert _problems(measured) == {}


def test_every_launched_kernel_fits_every_arch(launched: list[dict[str, Any]]) -> None:
    assert {r["cc"] for r in launched} == set(SHARED_LIMIT)
    assert _problems(launched) == {}


def test_every_declared_triton_kernel_was_launched_and_compiled(launched: list[dict[str, Any]]) -> None:
    """Coverage: each kernel id a Triton operator declares was reached by a recorded launch (so a new kernel is
    checked as soon as an operator launches it)."""
    from ws1_kernels import triton_ops
    from ws1_kernels.backend import collect_ops

    ops, _ = collect_ops(triton_ops)
    declared = {k.removeprefix("triton:") for e in ops.values() for k in {e.kernel_id, *e.kernel_ids}}
    compiled = {r["tile"].split(" ", 1)[0] for r in launched}
    assert declared - compiled == set()
    assert (
        len(declared) >= 20
    )  # negative control on the set itself: an empty declaration would pass vacuously


def test_a_tile_over_the_sm86_limit_is_caught() -> None:
    """Negative control: 128 KB of shared memory fits sm_90 and not sm_86; 255 registers x 512 threads fits none."""
    assert limit_problems(90, 131072, 128, 4) == []
    assert limit_problems(86, 131072, 128, 4) == ["shared memory 131072 B over sm_86's 101376 B"]
    assert limit_problems(90, 1024, 255, 16) != []
