"""The step path on ``cuda_bf16`` (``integrations.step``): eager, ``torch.compile(fullgraph=True)`` and a CUDA
graph give, bit for bit, the rows of one packed ``forward_call`` (the path the gate judges).

The scenario (``step_support``): chunked prefill, decode, a request leaving and another taking its slot, graph
buckets with pad rows. The negative control shifts every row's key count by one and must change the bits."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from ws1_kernels import cuda

pytestmark = [pytest.mark.gpu, pytest.mark.needs_build]

if cuda.extension() is None or not torch.cuda.is_available():
    if os.environ.get("WS1_REQUIRE_GPU") == "1":
        raise RuntimeError(f"WS1_REQUIRE_GPU=1: {cuda.missing_reason() or 'no CUDA device'}")
    pytest.skip(str(cuda.missing_reason() or "no CUDA device"), allow_module_level=True)
pytest.importorskip("transformers")

from step_support import packed_logits, run_steps, sequences  # noqa: E402

from ws1_kernels.integrations import qwen3  # noqa: E402
from ws1_kernels.integrations.step import StepPlan, step_ops  # noqa: E402


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    import dataclasses as dc

    from ws1_workload import load_manifest, synthetic_weights, tensor_shapes

    m = load_manifest()
    cfg = dc.replace(m.model("tiny"), num_layers=2)
    weights = synthetic_weights(m, "tiny", names=tensor_shapes(cfg))
    return qwen3.build_model(qwen3.qwen3_config(cfg), weights, "cuda_bf16", device="cuda")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def _mismatched(got: dict, ref: dict) -> list:
    assert set(got) == set(ref)
    return [k for k in sorted(ref) if not torch.equal(_bits(got[k]), _bits(ref[k]))]


@pytest.mark.parametrize("mode", ["eager", "compiled", "graph"])
def test_steps_give_the_packed_forward_bits(model, mode: str) -> None:  # type: ignore[no-untyped-def]
    seqs = sequences(model.lm_head.weight.shape[0], "cuda")
    ref = packed_logits(model, seqs)
    got = run_steps(model, step_ops("cuda_bf16"), seqs, mode=mode)
    assert _mismatched(got, ref) == []


def test_a_plan_one_key_short_changes_the_bits(model) -> None:  # type: ignore[no-untyped-def]
    seqs = sequences(model.lm_head.weight.shape[0], "cuda")
    ref = packed_logits(model, seqs)

    def short(plan: StepPlan) -> StepPlan:
        return dataclasses.replace(plan, n_keys=(plan.n_keys - 1).clamp(min=1))

    bad = _mismatched(run_steps(model, step_ops("cuda_bf16"), seqs, tamper=short), ref)
    assert len(bad) > len(ref) // 2  # every row past position 0 sees one key fewer
