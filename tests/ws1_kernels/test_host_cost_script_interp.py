"""`ci/host_cost_triton.py`'s step-op rows run on the CPU interpreter: each row's call is made once and must not
raise. Why: the script records a failing row as an error and goes on, so a broken row (a variable shadowed by
another row's, as once happened to the embedding row) came back from the GPU as an error instead of a figure."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

pytest.importorskip("triton")

from kernels_support import interp_only  # noqa: E402
from repo_scripts import load_repo_script  # noqa: E402

pytestmark = interp_only()


def _failing_rows(calls: dict[str, Callable[[], object]]) -> list[str]:
    failing = []
    for name, call in calls.items():
        try:
            call()
        except Exception:  # noqa: BLE001 - the row's failure is what the test looks for
            failing.append(name)
    return failing


def _rows(ops: object) -> dict[str, Callable[[], object]]:
    script = load_repo_script("ci/host_cost_triton.py", "host_cost_triton_script")
    return script._other_step_ops("cpu", ops, torch.Generator().manual_seed(0))


def test_every_step_op_row_runs_with_rope_in_both_forms() -> None:
    from ws1_kernels.triton_ops.step_ops import STEP_OPS

    rows = _rows(STEP_OPS)
    assert {"step op embedding", "step op rope"} <= set(rows)
    assert any(name.startswith("step op rope_rotate") for name in rows)
    assert _failing_rows(rows) == []


def test_the_control_a_broken_op_is_the_row_that_fails() -> None:
    from ws1_kernels.triton_ops.step_ops import STEP_OPS

    broken = dataclasses.replace(
        STEP_OPS, swiglu=lambda gate, up: gate @ up
    )  # [1, N] @ [1, N]: no such product
    assert _failing_rows(_rows(broken)) == ["step op swiglu"]
