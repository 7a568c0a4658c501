"""The op watch on the whole swapped model: every dispatched op belongs to a candidate that declares it, or to the
drop-in's glue. Negative controls: a stock module left on the path, and a candidate that records no kernel id."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from ws1_harness.run.chain_watch import GLUE, NodeDump, NodeWatch, first_difference, tapped  # noqa: E402
from ws1_kernels import LayoutContext, portable  # noqa: E402
from ws1_kernels.integrations import qwen3  # noqa: E402
from ws1_workload import (  # noqa: E402
    build_layout,
    next_token_targets,
)


def _train_step(model, fx, layout, watch=None):
    """Forward and backward of every call, the watch open around the model only (``main_grad`` is created by the
    candidates; a planted stock module owns a parameter ``zero_param_grads`` would refuse)."""
    for call in layout.calls:
        ctx = LayoutContext(call.sample_ids, call.positions)
        targets = next_token_targets(fx, call.sample_ids, call.positions)
        with watch.watching() if watch else torch.enable_grad():
            logits, hctx = qwen3.forward_call(model, call.token_ids, ctx)
            lp = qwen3.logprobs(model, logits, targets, hctx)
            lp.backward(torch.ones_like(lp))  # a loss reduction would be the trainer's op, not the model's


def _watched(tiny_one_layer, plant=None):
    m, cfg, weights, fx = tiny_one_layer
    model = qwen3.build_model(qwen3.qwen3_config(cfg), weights, "portable_cpu")
    if plant is not None:
        plant(model)
    rt = qwen3.runtime_of(model)
    watch = NodeWatch(rt)
    with tapped(rt, watch):
        _train_step(model, fx, build_layout(fx, m.layout("split_1")), watch)
    return watch, model


class StockLinear(torch.nn.Module):
    """A stock projection left in place: F.linear, which dispatches aten.mm like the det_gemm candidate."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, x, ctx):
        return F.linear(x, self.weight)


class StockRMSNorm(torch.nn.Module):
    """transformers' Qwen3RMSNorm math left in place."""

    def __init__(self, weight, eps):
        super().__init__()
        self.weight, self.eps = weight, eps

    def forward(self, x, ctx):
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def test_nothing_stock_is_left_on_the_swapped_path(tiny_one_layer):
    watch, model = _watched(tiny_one_layer)
    assert watch.problems() == []
    assert set(watch.sites) == {site.name for site in qwen3.sites(model)}  # every node was seen


def test_a_stock_projection_left_in_place_is_caught(tiny_one_layer):
    def plant(model):
        mlp = model.model.layers[0].mlp
        mlp.down_proj = StockLinear(mlp.down_proj.weight)

    problems = _watched(tiny_one_layer, plant)[0].problems()
    glue = [p for p in problems if p.node == GLUE]
    assert glue and "aten.mm" in glue[0].items


def test_a_stock_norm_left_in_place_is_caught(tiny_one_layer):
    def plant(model):
        layer = model.model.layers[0]
        layer.post_attention_layernorm = StockRMSNorm(layer.post_attention_layernorm.weight, 1e-6)

    problems = _watched(tiny_one_layer, plant)[0].problems()
    assert any(p.node == GLUE and "aten.rsqrt" in p.items for p in problems)


def test_a_candidate_that_delegates_to_a_stock_op_is_caught(tiny_one_layer):
    def plant(model):  # a "candidate" that records nothing and runs stock silu
        qwen3.runtime_of(model).override("swiglu", lambda g, u, ctx: F.silu(g) * u, "stock swiglu")

    problems = _watched(tiny_one_layer, plant)[0].problems()
    node = "model.layers.0.mlp.swiglu"
    assert any(p.node == node and "aten.silu" in p.items for p in problems)
    assert any(p.node == node and "no kernel id" in p.what for p in problems)


def test_first_difference_names_the_first_node_and_token(tiny_one_layer):
    m, cfg, weights, fx = tiny_one_layer
    layout = build_layout(fx, m.layout("packed"))

    def dump(plant=None):
        model = qwen3.build_model(qwen3.qwen3_config(cfg), weights, "portable_cpu")
        if plant:
            plant(model)
        d = NodeDump()
        with tapped(qwen3.runtime_of(model), d):
            _train_step(model, fx, layout)
        return d

    clean = dump()
    assert first_difference(clean, dump(), phases=("forward", "backward")) is None  # the same run agrees

    def perturb_sample_1(model):  # rope that moves sample 1's rows by one ulp-ish step
        def rope(x, theta, ctx):
            out = portable.rope(x, theta, ctx)
            return out * torch.where(ctx.sample_ids == 1, 1.0078125, 1.0).to(out.dtype)[:, None, None]

        qwen3.runtime_of(model).override("rope", rope, "perturbed rope")

    diff = first_difference(clean, dump(perturb_sample_1))
    assert diff is not None
    assert (diff.node, diff.operator, diff.layer, diff.phase) == (
        "model.layers.0.self_attn.rope_q",
        "rope",
        0,
        "forward",
    )
    assert diff.token == (1, 0)
