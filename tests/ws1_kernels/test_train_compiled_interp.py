"""The compile-ready training path (``integrations.train_compiled`` on ``triton_ops.train_ops``) under
TRITON_INTERPRET=1, in fp32 (the interpreter's bf16 dot is not faithful: see conftest's ``triton_fp32_model``):
eager and ``torch.compile(fullgraph=True)`` give the judged path's logprobs and every weight's main_grad bit for
bit, and a wrong layout is seen. The same launches in the same slots as the judged call, so no ``seq_dot``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
pytest.importorskip("transformers")

from kernels_support import interp_only  # noqa: E402
from train_support import bit_mismatches, judged, packed_call, trained  # noqa: E402

from ws1_kernels import LayoutContext  # noqa: E402
from ws1_kernels.errors import KernelInputError  # noqa: E402

pytestmark = interp_only()


@pytest.fixture(scope="module")
def case(triton_fp32_model):  # type: ignore[no-untyped-def]
    """(model, ids, targets, ctx, coef, the judged (logprobs, main_grads)), computed once."""
    model = triton_fp32_model
    ids, targets, ctx, coef = packed_call(model.lm_head.weight.shape[0], "cpu")
    return model, ids, targets, ctx, coef, judged(model, ctx, ids, targets, coef)


def test_the_judged_case_has_teeth(case) -> None:  # type: ignore[no-untyped-def]
    """Real logprobs and a non-zero gradient in every weight: a path that skipped a weight would be seen."""
    *_, (lp, grads) = case
    assert bool(torch.isfinite(lp).all()) and float(lp.abs().min()) > 0
    assert [n for n, g in grads.items() if not bool(g.abs().sum() > 0)] == []


@pytest.mark.parametrize("backend", [None, "aot_eager"], ids=["eager", "compiled"])
def test_the_training_path_gives_the_judged_bits(case, backend) -> None:  # type: ignore[no-untyped-def]
    """Eager, then ``torch.compile(fullgraph=True)`` (a graph break would raise): the logprobs and every
    main_grad equal the judged path's bit for bit."""
    model, ids, targets, ctx, coef, ref = case
    got = trained(model, ctx, ids, targets, coef, compile_backend=backend)
    assert bit_mismatches(got, ref) == []


def test_a_wrong_layout_changes_the_bits(case) -> None:  # type: ignore[no-untyped-def]
    """The control: the first two samples read as one (a packing boundary lost) changes the logprobs of the
    second and the gradients."""
    model, ids, targets, ctx, coef, ref = case
    sid = ctx.sample_ids.clone()
    pos = ctx.positions.clone()
    n0 = int((sid == 0).sum())
    second = sid == 1
    sid[second] = 0
    pos[second] = pos[second] + n0
    got = trained(model, LayoutContext(sid, pos), ids, targets, coef)
    bad = bit_mismatches(got, ref)
    assert "logprobs" in bad and len(bad) > 5


def test_an_op_outside_a_train_scope_is_refused(case) -> None:  # type: ignore[no-untyped-def]
    from ws1_kernels.integrations.train_compiled import TrainWeights, train_logprobs

    model, ids, targets, *_ = case
    with pytest.raises(KernelInputError, match="no train_scope is open"):
        train_logprobs(TrainWeights.of(model), ids, targets)
