"""The step path on ``triton_cuda_bf16`` (``integrations.step`` with ``triton_ops.step_ops``): eager,
``torch.compile(fullgraph=True)`` (inductor) and a CUDA graph give, bit for bit, the rows of one packed
``forward_call`` (the path the gate judges).

The scenario (``step_support``): chunked prefill, decode, a request leaving and another taking its slot, graph
buckets with pad rows. On the GPU a decode row sits in another MMA tile than in the packed call; this is where
that is proved. The negative control shifts every row's key count by one and must change the bits."""

from __future__ import annotations

import pytest
from cuda_only import skip_module_without_cuda

pytestmark = [pytest.mark.gpu]

skip_module_without_cuda("triton", "transformers")

from step_support import gpu_model, short_plan_mismatches, step_mismatches  # noqa: E402

from ws1_kernels.integrations.step import step_ops  # noqa: E402

PROFILE = "triton_cuda_bf16"


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    return gpu_model(PROFILE)


@pytest.mark.parametrize("mode", ["eager", "compiled", "graph"])
def test_steps_give_the_packed_forward_bits(model, mode: str) -> None:  # type: ignore[no-untyped-def]
    assert step_mismatches(model, step_ops(PROFILE), mode) == []


def test_a_plan_one_key_short_changes_the_bits(model) -> None:  # type: ignore[no-untyped-def]
    bad, rows = short_plan_mismatches(model, step_ops(PROFILE))
    assert len(bad) > rows // 2  # every row past position 0 sees one key fewer
