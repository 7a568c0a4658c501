"""The rollout path of `ws1 chain` (call or step), its graph buckets, and the step path's op watch.

The step path calls no candidate, so its watch (``chain_watch.StepWatch``) judges the ops and kernel ids of the
whole rollout: each property below has a control that must turn it red."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from ws1_harness.run import chain_rollout  # noqa: E402
from ws1_harness.run.chain import ChainError, resolve_path  # noqa: E402
from ws1_harness.run.chain_watch import StepWatch  # noqa: E402
from ws1_kernels import launches  # noqa: E402


@torch.library.custom_op("ws1_watchtest::double", mutates_args=())
def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_double.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _watch() -> StepWatch:
    return StepWatch(("ws1_watchtest",), frozenset({"triton:allowed"}))


def test_the_step_watch_passes_the_profiles_ops_glue_and_kernels() -> None:
    w = _watch()
    x = torch.ones(3)
    with w.watching():
        y = torch.ops.ws1_watchtest.double(x)
        y = y + 1  # glue: aten.add
        launches.record("triton:allowed", "fwd")
    assert w.problems() == []
    assert w.kernels == {"triton:allowed"}


def test_the_step_watch_names_a_stock_op_on_the_path() -> None:
    w = _watch()
    x = torch.ones(2, 2)
    with w.watching():
        torch.ops.ws1_watchtest.double(x) @ x  # a stock GEMM: aten.mm
    (p,) = w.problems()
    assert "aten.mm" in p.items and "step ops" in p.what


def test_the_step_watch_names_a_kernel_the_profile_does_not_declare() -> None:
    w = _watch()
    with w.watching():
        launches.record("triton:foreign", "fwd")
    (p,) = w.problems()
    assert p.items == ("triton:foreign",)


class _ReseedingGraph:
    """A stand-in for a captured CUDA graph: its replay dispatches what torch's replay dispatches, the CUDA
    generator's re-seeding (``aten.fill_`` on its seed and offset tensors), and no op of the step."""

    def __init__(self) -> None:
        self.seed = torch.zeros(1, dtype=torch.int64)

    def replay(self) -> None:
        self.seed.fill_(7)


def test_a_graph_replay_is_no_op_of_the_step() -> None:
    from ws1_kernels.integrations.step import replay

    w = _watch()
    graph = _ReseedingGraph()
    with w.watching():
        replay(graph)
    assert w.problems() == [] and int(graph.seed) == 7


def test_the_watch_sees_the_reseeding_of_a_bare_replay() -> None:
    """The control: the same replay called directly is seen, so the test above shows `replay` at work."""
    w = _watch()
    with w.watching():
        _ReseedingGraph().replay()
    (p,) = w.problems()
    assert p.items == ("aten.fill_",)


def test_ops_of_the_step_beside_a_replay_are_still_seen() -> None:
    from ws1_kernels.integrations.step import replay

    w = _watch()
    x = torch.ones(2, 2)
    with w.watching():
        replay(_ReseedingGraph())
        x @ x  # after the replay the watch is back
    (p,) = w.problems()
    assert p.items == ("aten.mm",)


@pytest.mark.parametrize(
    ("asked", "profile", "device", "stock", "want"),
    [
        ("call", "triton_cuda_bf16", "cuda", False, "call"),
        ("auto", "triton_cuda_bf16", "cuda", False, "step"),
        ("auto", "cuda_bf16", "cuda", False, "step"),
        ("auto", "cuda_bf16_sm90", "cuda", False, "step"),
        ("auto", "triton_cuda_bf16", "cpu", False, "call"),  # the interpreter: no graphs, the call path
        ("auto", "portable_cpu", "cpu", False, "call"),
        ("auto", "native_torch", "cuda", True, "call"),
        ("step", "triton_cuda_bf16", "cpu", False, "step"),
    ],
)
def test_the_rollout_path_is_resolved(asked, profile, device, stock, want) -> None:  # type: ignore[no-untyped-def]
    assert resolve_path(asked, profile, device, stock=stock) == want


@pytest.mark.parametrize(
    ("asked", "profile", "stock", "needle"),
    [
        ("step", "portable_cpu", False, "no inference step ops"),
        ("step", "triton_cuda_bf16", True, "stock profile"),
        ("graph", "triton_cuda_bf16", False, "must be one of"),
    ],
)
def test_a_step_path_that_cannot_run_is_one_line(asked, profile, stock, needle) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ChainError, match=needle) as exc:
        resolve_path(asked, profile, "cuda", stock=stock)
    assert "\n" not in str(exc.value)


def test_graph_buckets_cover_the_running_requests_on_cuda_only() -> None:
    class Fx:
        num_samples = 6  # max_running 5

    assert chain_rollout.graph_buckets(Fx(), "cuda") == (1, 2, 4, 8)  # type: ignore[arg-type]
    assert chain_rollout.graph_buckets(Fx(), "cpu") == ()  # type: ignore[arg-type]


def test_a_planted_candidate_rolls_out_on_the_call_path() -> None:
    """A chain whose path is `step` still judges a model with a replaced candidate: that rollout runs on the call
    path (the step path would bypass the plant) and the record says so. The control: without the plant the
    same chain asks for the step path, which portable_cpu lacks, and the rollout refuses."""
    pytest.importorskip("transformers")
    from ws1_harness.run.chain import Chain, ChainSettings
    from ws1_kernels import KernelInputError, portable
    from ws1_kernels.integrations import qwen3

    chain = Chain(
        ChainSettings(profile="portable_cpu", model="tiny", layers=1, tiers=("short",), progress=False)
    )
    chain.rollout_path = "step"  # as on a GPU profile
    model = chain.model()
    qwen3.runtime_of(model).override("swiglu", portable.swiglu, "the same swiglu, replaced")
    cell = chain.cell("short", model=model)
    assert cell.rollout["path"] == "call"
    watch = next(j for j in cell.judgments if j.name == "op_watch")
    assert watch.detail["rollout_path"] == "call"
    with pytest.raises(KernelInputError, match="no inference step ops"):
        chain.cell("short")
