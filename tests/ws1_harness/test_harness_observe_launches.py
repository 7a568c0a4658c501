"""Kernel identity is observed: Triton's launch hook must see what a call recorded at its launch sites.

No GPU here, so the hook is called the way Triton calls it (with launch metadata whose `data` holds the compiled
kernel's name) from inside an observed region. The negative control records one kernel and "launches" another.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ws1_harness.run.observe import TRITON_LAUNCHES, Observation, observe
from ws1_harness.run.unit import CandidateUnderTest, _observation_problem
from ws1_kernels import launches

pytest.importorskip("triton")


def _launch(name: str) -> None:
    """What Triton does at a launch while the hook is installed."""
    TRITON_LAUNCHES(SimpleNamespace(data={"name": name, "function": None, "stream": 0}))


def _cand(*kernels: str) -> CandidateUnderTest:
    return CandidateUnderTest(
        candidate_id="t.det_gemm",
        fn=lambda *a: None,
        reference=lambda *a: None,
        declared_kernels=frozenset(kernels),
        declared_ops=frozenset({"aten.empty"}),
        param_grad_rule=None,
    )


def test_recorded_and_launched_agree() -> None:
    with observe(watch_launches=True) as obs:
        launches.record("triton:ws1_gemm", "fwd")
        _launch("ws1_gemm")
    assert obs.launched == {"triton:ws1_gemm"} and obs.mismatches == []
    assert _observation_problem(obs, _cand("triton:ws1_gemm")) is None


def test_recording_one_kernel_and_launching_another_is_red() -> None:
    with observe(watch_launches=True) as obs:
        launches.record("triton:ws1_gemm", "fwd")
        _launch("some_other_kernel")
    assert obs.mismatches == [{"recorded": ["triton:ws1_gemm"], "launched": ["triton:some_other_kernel"]}]
    problem = _observation_problem(obs, _cand("triton:ws1_gemm", "triton:some_other_kernel"))
    assert problem is not None and problem[0] == "kernel_mismatch"


def test_an_unrecorded_launch_is_red() -> None:
    with observe(watch_launches=True) as obs:
        launches.record("triton:ws1_gemm", "fwd")
        _launch("ws1_gemm")
        _launch("hidden_kernel")
    problem = _observation_problem(obs, _cand("triton:ws1_gemm"))
    assert problem is not None and problem[0] == "undeclared_kernel"


def test_launches_outside_a_region_are_not_attributed() -> None:
    _launch("before")
    with observe(watch_launches=True) as obs:
        launches.record("triton:k", "fwd")
        _launch("k")
    _launch("after")
    assert obs.launched == {"triton:k"}


def test_without_the_hook_watch_nothing_is_compared() -> None:
    """On the host (the interpreter calls no hook) the launch comparison is off, not vacuously green."""
    with observe(watch_launches=False) as obs:
        launches.record("triton:k", "fwd")
        _launch("k")
    assert obs.launched == set() and obs.mismatches == []


def test_stock_candidates_are_not_judged_on_ops() -> None:
    obs = Observation(kernels={"ws1.native.det_gemm"}, ops={"aten.mm", "aten._some_cuda_only_op"})
    cand = _cand("ws1.native.det_gemm")
    problem = _observation_problem(obs, cand)
    assert problem is not None and problem[0] == "undeclared_op"
    stock = CandidateUnderTest(**{**cand.__dict__, "stock": True})
    assert _observation_problem(obs, stock) is None


def test_op_watch_can_be_skipped_for_the_stock_baseline_only_by_choice() -> None:
    """The stock baseline's non-canonical layouts skip the dispatch watch; launches are still recorded."""
    import torch

    x = torch.ones(3)
    with observe(watch_ops=False) as off:
        launches.record("ws1.native.silu", "fwd")
        torch.nn.functional.silu(x)
    with observe() as on:
        torch.nn.functional.silu(x)
    assert off.ops == set() and off.kernels == {"ws1.native.silu"}
    assert "aten.silu" in on.ops
