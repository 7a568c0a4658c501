"""The compile-ready training path on ``triton_cuda_bf16`` (``integrations.train_compiled``): eager, and
``torch.compile(fullgraph=True)`` with aot_eager and with inductor, give the judged path's logprobs and every
weight's main_grad bit for bit (bf16 on the GPU, the tiny model at two layers); a lost packing boundary must
change them.

Inductor runs with ``emulate_precision_casts``: where it fuses the sum of a tensor's gradients (h feeds q, k and
v) it would otherwise round once in fp32 instead of after each bf16 add, as eager autograd does."""

from __future__ import annotations

import pytest
import torch
from cuda_only import skip_module_without_cuda

pytestmark = [pytest.mark.gpu]

skip_module_without_cuda("triton", "transformers")

from step_support import gpu_model  # noqa: E402
from train_support import bit_mismatches, judged, packed_call, trained  # noqa: E402

from ws1_kernels import LayoutContext  # noqa: E402

PROFILE = "triton_cuda_bf16"


@pytest.fixture(scope="module")
def case():  # type: ignore[no-untyped-def]
    model = gpu_model(PROFILE)
    ids, targets, ctx, coef = packed_call(model.lm_head.weight.shape[0], "cuda")
    return model, ids, targets, ctx, coef, judged(model, ctx, ids, targets, coef)


@pytest.mark.parametrize("backend", [None, "aot_eager", "inductor"])
def test_the_training_path_gives_the_judged_bits(case, backend) -> None:  # type: ignore[no-untyped-def]
    model, ids, targets, ctx, coef, ref = case
    torch._dynamo.reset()
    with torch._inductor.config.patch(emulate_precision_casts=True):
        got = trained(model, ctx, ids, targets, coef, compile_backend=backend)
    assert bit_mismatches(got, ref) == []


def test_a_lost_packing_boundary_changes_the_bits(case) -> None:  # type: ignore[no-untyped-def]
    model, ids, targets, ctx, coef, ref = case
    sid, pos = ctx.sample_ids.clone(), ctx.positions.clone()
    second = sid == 1
    pos[second] += int((sid == 0).sum())
    sid[second] = 0
    bad = bit_mismatches(trained(model, LayoutContext(sid, pos), ids, targets, coef), ref)
    assert "logprobs" in bad and len(bad) > 5
