"""The fp32 reference chain agrees with HF transformers' Qwen3ForCausalLM on the tiny model, on every layout.

This tests our reference itself (an fp32-vs-fp32 agreement bound), not a gate threshold.
"""

from __future__ import annotations

import pytest
import torch

from ws1_workload import LayoutError, WorkloadError, build_fixture, build_layout, reference_chain

#: fp32 vs fp32 agreement between two implementations of the same forward (not a gate tolerance).
HF_AGREEMENT = 1e-4


def _hf_logprobs(hf, fx) -> torch.Tensor:
    """HF next-token logprobs per sample alone, in our convention (value at p scores token p + 1; last = 0)."""
    out = []
    with torch.no_grad():
        for s in fx.samples:
            logp = torch.log_softmax(hf(s.token_ids[None]).logits[0].float(), dim=-1)
            sel = logp[:-1].gather(1, s.token_ids[1:, None]).squeeze(1)
            out.append(torch.cat([sel, torch.zeros(1)]))
    return torch.cat(out)


@pytest.mark.parametrize("tier", ["short", "primary"])
def test_reference_matches_hf_on_every_layout(manifest, tiny_weights, hf_tiny, tier):
    fx = build_fixture(manifest, tier)
    want = _hf_logprobs(hf_tiny, fx)
    cfg = manifest.model("tiny")
    types = set()
    for spec in manifest.layouts:
        got = reference_chain(build_layout(fx, spec), cfg, tiny_weights)
        assert got.dtype == torch.float32 and got.shape == (fx.total_tokens,)
        diff = (got - want).abs().max().item()
        assert diff < HF_AGREEMENT, f"{spec.name}: max |dlogp| {diff}"
        types.add(spec.type)
    assert {"packed", "chunked", "decode"} <= types


@pytest.mark.slow
def test_reference_matches_hf_on_long_tier(manifest, tiny_weights, hf_tiny):
    fx = build_fixture(manifest, "long")
    want = _hf_logprobs(hf_tiny, fx)
    for name in ("packed", "chunked", "decode"):
        got = reference_chain(build_layout(fx, manifest.layout(name)), manifest.model("tiny"), tiny_weights)
        assert (got - want).abs().max().item() < HF_AGREEMENT, name


def test_scored_positions_are_real_logprobs(manifest, tiny_weights):
    fx = build_fixture(manifest, "primary")
    got = reference_chain(build_layout(fx, manifest.layout("packed")), manifest.model("tiny"), tiny_weights)
    assert bool((got[fx.scored] < 0).all()) and bool(torch.isfinite(got).all())
    last = torch.tensor([fx.offsets[s.sample_id] + s.length - 1 for s in fx.samples])
    assert bool((got[last] == 0).all())


def test_bad_inputs_raise(manifest, tiny_weights):
    fx = build_fixture(manifest, "short")
    cfg = manifest.model("tiny")
    partial = dict(tiny_weights)
    partial.pop("lm_head.weight")
    with pytest.raises(WorkloadError, match="missing tensor 'lm_head.weight'"):
        reference_chain(build_layout(fx, manifest.layout("packed")), cfg, partial)
    chunked = build_layout(fx, manifest.layout("chunked"))
    reversed_calls = type(chunked)(name="rev", kind="inference", fixture=fx, calls=chunked.calls[::-1])
    with pytest.raises(LayoutError, match="key prefix"):
        reference_chain(reversed_calls, cfg, tiny_weights)
