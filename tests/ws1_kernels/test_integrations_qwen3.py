"""The Qwen3 drop-in: a transformers model whose every chain node runs a profile's candidate.

Cheap: the tiny model cut to one layer, the short tier, in process. Each property has a negative control.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from ws1_contract import load_contract  # noqa: E402
from ws1_kernels import KernelInputError, LayoutContext  # noqa: E402
from ws1_kernels.integrations import qwen3  # noqa: E402
from ws1_workload import (  # noqa: E402
    build_layout,
    next_token_targets,
    restore,
)


def _logprobs(model, fx, layout):
    outs = []
    for call in layout.calls:
        ctx = LayoutContext(call.sample_ids, call.positions)
        logits, hctx = qwen3.forward_call(model, call.token_ids, ctx)
        outs.append(
            qwen3.logprobs(model, logits, next_token_targets(fx, call.sample_ids, call.positions), hctx)
        )
    return restore(layout, [o.detach() for o in outs])


def _max_dlogp(a, b, fx):
    return float((a - b)[fx.scored].abs().max())


def test_importing_ws1_kernels_and_the_drop_in_does_not_import_transformers():
    probe = (
        "import sys, ws1_kernels, ws1_kernels.integrations.qwen3 as q, ws1_kernels.integrations.rollout\n"
        "before = 'transformers' in sys.modules\n"
        "from ws1_workload import load_manifest\n"
        "q.qwen3_config(load_manifest().model('tiny'))\n"  # negative control: building a config does import it
        "print(before, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["False", "True"]


#: fp32 vs fp32 agreement between two implementations of the same forward (not a gate tolerance)
HF_AGREEMENT = 1e-4


def _hf_logprobs(hf, fx) -> torch.Tensor:
    """HF next-token logprobs per sample alone, in ws1's convention (value at p scores token p + 1; last = 0)."""
    out = []
    with torch.no_grad():
        for s in fx.samples:
            logp = torch.log_softmax(hf(s.token_ids[None]).logits[0].float(), dim=-1)
            sel = logp[:-1].gather(1, s.token_ids[1:, None]).squeeze(1)
            out.append(torch.cat([sel, torch.zeros(1)]))
    return torch.cat(out)


def _hf(cfg, weights):
    import transformers

    model = transformers.Qwen3ForCausalLM(qwen3.qwen3_config(cfg, attn_implementation="eager")).float().eval()
    model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=True)
    return model


def test_fp32_drop_in_is_the_reference_chain_and_agrees_with_hf(tiny_one_layer):
    """The one fp32 reference chain is this drop-in on ws1_kernels.reference; stock transformers' Qwen3 is its
    independent check, on every training layout (the layouts the chain's trainer scores)."""
    m, cfg, weights, fx = tiny_one_layer
    want = _hf_logprobs(_hf(cfg, weights), fx)
    model = qwen3.build_model(qwen3.qwen3_config(cfg), weights, qwen3.REFERENCE_PROFILE)
    training = [spec for spec in m.layouts if spec.kind == "training"]
    assert {spec.type for spec in training} >= {"packed", "split", "padded", "permuted"}
    with torch.no_grad():
        for spec in training:
            got = _logprobs(model, fx, build_layout(fx, spec))
            assert got.dtype == torch.float32
            assert _max_dlogp(got, want, fx) < HF_AGREEMENT, spec.name  # over the scored tokens
    # negative control: the same drop-in with the q and k norms swapped is far off
    broken = dict(weights)
    pre = "model.layers.0.self_attn."
    broken[pre + "q_norm.weight"], broken[pre + "k_norm.weight"] = (
        weights[pre + "k_norm.weight"],
        weights[pre + "q_norm.weight"],
    )
    bad = qwen3.build_model(qwen3.qwen3_config(cfg), broken, qwen3.REFERENCE_PROFILE)
    with torch.no_grad():
        assert _max_dlogp(_logprobs(bad, fx, build_layout(fx, m.layout("packed"))), want, fx) > HF_AGREEMENT


def test_parameter_gradients_land_where_the_profile_rule_says(tiny_one_layer):
    m, cfg, weights, fx = tiny_one_layer
    layout = build_layout(fx, m.layout("packed"))
    for profile, attr in (("portable_cpu", "main_grad"), ("native_torch", "grad")):
        model = qwen3.build_model(qwen3.qwen3_config(cfg), weights, profile)
        qwen3.zero_param_grads(model)
        _logprobs_with_grad = []
        for call in layout.calls:
            ctx = LayoutContext(call.sample_ids, call.positions)
            logits, hctx = qwen3.forward_call(model, call.token_ids, ctx)
            lp = qwen3.logprobs(model, logits, next_token_targets(fx, call.sample_ids, call.positions), hctx)
            lp.sum().backward()
            _logprobs_with_grad.append(lp)
        grads = qwen3.param_grads(model)
        assert set(grads) == set(weights)
        for name, p in model.named_parameters():
            where = getattr(p, attr, None)
            assert where is not None and bool(where.abs().sum() > 0), (profile, name)
            assert grads[name] is where or torch.equal(grads[name], where)
            other = p.grad if attr == "main_grad" else getattr(p, "main_grad", None)
            assert other is None, (profile, name)  # nothing lands in the other place


def test_packed_hf_call_matches_forward_call_and_splits_at_position_restarts(tiny_one_layer):
    m, cfg, weights, fx = tiny_one_layer
    model = qwen3.build_model(qwen3.qwen3_config(cfg), weights, "portable_cpu")
    call = build_layout(fx, m.layout("packed")).calls[0]
    with torch.no_grad():
        want, _ = qwen3.forward_call(model, call.token_ids, LayoutContext(call.sample_ids, call.positions))
        got = model(input_ids=call.token_ids[None], position_ids=call.positions[None]).logits[0]
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
        # negative control: without position ids the row is one long sample, so the second sample attends the first
        one = model(input_ids=call.token_ids[None]).logits[0]
        assert not torch.equal(one, want)


def test_a_real_safetensors_checkpoint_loads_unchanged(tiny_one_layer, tmp_path):
    transformers = pytest.importorskip("transformers")
    m, cfg, weights, fx = tiny_one_layer
    config = qwen3.qwen3_config(cfg)
    hf = transformers.Qwen3ForCausalLM(config).to(torch.bfloat16)
    hf.save_pretrained(tmp_path / "ckpt")  # config.json + model.safetensors, as a hub checkpoint
    loaded = qwen3.swap(
        transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.bfloat16), "portable_cpu"
    )
    tensors = qwen3.load_safetensors(tmp_path / "ckpt")
    built = qwen3.build_model(config, tensors, "portable_cpu")
    layout = build_layout(fx, m.layout("packed"))
    with torch.no_grad():
        a, b = _logprobs(loaded, fx, layout), _logprobs(built, fx, layout)
    assert torch.equal(a, b)
    fp32 = {k: v.float() for k, v in tensors.items()}
    with torch.no_grad():
        ref = _logprobs(qwen3.build_model(config, fp32, qwen3.REFERENCE_PROFILE), fx, layout)
    assert _max_dlogp(a, ref, fx) <= load_contract().aggregates("bf16").max_abs_dlogp
    # negative control: a checkpoint missing a tensor is refused, not half-loaded
    tensors.pop("model.layers.0.mlp.up_proj.weight")
    with pytest.raises(KernelInputError, match="up_proj"):
        qwen3.build_model(config, tensors, "portable_cpu")


def test_unsupported_configs_are_refused(tiny_one_layer):
    _m, cfg, weights, _fx = tiny_one_layer
    config = qwen3.qwen3_config(cfg)
    qwen3.build_model(config, weights, "portable_cpu")  # the supported config builds
    config.tie_word_embeddings = True
    with pytest.raises(KernelInputError, match="tie_word_embeddings"):
        qwen3.build_model(config, weights, "portable_cpu")


def test_kv_cache_refuses_a_call_out_of_order(tiny_one_layer):
    m, cfg, weights, fx = tiny_one_layer
    model = qwen3.build_model(qwen3.qwen3_config(cfg), weights, "portable_cpu")
    cache = qwen3.KVCache(cfg.num_layers)
    ids = fx.samples[0].token_ids
    with torch.no_grad():
        qwen3.forward_call(
            model, ids[:4], LayoutContext(torch.zeros(4, dtype=torch.int64), torch.arange(4)), cache=cache
        )
        qwen3.forward_call(
            model, ids[4:6], LayoutContext(torch.zeros(2, dtype=torch.int64), torch.arange(4, 6)), cache=cache
        )
        assert cache.length(0) == 6
        with pytest.raises(KernelInputError, match="cache holds 6 keys"):  # a chunk skipped
            qwen3.forward_call(
                model,
                ids[7:8],
                LayoutContext(torch.zeros(1, dtype=torch.int64), torch.tensor([7])),
                cache=cache,
            )
