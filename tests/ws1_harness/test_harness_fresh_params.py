"""Each layout's parameters (`layouts_exec._fresh_params`): a new leaf holding the logical parameter's bits and a
zeroed main_grad, also when the layouts after the canonical one reuse pooled storage for them."""

from __future__ import annotations

import pytest
import torch

from ws1_harness.run.compare import raw_bits_equal
from ws1_harness.run.layouts_exec import (
    PARAM_RULE_AUTOGRAD,
    PARAM_RULE_MAIN_GRAD,
    LogicalInputs,
    _fresh_params,
)


def _inputs() -> LogicalInputs:
    weight = torch.randn(64, 32, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    return LogicalInputs(tokens={}, params={"weight": weight}, upstream=None, offsets={}, keys=[])


@pytest.mark.parametrize("rule", [PARAM_RULE_MAIN_GRAD, PARAM_RULE_AUTOGRAD])
def test_a_pooled_leaf_is_new_and_clean_after_a_layout_wrote_its_weight(rule: str) -> None:
    inputs = _inputs()
    logical = inputs.params["weight"]
    pool: dict[str, torch.Tensor] = {}
    first = _fresh_params(inputs, True, rule, pool)["weight"]
    first.data.add_(1.0)  # a candidate that writes its weight through .data (no version bump)
    first.grad = torch.ones_like(first)
    if rule == PARAM_RULE_MAIN_GRAD:
        first.main_grad.add_(3.0)  # type: ignore[attr-defined]
    second = _fresh_params(inputs, True, rule, pool)["weight"]
    assert second is not first and second.is_leaf and second.requires_grad and second.grad is None
    assert raw_bits_equal(second, logical)  # the logical bits again, not the previous layout's writes
    assert second.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()  # the pooled storage
    if rule == PARAM_RULE_MAIN_GRAD:
        assert not bool(second.main_grad.any())  # type: ignore[attr-defined]
    # the logical parameter itself is never written
    assert raw_bits_equal(logical, _inputs().params["weight"])
    # control: without a pool (the canonical layout) each leaf is a fresh copy of its own
    alone = _fresh_params(inputs, True, rule, None)["weight"]
    assert alone.data_ptr() != second.data_ptr() and raw_bits_equal(alone, logical)
