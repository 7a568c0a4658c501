"""A weight belongs to the model, not to the batch: every tier of an operator judges the same weight."""

from __future__ import annotations

import torch

from ws1_harness.run.adapters import build_adapters
from ws1_harness.run.tasks import UnitTask
from ws1_harness.run.unit import logical_inputs
from ws1_workload import build_fixture, load_manifest


def _weight(tier: str, param_case: str | None) -> torch.Tensor:
    manifest = load_manifest()
    model = manifest.model("tiny")
    adapter = build_adapters(model)["det_gemm"]
    task = UnitTask("portable_cpu", "det_gemm", tier, model="tiny")
    fx = build_fixture(manifest, tier)
    return logical_inputs(adapter, fx, task.case_id, model.pad_id, False, "cpu", param_case).params["weight"]


def test_tiers_of_an_operator_share_their_weight() -> None:
    case = UnitTask("portable_cpu", "det_gemm", "short", model="tiny").param_case
    assert case == UnitTask("portable_cpu", "det_gemm", "primary", model="tiny").param_case
    assert torch.equal(_weight("short", case), _weight("primary", case))


def test_without_a_param_case_the_weight_follows_the_case() -> None:
    """Negative control: seeded by the case id (which names the tier), the two tiers' weights differ."""
    assert not torch.equal(_weight("short", None), _weight("primary", None))
