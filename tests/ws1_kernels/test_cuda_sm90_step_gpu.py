"""The step path on ``cuda_bf16_sm90`` (the generic step ops with the Hopper GEMM): eager,
``torch.compile(fullgraph=True)`` and a CUDA graph give, bit for bit, the rows of one packed ``forward_call`` on
the same profile. The scenario and its control are ``step_support``'s, as for the other two profiles."""

from __future__ import annotations

import pytest
from cuda_only import skip_module_without_hopper

pytestmark = [pytest.mark.gpu, pytest.mark.needs_build, pytest.mark.sm90]

skip_module_without_hopper()
pytest.importorskip("transformers")

from step_support import gpu_model, short_plan_mismatches, step_mismatches  # noqa: E402

from ws1_kernels.integrations.step import step_ops  # noqa: E402

PROFILE = "cuda_bf16_sm90"


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    return gpu_model(PROFILE)


@pytest.mark.parametrize("mode", ["eager", "compiled", "graph"])
def test_steps_give_the_packed_forward_bits(model, mode: str) -> None:  # type: ignore[no-untyped-def]
    assert step_mismatches(model, step_ops(PROFILE), mode) == []


def test_a_plan_one_key_short_changes_the_bits(model) -> None:  # type: ignore[no-untyped-def]
    bad, rows = short_plan_mismatches(model, step_ops(PROFILE))
    assert len(bad) > rows // 2  # every row past position 0 sees one key fewer
