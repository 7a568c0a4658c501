"""The fp32 reference chain: Qwen3 dense forward in plain torch fp32, on any physical layout.

Runs the calls of a layout in order, keeping a per-sample KV cache per layer so chunked and decode calls
attend to their key prefix. Returns the selected-token logprob restored to logical order: the value at
(s, p) is log P(token[s, p + 1] | tokens[s, 0..p]) (HF next-token convention); a sample's last position has
no target and holds 0.0. Use `Fixture.scored` to select the positions whose target is a completion token.
The arithmetic is plain fp32 for the duration of the call (`fp32_math`: no TF32, no bf16 inside fp32 matmuls).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from .errors import LayoutError, WorkloadError
from .fixtures import Fixture
from .layouts import Layout, PhysicalCall
from .manifest import ModelConfig
from .restore import restore, sample_runs
from .weights import check_weights

_T = TypeVar("_T")


# Where torch keeps the precision of fp32 arithmetic. Torch 2.9 and later hold it per backend and operation
# (``fp32_precision``: "ieee" is plain fp32, "tf32" and "bf16" are reduced; the generic one sets all); the legacy
# switches (``allow_tf32``, ``set_float32_matmul_precision``) write into these, and their getters raise once the
# two APIs have left the settings in a state they cannot express. So the per-backend settings are what is saved,
# set and restored, parents before children. The legacy switches are set too (they keep state of their own that
# their getters consult) and restored where they could be read.
_PRECISION_SITES: tuple[tuple[str, ...], ...] = (
    (),
    ("cuda", "matmul"),
    ("cudnn",),
    ("cudnn", "conv"),
    ("cudnn", "rnn"),
    ("mkldnn",),
    ("mkldnn", "matmul"),
    ("mkldnn", "conv"),
    ("mkldnn", "rnn"),
)


def _precision_sites() -> list[tuple[object, str]]:
    """The per-backend ``fp32_precision`` settings this torch has (none before torch 2.9)."""
    out: list[tuple[object, str]] = []
    for path in _PRECISION_SITES:
        obj: object = torch.backends
        for part in path:
            obj = getattr(obj, part, None)
        if obj is not None and hasattr(obj, "fp32_precision"):
            out.append((obj, "fp32_precision"))
    return out


def _read(getter: Callable[[], _T]) -> _T | None:
    try:
        return getter()
    except RuntimeError:  # the two APIs left a state this legacy getter cannot express
        return None


# the legacy switches: (read, write, the fp32 value); each also writes the per-backend settings it covers
_LEGACY: tuple[tuple[Callable[[], Any], Callable[[Any], None], Any], ...] = (
    (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision, "highest"),
    (
        lambda: torch.backends.cuda.matmul.allow_tf32,
        lambda value: setattr(torch.backends.cuda.matmul, "allow_tf32", value),
        False,
    ),
    (
        lambda: torch.backends.cudnn.allow_tf32,
        lambda value: setattr(torch.backends.cudnn, "allow_tf32", value),
        False,
    ),
)


@contextmanager
def fp32_math() -> Iterator[None]:
    """Plain fp32 arithmetic for the duration: no TF32 and no bf16 inside fp32 matmuls or convolutions, on CUDA,
    cuDNN and oneDNN. Every setting it touches is restored on exit, also when the block raises.

    A copy of ``ws1_kernels.reference.fp32_math``: the workload may not import the kernels nor the kernels the
    workload (docs/architecture.md), and one test (tests/test_fp32_math.py) runs both copies through the same
    checks.
    """
    sites = _precision_sites()
    saved_sites = [getattr(obj, attr) for obj, attr in sites]
    saved_legacy = [_read(read) for read, _write, _fp32 in _LEGACY]
    try:
        for _read_it, write, fp32 in _LEGACY:
            write(fp32)
        for obj, attr in sites:
            setattr(obj, attr, "ieee")
        yield
    finally:
        for (_read_it, write, _fp32), value in zip(_LEGACY, saved_legacy, strict=True):
            if value is not None:
                write(value)
        for (obj, attr), value in zip(sites, saved_sites, strict=True):
            setattr(obj, attr, value)


def next_token_targets(fx: Fixture, sample_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Target token of each physical row: token at position + 1 of its sample, pad_id on pads/last tokens."""
    out = torch.full_like(sample_ids, fx.pad_id)
    for i, (s, p) in enumerate(zip(sample_ids.tolist(), positions.tolist(), strict=True)):
        if s >= 0 and p + 1 < fx.samples[s].length:
            out[i] = fx.samples[s].token_ids[p + 1]
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """HF rotate_half RoPE on [T, H, D]; inv_freq_i = theta^(-2i/D), angle = position * inv_freq."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=x.device).float() / d))
    freqs = positions.to(x.device).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    return x * cos + _rotate_half(x) * sin


class _Chain:
    def __init__(self, cfg: ModelConfig, weights: Mapping[str, torch.Tensor], device: torch.device) -> None:
        self.cfg = cfg
        self.w = weights
        self.device = device

    def p(self, name: str) -> torch.Tensor:
        return self.w[name].to(device=self.device, dtype=torch.float32)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        call: PhysicalCall,
        cache: dict[int, tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        cfg = self.cfg
        group = cfg.num_heads // cfg.num_kv_heads
        out = torch.zeros_like(q)
        for s, first, n in sample_runs(call):
            prefix = call.prefix_lengths[s]
            pk, pv = cache.get(s, (k[:0], v[:0]))
            if pk.shape[0] != prefix:
                raise LayoutError(
                    f"call {call.index}: sample {s} expects a key prefix of {prefix}, the cache "
                    f"holds {pk.shape[0]}"
                )
            keys = torch.cat([pk, k[first : first + n]])
            vals = torch.cat([pv, v[first : first + n]])
            cache[s] = (keys, vals)
            qh = q[first : first + n].transpose(0, 1)  # [Hq, n, D]
            kh = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, P+n, D]
            vh = vals.repeat_interleave(group, dim=1).transpose(0, 1)
            scores = (qh @ kh.transpose(1, 2)) * (cfg.head_dim**-0.5)
            qpos = torch.arange(prefix, prefix + n, device=q.device)[:, None]
            kpos = torch.arange(prefix + n, device=q.device)[None, :]
            scores = scores.masked_fill(kpos > qpos, float("-inf"))
            out[first : first + n] = (torch.softmax(scores, dim=-1) @ vh).transpose(0, 1)
        return out

    def call(
        self, fx: Fixture, call: PhysicalCall, caches: list[dict[int, tuple[torch.Tensor, torch.Tensor]]]
    ) -> torch.Tensor:
        cfg, dev = self.cfg, self.device
        t = call.num_rows
        ids = call.token_ids.to(dev)
        if t and (int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab):
            raise WorkloadError(f"reference chain: call {call.index} has token ids outside vocab {cfg.vocab}")
        positions = call.positions.clamp(min=0).to(dev)
        x = self.p("model.embed_tokens.weight")[ids]
        for i in range(cfg.num_layers):
            pre = f"model.layers.{i}."
            h = rms_norm(x, self.p(pre + "input_layernorm.weight"), cfg.rms_eps)
            q = (h @ self.p(pre + "self_attn.q_proj.weight").T).view(t, cfg.num_heads, cfg.head_dim)
            k = (h @ self.p(pre + "self_attn.k_proj.weight").T).view(t, cfg.num_kv_heads, cfg.head_dim)
            v = (h @ self.p(pre + "self_attn.v_proj.weight").T).view(t, cfg.num_kv_heads, cfg.head_dim)
            if cfg.qk_norm:
                q = rms_norm(q, self.p(pre + "self_attn.q_norm.weight"), cfg.rms_eps)
                k = rms_norm(k, self.p(pre + "self_attn.k_norm.weight"), cfg.rms_eps)
            q, k = rope(q, positions, cfg.rope_theta), rope(k, positions, cfg.rope_theta)
            a = self.attention(q, k, v, call, caches[i]).reshape(t, cfg.num_heads * cfg.head_dim)
            x = x + a @ self.p(pre + "self_attn.o_proj.weight").T
            h = rms_norm(x, self.p(pre + "post_attention_layernorm.weight"), cfg.rms_eps)
            gate = h @ self.p(pre + "mlp.gate_proj.weight").T
            up = h @ self.p(pre + "mlp.up_proj.weight").T
            x = x + (torch.nn.functional.silu(gate) * up) @ self.p(pre + "mlp.down_proj.weight").T
        h = rms_norm(x, self.p("model.norm.weight"), cfg.rms_eps)
        head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
        logp = torch.log_softmax(h @ self.p(head).T, dim=-1)
        targets = next_token_targets(fx, call.sample_ids, call.positions).to(dev)
        selected = logp.gather(1, targets[:, None]).squeeze(1)
        # Rows without a target (pads, each sample's last token) hold 0.0 by convention.
        last = _last_rows(fx, call).to(dev)
        return torch.where(last | (call.sample_ids.to(dev) < 0), torch.zeros_like(selected), selected)


def _last_rows(fx: Fixture, call: PhysicalCall) -> torch.Tensor:
    lengths = torch.tensor([s.length for s in fx.samples], dtype=torch.int64)
    sids = call.sample_ids
    return (sids >= 0) & (call.positions == lengths[sids.clamp(min=0)] - 1)


def reference_chain(
    layout: Layout,
    model: ModelConfig,
    weights: Mapping[str, torch.Tensor],
    device: str | torch.device | None = None,
) -> torch.Tensor:
    """fp32 selected-token logprobs [total_tokens] in logical order (see module docstring for the convention)."""
    check_weights(model, weights)
    dev = torch.device(device) if device is not None else next(iter(weights.values())).device
    chain = _Chain(model, weights, dev)
    caches: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = [{} for _ in range(model.num_layers)]
    outputs = []
    with fp32_math(), torch.no_grad():
        for call in layout.calls:
            outputs.append(chain.call(layout.fixture, call, caches))
    return restore(layout, outputs)
