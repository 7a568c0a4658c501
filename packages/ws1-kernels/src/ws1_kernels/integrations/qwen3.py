"""A drop-in for Hugging Face transformers' ``Qwen3ForCausalLM``: every chain node runs a profile's candidate.

``swap(model, profile)`` replaces, in place, the embedding, every RMSNorm, the QK-norms, the q/k/v/o and MLP
projections, the final norm and the lm_head by ws1 modules that hold the same ``nn.Parameter`` objects (so the
state dict keeps Hugging Face's names and a checkpoint loads unchanged) and call the candidates that
``registry.resolve(profile, operator, device)`` returns; RoPE, attention, SwiGLU and the selected-token logprob,
which transformers does inline, become candidate calls too. transformers' rotary module and mask builders are
removed from the path: positions come from the ``LayoutContext``.

Why this shape: a batch-invariant kernel is only worth something if the whole model runs on it, and a wrapper
that leaves one stock op on the path (a stock ``nn.Linear`` whose GEMM switches path with the row count) makes
the rollout and the trainer disagree again. So the drop-in owns the whole forward of a physical call:

    logits, hctx = forward_call(model, token_ids[T], ctx, cache=None | KVCache, head_rows=None | rows)
    logp = logprobs(model, logits, targets, hctx)            # fp32 [rows]

Packed varlen rows carry their ``(sample_id, position)`` in ``ctx``; attention gets each sample's earlier keys
from the ``KVCache`` as the context's ``kv_prefix`` (chunked prefill, decode). Between candidate calls the
drop-in itself runs only the ops in ``GLUE_OPS`` (the residual add, and ops that move data); the harness's op
watch checks that. Parameter gradients land where each candidate's ``param_grad_rule`` puts them
(``zero_param_grads`` / ``param_grads``). ``tap`` objects see every candidate call (the harness watches ops and
dumps node outputs through them). The fp32 reference (``REFERENCE_PROFILE``) is the same drop-in on
``ws1_kernels.reference`` (textbook fp32 torch, TF32 off) with fp32 weights: the gold side of gradient accuracy.

transformers is imported only by ``qwen3_config`` and ``build_model``; ``swap`` works on any module tree with
Qwen3's attribute names.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .. import reference, registry
from ..context import LayoutContext
from ..errors import KernelInputError

if TYPE_CHECKING:
    from .kv_slots import SlotKVCache

#: The pseudo-profile of the fp32 reference drop-in (``ws1_kernels.reference``; weights must be fp32).
REFERENCE_PROFILE = "fp32_reference"

#: The operators the drop-in calls, in the order a layer first calls them: the model's structure, a subset of the
#: operator spec's (checked at import). ``silu`` and ``linear_logp`` are not on the path: the MLP uses the fused
#: ``swiglu`` (``silu(gate) * up``), the head ``lm_head`` then ``logp``.
CHAIN_OPERATORS: tuple[str, ...] = (
    "embedding",
    "rms_norm",
    "det_gemm",
    "qk_norm",
    "rope",
    "attention",
    "swiglu",
    "lm_head",
    "logp",
)

if not set(CHAIN_OPERATORS) <= set(registry.OPERATORS):
    raise ImportError(
        f"qwen3 drop-in: {sorted(set(CHAIN_OPERATORS) - set(registry.OPERATORS))} not in the spec"
    )

#: Ops the drop-in itself dispatches between candidate calls, forward and backward. Each moves or selects data,
#: except ``aten.add``: the residual add (the inventory item ``residual_add`` of the small elementwise steps, judged there) and autograd's sum
#: of the two gradients of a tensor used twice (the residual stream). Anything else outside a candidate call is a
#: stock module left on the path.
GLUE_OPS: Mapping[str, str] = types.MappingProxyType(
    {
        "aten.add": "residual add; autograd's sum of the gradients of the residual stream",
        "aten.cat": "KV cache append (inference only)",
        "aten.copy_": "KV cache slot write (inference only: SlotKVCache)",
        "aten.select": "a layer's KV cache slot (inference only: SlotKVCache)",
        "aten.slice": "KV cache rows and sample rows (inference only)",
        "aten.index_select": "the rows of a call that need logits (inference only)",
    }
)

_SUPPORTED = "Qwen3 dense: silu MLP, no biases, untied lm_head, full attention, default RoPE"


@dataclass(frozen=True)
class Site:
    """One chain node of the model: its module path (Hugging Face names), operator and layer (None outside)."""

    name: str
    operator: str
    layer: int | None = None


class Tap:
    """Sees every candidate call. The default only calls the candidate; the harness subclasses it to watch the
    dispatched ops of each node or to dump node outputs in logical order."""

    def call(
        self, site: Site, fn: Callable[..., torch.Tensor], args: tuple[Any, ...], ctx: LayoutContext
    ) -> Any:
        return fn(*args)


@dataclass
class Runtime:
    """The candidates behind one swapped model: ``fns[operator]`` and each operator's ``param_grad_rule``.

    ``candidates`` holds the registry's ``Candidate`` per operator (empty for the fp32 reference);
    ``overrides`` names operators whose function was replaced after the swap (tests plant broken ones; the
    harness records them).
    """

    profile: str
    device: str
    fns: dict[str, Callable[..., Any]]
    rules: dict[str, str | None]
    candidates: dict[str, registry.Candidate] = field(default_factory=dict)
    overrides: dict[str, str] = field(default_factory=dict)
    tap: Tap = field(default_factory=Tap)

    @classmethod
    def resolve(cls, profile: str, device: str = "cpu") -> Runtime:
        """Every chain operator's candidate, fail-closed (``CandidateUnavailable`` names the missing one)."""
        if profile == REFERENCE_PROFILE:
            fns = {op: reference.of(op) for op in CHAIN_OPERATORS}
            rules = {op: ("autograd_accumulate" if op in registry.PARAM_OPERATORS else None) for op in fns}
            return cls(profile, device, fns, rules)
        cands = {op: registry.resolve(profile, op, device) for op in CHAIN_OPERATORS}
        return cls(
            profile,
            device,
            {op: c.fn for op, c in cands.items()},
            {op: c.param_grad_rule for op, c in cands.items()},
            cands,
        )

    def override(self, operator: str, fn: Callable[..., Any], label: str) -> None:
        """Replace one operator's function (a planted candidate in a test); recorded in ``overrides``."""
        if operator not in self.fns:
            raise KernelInputError(f"qwen3.Runtime.override: {operator!r} is not a chain operator")
        self.fns[operator] = fn
        self.overrides[operator] = label

    def call(self, site: Site, args: tuple[Any, ...], ctx: LayoutContext) -> Any:
        return self.tap.call(site, self.fns[site.operator], args, ctx)


class _Node(nn.Module):
    """A module whose forward is one candidate call (``rt`` is shared by every node of the model)."""

    def __init__(self, rt: Runtime, site: Site) -> None:
        super().__init__()
        self.rt = rt
        self.site = site


class Ws1Embedding(_Node):
    def __init__(self, rt: Runtime, weight: nn.Parameter) -> None:
        super().__init__(rt, Site("model.embed_tokens", "embedding"))
        self.weight = weight

    def forward(self, token_ids: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
        return self.rt.call(self.site, (token_ids, self.weight, ctx), ctx)


class Ws1RMSNorm(_Node):
    def __init__(self, rt: Runtime, site: Site, weight: nn.Parameter, eps: float) -> None:
        super().__init__(rt, site)
        self.weight = weight
        self.variance_epsilon = float(eps)

    def forward(self, x: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
        return self.rt.call(self.site, (x, self.weight, self.variance_epsilon, ctx), ctx)


class Ws1Linear(_Node):
    def __init__(self, rt: Runtime, site: Site, weight: nn.Parameter) -> None:
        super().__init__(rt, site)
        self.weight = weight

    def forward(self, x: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
        return self.rt.call(self.site, (x, self.weight, ctx), ctx)


class Ws1Logp(_Node):
    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt, Site("logp", "logp"))

    def forward(self, logits: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
        return self.rt.call(self.site, (logits, targets, ctx), ctx)


class Ws1Attention(nn.Module):
    """Projections, QK-norm, RoPE and attention of one layer; returns the output and this call's k and v."""

    def __init__(self, rt: Runtime, layer: int, old: nn.Module, config: Any) -> None:
        super().__init__()
        pre = f"model.layers.{layer}.self_attn."
        self.rt = rt
        self.layer_idx = layer
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.num_heads)
        self.scaling = self.head_dim**-0.5
        self.rope_theta = float(_rope_theta(config))
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, Ws1Linear(rt, Site(pre + name, "det_gemm", layer), getattr(old, name).weight))
        eps = float(config.rms_norm_eps)
        self.q_norm = Ws1RMSNorm(rt, Site(pre + "q_norm", "qk_norm", layer), old.q_norm.weight, eps)
        self.k_norm = Ws1RMSNorm(rt, Site(pre + "k_norm", "qk_norm", layer), old.k_norm.weight, eps)
        self.rope_q = Site(pre + "rope_q", "rope", layer)
        self.rope_k = Site(pre + "rope_k", "rope", layer)
        self.attn = Site(pre + "attention", "attention", layer)

    def forward(
        self, h: torch.Tensor, ctx: LayoutContext, attn_ctx: LayoutContext
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t = h.shape[0]
        q = self.q_proj(h, ctx).reshape(t, self.num_heads, self.head_dim)
        k = self.k_proj(h, ctx).reshape(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(h, ctx).reshape(t, self.num_kv_heads, self.head_dim)
        q = self.q_norm(q, ctx)
        k = self.k_norm(k, ctx)
        q = self.rt.call(self.rope_q, (q, self.rope_theta, ctx), ctx)
        k = self.rt.call(self.rope_k, (k, self.rope_theta, ctx), ctx)
        a = self.rt.call(self.attn, (q, k, v, self.scaling, attn_ctx), attn_ctx)
        return self.o_proj(a.reshape(t, self.num_heads * self.head_dim), ctx), k, v


class Ws1MLP(nn.Module):
    """``down(swiglu(gate(h), up(h)))`` with the fused SwiGLU candidate."""

    def __init__(self, rt: Runtime, layer: int, old: nn.Module) -> None:
        super().__init__()
        pre = f"model.layers.{layer}.mlp."
        self.rt = rt
        for name in ("gate_proj", "up_proj", "down_proj"):
            setattr(self, name, Ws1Linear(rt, Site(pre + name, "det_gemm", layer), getattr(old, name).weight))
        self.swiglu = Site(pre + "swiglu", "swiglu", layer)

    def forward(self, h: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
        act = self.rt.call(self.swiglu, (self.gate_proj(h, ctx), self.up_proj(h, ctx), ctx), ctx)
        return self.down_proj(act, ctx)


class Ws1DecoderLayer(nn.Module):
    def __init__(self, rt: Runtime, layer: int, old: nn.Module, config: Any) -> None:
        super().__init__()
        pre = f"model.layers.{layer}."
        eps = float(config.rms_norm_eps)
        self.layer_idx = layer
        self.input_layernorm = Ws1RMSNorm(
            rt, Site(pre + "input_layernorm", "rms_norm", layer), old.input_layernorm.weight, eps
        )
        self.self_attn = Ws1Attention(rt, layer, old.self_attn, config)
        self.post_attention_layernorm = Ws1RMSNorm(
            rt,
            Site(pre + "post_attention_layernorm", "rms_norm", layer),
            old.post_attention_layernorm.weight,
            eps,
        )
        self.mlp = Ws1MLP(rt, layer, old.mlp)

    def forward(
        self, x: torch.Tensor, ctx: LayoutContext, attn_ctx: LayoutContext
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a, k, v = self.self_attn(self.input_layernorm(x, ctx), ctx, attn_ctx)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x, ctx), ctx)
        return x, k, v


# ---------------------------------------------------------------------------------------------- swap


def _rope_theta(config: Any) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise KernelInputError(f"qwen3.swap: the config names no rope_theta ({_SUPPORTED})")
    return float(theta)


def _check_config(config: Any) -> None:
    """Refuse what the drop-in does not implement, instead of computing something else."""
    problems = []
    if getattr(config, "tie_word_embeddings", False):
        problems.append("tie_word_embeddings=True")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        problems.append("biases")
    if getattr(config, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={config.hidden_act!r}")
    types_ = set(getattr(config, "layer_types", None) or ["full_attention"])
    if types_ != {"full_attention"}:
        problems.append(f"layer_types={sorted(types_)}")
    params = getattr(config, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default":
        problems.append(f"rope_type={params.get('rope_type')!r}")
    if problems:
        raise KernelInputError(
            f"qwen3.swap: unsupported config ({', '.join(problems)}); supported: {_SUPPORTED}"
        )


def runtime_of(model: nn.Module) -> Runtime:
    """The runtime of a swapped model (KernelInputError for a model ``swap`` never saw)."""
    rt = getattr(model, "ws1_runtime", None)
    if not isinstance(rt, Runtime):
        raise KernelInputError(
            "qwen3: the model is not swapped (call ws1_kernels.integrations.qwen3.swap first)"
        )
    return rt


def swap(model: nn.Module, profile: str, *, device: str = "cpu", tap: Tap | None = None) -> nn.Module:
    """Swap every chain node of ``model`` (a ``Qwen3ForCausalLM``) for ``profile``'s candidates, in place.

    Candidates are resolved first (fail-closed), so a profile that lacks one changes nothing. The parameters
    stay the same objects under the same names. ``model.forward`` becomes a packed-varlen forward that accepts
    transformers' ``input_ids`` / ``attention_mask`` / ``position_ids`` (see ``hf_forward``).
    """
    if getattr(model, "ws1_runtime", None) is not None:
        raise KernelInputError("qwen3.swap: the model is already swapped")
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        raise KernelInputError("qwen3.swap: expected a Qwen3ForCausalLM (model.model.layers, model.lm_head)")
    config = model.config
    _check_config(config)
    rt = Runtime.resolve(profile, device)
    if tap is not None:
        rt.tap = tap
    eps = float(config.rms_norm_eps)
    inner.embed_tokens = Ws1Embedding(rt, inner.embed_tokens.weight)
    for i, old in enumerate(list(inner.layers)):
        inner.layers[i] = Ws1DecoderLayer(rt, i, old, config)
    inner.norm = Ws1RMSNorm(rt, Site("model.norm", "rms_norm"), inner.norm.weight, eps)
    model.lm_head = Ws1Linear(rt, Site("lm_head", "lm_head"), model.lm_head.weight)
    if hasattr(inner, "rotary_emb"):
        del inner.rotary_emb  # positions come from the LayoutContext; the rope candidate computes the angles
    model.ws1_logp = Ws1Logp(rt)
    model.ws1_runtime = rt
    model.forward = types.MethodType(hf_forward, model)
    return model


def sites(model: nn.Module) -> list[Site]:
    """Every chain node of a swapped model in the order one call runs them (the order of a per-node dump)."""
    out: list[Site] = [model.model.embed_tokens.site]
    for layer in model.model.layers:
        att, mlp = layer.self_attn, layer.mlp
        out += [
            layer.input_layernorm.site,
            att.q_proj.site,
            att.k_proj.site,
            att.v_proj.site,
            att.q_norm.site,
            att.k_norm.site,
            att.rope_q,
            att.rope_k,
            att.attn,
            att.o_proj.site,
            layer.post_attention_layernorm.site,
            mlp.gate_proj.site,
            mlp.up_proj.site,
            mlp.swiglu,
            mlp.down_proj.site,
        ]
    out += [model.model.norm.site, model.lm_head.site, model.ws1_logp.site]
    return out


# ---------------------------------------------------------------------------------------------- forward


class KVCache:
    """Per layer and sample, the post-RoPE keys and the values of positions ``[0, P)`` (inference only).

    ``prefix(layer, ctx)`` gives the attention candidate its ``kv_prefix``; ``append`` adds a call's rows and
    checks that they continue where the cache ends, so a chunk or decode step run out of order fails loudly.
    """

    def __init__(self, num_layers: int) -> None:
        self.k: list[dict[int, torch.Tensor]] = [{} for _ in range(num_layers)]
        self.v: list[dict[int, torch.Tensor]] = [{} for _ in range(num_layers)]

    def length(self, sample_id: int) -> int:
        kk = self.k[0].get(sample_id)
        return 0 if kk is None else int(kk.shape[0])

    def prefix(self, layer: int, ctx: LayoutContext) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        out = {}
        for seg in ctx.segments:
            have = self.k[layer].get(seg.sample_id)
            n = 0 if have is None else int(have.shape[0])
            if n != seg.first_position:
                raise KernelInputError(
                    f"KVCache: layer {layer}: sample {seg.sample_id} starts at position {seg.first_position} "
                    f"but the cache holds {n} keys"
                )
            if n:
                out[seg.sample_id] = (have, self.v[layer][seg.sample_id])
        return out

    def append(self, layer: int, ctx: LayoutContext, k: torch.Tensor, v: torch.Tensor) -> None:
        for seg in ctx.segments:
            kk, vv = k[seg.start : seg.end].detach(), v[seg.start : seg.end].detach()
            have = self.k[layer].get(seg.sample_id)
            if have is not None:
                kk = torch.cat([have, kk])
                vv = torch.cat([self.v[layer][seg.sample_id], vv])
            self.k[layer][seg.sample_id], self.v[layer][seg.sample_id] = kk, vv

    def drop(self, sample_id: int) -> None:
        """Free a finished request's keys and values."""
        for layer in range(len(self.k)):
            self.k[layer].pop(sample_id, None)
            self.v[layer].pop(sample_id, None)


def _with_prefix(
    ctx: LayoutContext, prefix: Mapping[int, tuple[torch.Tensor, torch.Tensor]]
) -> LayoutContext:
    """``ctx`` with a kv_prefix, sharing its validated segments and device copies (no second O(T) walk)."""
    out = LayoutContext(ctx.sample_ids, ctx.positions, kv_prefix=dict(prefix))
    out.__dict__["segments"] = ctx.segments
    out.__dict__["_on"] = ctx.__dict__.setdefault("_on", {})
    return out


def row_context(ctx: LayoutContext, rows: torch.Tensor) -> LayoutContext:
    """The context of a subset of a call's rows (host-side index, ascending)."""
    rows = rows.to("cpu")
    return LayoutContext(ctx.sample_ids.index_select(0, rows), ctx.positions.index_select(0, rows))


def forward_call(
    model: nn.Module,
    token_ids: torch.Tensor,
    ctx: LayoutContext,
    *,
    cache: KVCache | SlotKVCache | None = None,
    head_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LayoutContext]:
    """One physical call through the swapped model: ``(logits [R, V], the context of those R rows)``.

    ``ctx`` gives every row's ``(sample_id, position)`` (pads ``-1``). With a ``cache`` (``KVCache``, or the engine's
    ``kv_slots.SlotKVCache``) each layer's attention
    reads the earlier keys of each sample and the call's own keys are appended (chunked prefill, decode). Rows
    ``head_rows`` (host int64, ascending) alone go through the lm_head; None: every row.
    """
    runtime_of(model)
    inner = model.model
    if token_ids.dim() != 1:
        raise KernelInputError(
            f"qwen3.forward_call: token_ids must be 1-D, got shape {tuple(token_ids.shape)}"
        )
    ctx.check_rows("qwen3.forward_call", token_ids.shape[0])
    x = inner.embed_tokens(token_ids, ctx)
    for i, layer in enumerate(inner.layers):
        attn_ctx = ctx if cache is None else _with_prefix(ctx, cache.prefix(i, ctx))
        x, k, v = layer(x, ctx, attn_ctx)
        if cache is not None:
            cache.append(i, ctx, k, v)
    if head_rows is not None and head_rows.numel() == 0:  # a prefill-only call: no row samples
        empty = torch.empty(0, dtype=torch.int64)
        return x.new_zeros((0, model.lm_head.weight.shape[0])), LayoutContext(empty, empty)
    h = inner.norm(x, ctx)
    hctx = ctx
    if head_rows is not None:
        h = h.index_select(0, head_rows.to(h.device))
        hctx = row_context(ctx, head_rows)
    return model.lm_head(h, hctx), hctx


def logprobs(
    model: nn.Module, logits: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext
) -> torch.Tensor:
    """The selected-token logprob of each row (the profile's ``logp`` candidate): fp32 ``[R]``."""
    runtime_of(model)
    return model.ws1_logp(logits, targets.to(logits.device), ctx)


def hf_forward(
    self: nn.Module,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    **kwargs: Any,
) -> Any:
    """transformers' call convention on the swapped model: ``input_ids [B, S]`` -> ``logits [B, S, V]``.

    Rows of a batch are samples; ``attention_mask`` zeros are pads (sample id and position -1). With ``B = 1``
    and ``position_ids``, the row is a packed varlen batch split where positions restart (the convention of
    transformers' flattening collator). Caches, labels and embeddings as input are not supported here: the
    rollout engine (``ws1_kernels.integrations.rollout``) is the inference path.
    """
    from transformers.modeling_outputs import CausalLMOutputWithPast

    unsupported = sorted(k for k, v in kwargs.items() if v not in (None, False) and k not in ("return_dict",))
    if unsupported or input_ids is None:
        raise KernelInputError(
            f"qwen3.hf_forward: unsupported arguments {unsupported or ['input_ids=None']} (use forward_call)"
        )
    ctx = context_from_hf(input_ids, attention_mask, position_ids)
    logits, _ = forward_call(self, input_ids.reshape(-1), ctx)
    return CausalLMOutputWithPast(logits=logits.reshape(*input_ids.shape, -1))


def context_from_hf(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None
) -> LayoutContext:
    """The ``LayoutContext`` of transformers-style batch tensors (see ``hf_forward``)."""
    if input_ids.dim() != 2:
        raise KernelInputError(f"qwen3.hf_forward: input_ids must be [B, S], got {tuple(input_ids.shape)}")
    b, s = input_ids.shape
    mask = torch.ones((b, s), dtype=torch.bool) if attention_mask is None else attention_mask.to("cpu").bool()
    if position_ids is None:
        pos = (mask.long().cumsum(1) - 1).masked_fill(~mask, -1)
    else:
        pos = position_ids.to("cpu").long().expand(b, s).masked_fill(~mask, -1)
    sid = torch.arange(b)[:, None].expand(b, s).masked_fill(~mask, -1).clone()
    if b == 1 and position_ids is not None:
        p = pos[0]
        starts = torch.ones(s, dtype=torch.bool)
        starts[1:] = p[1:] != p[:-1] + 1
        sid = (starts.long().cumsum(0) - 1)[None].masked_fill(~mask, -1)
    return LayoutContext(sid.reshape(-1).contiguous(), pos.reshape(-1).contiguous())


# ---------------------------------------------------------------------------------------------- gradients


def _param_owners(model: nn.Module) -> Iterator[tuple[str, nn.Parameter, str]]:
    """(name, parameter, operator) of every parameter, in state-dict order."""
    owner: dict[int, str] = {}
    for mod in model.modules():
        if isinstance(mod, _Node) and "weight" in mod._parameters:
            owner[id(mod.weight)] = mod.site.operator
    for name, p in model.named_parameters():
        if id(p) not in owner:
            raise KernelInputError(f"qwen3: parameter {name} belongs to no swapped node")
        yield name, p, owner[id(p)]


def param_operators(model: nn.Module) -> dict[str, str]:
    """Parameter name -> the operator whose candidate computes its gradient (e.g. ``det_gemm``)."""
    return {name: op for name, _p, op in _param_owners(model)}


def zero_param_grads(model: nn.Module) -> None:
    """Clear every parameter gradient before a layout: fp32 zeros in ``main_grad`` or ``grad = None``."""
    rt = runtime_of(model)
    for _name, p, op in _param_owners(model):
        p.grad = None
        if rt.rules[op] == "sample_blocks_main_grad":
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device=p.device)  # type: ignore[attr-defined]


def drop_param_grads(model: nn.Module) -> None:
    """Detach every gradient buffer from the parameters (``grad`` and ``main_grad``), so that the memory goes
    once no other reference holds it: a caller that moved a layout's gradients elsewhere frees the device
    copy (at 36 layers 33 GB of fp32 ``main_grad``). The next layout starts with ``zero_param_grads``."""
    for _name, p, _op in _param_owners(model):
        p.grad = None
        if hasattr(p, "main_grad"):
            del p.main_grad


def param_grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    """Every parameter gradient where its candidate's rule leaves it (``main_grad`` or ``grad``), never
    re-summed; None where nothing arrived."""
    rt = runtime_of(model)
    out: dict[str, torch.Tensor | None] = {}
    for name, p, op in _param_owners(model):
        g = getattr(p, "main_grad", None) if rt.rules[op] == "sample_blocks_main_grad" else p.grad
        out[name] = None if g is None else g.detach()
    return out


# ---------------------------------------------------------------------------------------------- building


def qwen3_config(cfg: Any, *, num_layers: int | None = None, **extra: Any) -> Any:
    """A transformers ``Qwen3Config`` from an object with ws1_workload ``ModelConfig``'s fields (``extra``: more
    ``Qwen3Config`` arguments, e.g. ``attn_implementation``)."""
    import transformers

    return transformers.Qwen3Config(
        vocab_size=cfg.vocab,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.num_layers if num_layers is None else num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        rms_norm_eps=cfg.rms_eps,
        tie_word_embeddings=cfg.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        attention_bias=False,
        max_position_embeddings=1 << 16,
        **extra,
    )


def build_model(
    config: Any,
    state_dict: Mapping[str, torch.Tensor],
    profile: str,
    *,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    tap: Tap | None = None,
) -> nn.Module:
    """A swapped ``Qwen3ForCausalLM`` holding ``state_dict`` (Hugging Face names, checked strictly).

    Built on the meta device and then given the tensors, so a large model is never initialised twice.
    ``dtype`` defaults to bf16 (fp32 for ``REFERENCE_PROFILE``).
    """
    import transformers

    dtype = dtype or (torch.float32 if profile == REFERENCE_PROFILE else torch.bfloat16)
    with torch.device("meta"):
        model = transformers.Qwen3ForCausalLM(config)
    tensors = {k: v.detach().to(device=device, dtype=dtype) for k, v in state_dict.items()}
    try:
        model.load_state_dict(tensors, strict=True, assign=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise KernelInputError(
            f"qwen3.build_model: {' '.join(line.strip() for line in first)[:400]}"
        ) from None
    return swap(model, profile, device=device, tap=tap)


def load_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a ``.safetensors`` file, or of every ``*.safetensors`` shard in a directory."""
    from safetensors.torch import load_file

    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    if not files or not all(f.is_file() for f in files):
        raise KernelInputError(f"qwen3.load_safetensors: {p}: no .safetensors file")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        for name, tensor in load_file(str(f)).items():
            if name in out:
                raise KernelInputError(f"qwen3.load_safetensors: {f}: tensor {name!r} is in two shards")
            out[name] = tensor
    return out
