"""The upstream gradient drawn in its output's dtype has the bits of the fp32 definition (drawn in fp32, probe values
written, masked to the active tokens, rounded to the output dtype).

Why it matters: lm_head's upstream is `[T, 151936]`; drawing and masking it in bf16 saves three full-size fp32
copies, which is only a speed change if no value moves (`ws1_harness.run.unit.upstream_draw_dtype`)."""

from __future__ import annotations

import pytest
import torch

from ws1_harness.run.adapters import build_adapters
from ws1_harness.run.tasks import UnitTask
from ws1_harness.run.unit import logical_inputs
from ws1_workload import build_fixture, load_manifest
from ws1_workload.inputs import logical_tensor
from ws1_workload.token_probes import apply_edit

MANIFEST = load_manifest()
MODEL = MANIFEST.model("tiny")
ADAPTERS = build_adapters(MODEL)


def _definition(operator: str, tier: str, case_id: str, active_override: int | None = None) -> torch.Tensor:
    """The upstream as it was defined before the bf16 draw: fp32 throughout, rounded once at the end."""
    adapter = ADAPTERS[operator]
    fx = build_fixture(MANIFEST, tier, "tiny")
    samples = sorted(fx.samples, key=lambda s: s.sample_id)
    keys = [(s.sample_id, p) for s in samples for p in range(s.length)]
    name = f"{operator}.upstream"
    g = logical_tensor(case_id, name, keys, adapter.output_row_shape, torch.float32,
                       hard_rows=fx.hard_rows.get(name, ()))  # fmt: skip
    g = apply_edit(g, keys, fx.token_edits.get(name))
    active = torch.cat([s.active for s in samples]).bool()
    if active_override is not None:
        active = active.clone()
        active[active_override] = not bool(active[active_override])
    mask = active.reshape(-1, *([1] * len(adapter.output_row_shape))).float()
    return (g * mask).to(adapter.output_dtype)


def _upstream(operator: str, tier: str) -> tuple[torch.Tensor, str]:
    task = UnitTask("portable_cpu", operator, tier, model="tiny")
    fx = build_fixture(MANIFEST, tier, "tiny")
    inputs = logical_inputs(ADAPTERS[operator], fx, task.case_id, MODEL.pad_id, True, "cpu", task.param_case)
    assert inputs.upstream is not None
    return inputs.upstream, task.case_id


def _bits(t: torch.Tensor) -> torch.Tensor:
    width = {2: torch.int16, 4: torch.int32}[t.element_size()]
    return t.contiguous().view(width)


@pytest.mark.parametrize("tier", ["short", "primary", "long"])
@pytest.mark.parametrize("operator", ["lm_head", "det_gemm", "logp"])
def test_the_upstream_has_the_fp32_definition_s_bits(operator: str, tier: str) -> None:
    got, case_id = _upstream(operator, tier)
    if operator != "logp":  # the probe values and hard rows are in what is compared
        fx = build_fixture(MANIFEST, tier, "tiny")
        assert fx.token_edits.get(f"{operator}.upstream") and fx.hard_rows.get(f"{operator}.upstream")
    want = _definition(operator, tier, case_id)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(_bits(got), _bits(want))


def test_the_control_one_token_s_mask_changes_the_bits() -> None:
    """Negative control: the comparison above sees one row masked otherwise (a prompt row made active)."""
    got, case_id = _upstream("lm_head", "short")
    fx = build_fixture(MANIFEST, "short", "tiny")
    active = torch.cat([s.active for s in sorted(fx.samples, key=lambda s: s.sample_id)]).bool()
    prompt_row = int((~active).nonzero()[0])
    assert not torch.equal(
        _bits(got), _bits(_definition("lm_head", "short", case_id, active_override=prompt_row))
    )
