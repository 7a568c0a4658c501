"""The step path on ``cuda_bf16`` (``integrations.step``): eager, ``torch.compile(fullgraph=True)`` and a CUDA
graph give, bit for bit, the rows of one packed ``forward_call`` (the path the gate judges).

The scenario (``step_support``): chunked prefill, decode, a request leaving and another taking its slot, graph
buckets with pad rows. The negative control shifts every row's key count by one and must change the bits."""

from __future__ import annotations

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

from step_support import gpu_model, short_plan_mismatches, step_mismatches  # noqa: E402

from ws1_kernels.integrations.step import step_ops  # noqa: E402


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    return gpu_model("cuda_bf16")


@pytest.mark.parametrize("mode", ["eager", "compiled", "graph"])
def test_steps_give_the_packed_forward_bits(model, mode: str) -> None:  # type: ignore[no-untyped-def]
    assert step_mismatches(model, step_ops("cuda_bf16"), mode) == []


def test_a_plan_one_key_short_changes_the_bits(model) -> None:  # type: ignore[no-untyped-def]
    bad, rows = short_plan_mismatches(model, step_ops("cuda_bf16"))
    assert len(bad) > rows // 2  # every row past position 0 sees one key fewer
