"""Execution follows the candidate: where a unit runs is decided by the registry (or the run), never assumed."""

from __future__ import annotations

import pytest
import torch

from ws1_harness.run.tasks import UnitTask, execute_task, run_device
from ws1_kernels import registry


def test_host_candidate_runs_on_the_host() -> None:
    assert run_device(UnitTask("portable_cpu", "det_gemm", "short")) == "cpu"


def test_device_agnostic_stock_runs_on_cuda_when_present() -> None:
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert registry.preferred_device("native_torch", "det_gemm") == want


def test_explicit_device_wins() -> None:
    assert run_device(UnitTask("native_torch", "det_gemm", "short", device="cpu")) == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_gpu_candidate_without_a_gpu_is_pending_arch_not_a_host_run() -> None:
    records = execute_task(UnitTask("triton_cuda_bf16", "det_gemm", "short", model="tiny"))
    assert {r["status"] for r in records} == {"pending_arch"}
    assert all(r["device"] is None for r in records)


def test_cells_record_the_device_their_tensors_lived_on() -> None:
    records = execute_task(UnitTask("portable_cpu", "silu", "short", model="tiny"))
    assert {r["status"] for r in records} <= {"green", "na"}
    assert all(r["device"] == {"type": "cpu", "name": "cpu", "capability": None} for r in records)
