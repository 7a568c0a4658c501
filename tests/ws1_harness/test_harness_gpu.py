"""The harness on a CUDA device: cells run there, say so, and a batch-variant candidate turns red.

`WS1_REQUIRE_GPU=1` (the GPU sessions) turns a missing GPU into an error, never a skip. The planted candidates
are GEMMs on CUDA tensors: one changes its reduction order with the batch size (as split-K heuristics do) and
must be red on forward invariance; its row-local twin (one same-shape call per row) must be green.
"""

from __future__ import annotations

import pytest
import torch
from guard_profiles import sequential_dot

from ws1_harness.run.tasks import UnitTask, execute_task
from ws1_kernels import launches, registry
from ws1_kernels.registry import Candidate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

_OPS = frozenset(
    {
        "aten.mm",
        "aten.mv",
        "aten.add",
        "aten.mul",
        "aten.zeros",
        "aten.slice",
        "aten.select",
        "aten.stack",
        "aten.t",
    }
)


def _split_k_small_batch(x: torch.Tensor, w: torch.Tensor, ctx) -> torch.Tensor:
    """Changes its K order with the batch size; the order is `sequential_dot`'s, not cuBLAS's (whose split of K
    is its own choice), so the fault is red by construction on the fixture's dot-order probe rows."""
    launches.record("guard.gpu.split_k", "fwd")
    k = x.shape[1]
    if x.shape[0] > 8:
        return sequential_dot(x, w, 0, k).to(torch.bfloat16)
    half = k // 2
    return (sequential_dot(x, w, 0, half) + sequential_dot(x, w, half, k)).to(torch.bfloat16)


def _row_local(x: torch.Tensor, w: torch.Tensor, ctx) -> torch.Tensor:
    launches.record("guard.gpu.row_local", "fwd")
    wf = w.float()
    return torch.stack([torch.mv(wf, x[r].float()) for r in range(x.shape[0])]).to(torch.bfloat16)


def _register(name: str, fn, kernel: str) -> None:
    if name in registry.profiles():
        return
    registry.register_profile(
        name,
        [
            Candidate(
                profile=name,
                operator="det_gemm",
                kernel_id=kernel,
                device="cuda",
                min_arch=None,
                param_grad_rule="autograd_accumulate",
                declared_ops=_OPS,
                fn=fn,
            )
        ],
    )


def _by_judgment(records):
    return {r["judgment"]: r for r in records}


def test_planted_batch_variant_candidate_is_red_on_the_gpu() -> None:
    _register("guard_gpu_split_k", _split_k_small_batch, "guard.gpu.split_k")
    records = _by_judgment(execute_task(UnitTask("guard_gpu_split_k", "det_gemm", "primary", model="tiny")))
    fi = records["forward_invariance"]
    assert fi["status"] == "red" and fi["reason_code"] == "bits_differ", fi
    assert fi["device"]["type"] == "cuda" and fi["device"]["capability"].startswith("sm_")


def test_row_local_twin_is_green_on_the_gpu() -> None:
    _register("guard_gpu_row_local", _row_local, "guard.gpu.row_local")
    records = _by_judgment(execute_task(UnitTask("guard_gpu_row_local", "det_gemm", "primary", model="tiny")))
    fi = records["forward_invariance"]
    assert fi["status"] == "green", fi
    assert fi["device"]["type"] == "cuda"
    assert "peak_device_bytes" in fi["diagnostics"]


def test_native_baseline_runs_on_the_gpu() -> None:
    records = execute_task(UnitTask("native_torch", "silu", "short", model="tiny"))
    assert all(r["device"] is not None and r["device"]["type"] == "cuda" for r in records), records


def test_triton_candidate_resolves_on_the_gpu() -> None:
    cand = registry.resolve("triton_cuda_bf16", "det_gemm", "cuda")
    assert cand.kernel_id.startswith("triton:") and cand.device == "cuda"


@pytest.mark.parametrize("tier", ["short", "primary", "long"])
def test_triton_linear_logp_is_green_at_the_tiny_widths(tier: str) -> None:
    """The unit the GPU sessions once skipped: at the tiny widths a bf16-rounded dlogits put d_weight over the
    contract's gradient atol (2 elements on primary, 14 on long). Every judgment must be green."""
    records = execute_task(UnitTask("triton_cuda_bf16", "linear_logp", tier, model="tiny"))
    bad = {r["judgment"]: (r["status"], r["reason_code"]) for r in records if r["status"] != "green"}
    assert not bad, bad
    assert all(r["device"]["type"] == "cuda" for r in records)
