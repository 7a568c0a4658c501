"""The native_torch profile: stock torch ops in bf16, the baseline.

Stock kernels are batch-variant where the backend is (CPU fp32/bf16 GEMM switches path with M; cuBLAS picks
split-K by shape), and that is the point: the gate must show it red.  Parameter gradients follow
``autograd_accumulate`` (stock autograd into ``weight.grad``).  Launches are recorded at the call (``fwd``) and
through a gradient hook on the output (``bwd``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _validate as v
from .context import LayoutContext
from .launches import record
from .portable.attention import check_attention
from .portable.logprob import check_targets
from .portable.pointwise import check_rope, rope_tables

_BF = torch.bfloat16


def _launched(kernel: str, out: torch.Tensor) -> torch.Tensor:
    record(kernel, "fwd")
    if out.requires_grad:
        out.register_hook(lambda g: record(kernel, "bwd"))
    return out


def embedding(token_ids: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    where = "native_torch.embedding"
    v.tensor(where, "weight", weight, 2)
    v.token_ids(where, "token_ids", token_ids, weight.shape[0])
    ctx.check_rows(where, token_ids.shape[0])
    return _launched("ws1.native.embedding", F.embedding(token_ids, weight))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, ctx: LayoutContext) -> torch.Tensor:
    where = "native_torch.rms_norm"
    v.tensor(where, "x", x, 2)
    v.tensor(where, "weight", weight, 1)
    v.dims(where, "weight", weight, (x.shape[1],))
    eps = v.positive(where, "eps", eps)
    ctx.check_rows(where, x.shape[0])
    return _launched("ws1.native.rms_norm", F.rms_norm(x, (x.shape[-1],), weight, eps))


def qk_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, ctx: LayoutContext) -> torch.Tensor:
    where = "native_torch.qk_norm"
    v.tensor(where, "x", x, 3)
    v.tensor(where, "weight", weight, 1)
    v.dims(where, "weight", weight, (x.shape[2],))
    eps = v.positive(where, "eps", eps)
    ctx.check_rows(where, x.shape[0])
    return _launched("ws1.native.qk_norm", F.rms_norm(x, (x.shape[-1],), weight, eps))


def _linear(
    where: str, kernel: str, x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext
) -> torch.Tensor:
    v.tensor(where, "x", x, 2)
    v.tensor(where, "weight", weight, 2)
    v.dims(where, "weight", weight, (None, x.shape[1]))
    ctx.check_rows(where, x.shape[0])
    return _launched(kernel, F.linear(x, weight))


def det_gemm(x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    return _linear("native_torch.det_gemm", "ws1.native.det_gemm", x, weight, ctx)


def lm_head(x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    return _linear("native_torch.lm_head", "ws1.native.lm_head", x, weight, ctx)


def rope(x: torch.Tensor, theta: float, ctx: LayoutContext) -> torch.Tensor:
    theta = check_rope("native_torch.rope", x, theta, ctx, _BF)
    cos, sin = rope_tables(ctx.on(x.device)[1], x.shape[-1], theta)
    half = x.shape[-1] // 2
    xf = x.float()
    rot = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return _launched("ws1.native.rope", (xf * cos + rot * sin).to(_BF))


def attention(
    q: torch.Tensor, k: torch.Tensor, v_: torch.Tensor, scale: float, ctx: LayoutContext
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` per sample (GQA, causal mask offset by the prefix length)."""
    scale = check_attention("native_torch.attention", q, k, v_, scale, ctx, _BF)
    outs, index = [], []
    for seg in ctx.segments:
        kk, vv = k[seg.start : seg.end], v_[seg.start : seg.end]
        pre = ctx.kv_prefix.get(seg.sample_id)
        if pre is not None:
            kk, vv = torch.cat([pre[0], kk]), torch.cat([pre[1], vv])
        qpos = torch.arange(seg.first_position, seg.first_position + seg.length, device=q.device)
        mask = torch.arange(kk.shape[0], device=q.device)[None, :] <= qpos[:, None]
        # keys and values repeated per query head, as transformers' SDPA path does when a mask is given:
        # `enable_gqa` with an explicit mask has no fused CUDA kernel and took 55 ms a call on the H200
        group = q.shape[1] // kk.shape[1]
        o = F.scaled_dot_product_attention(
            q[seg.start : seg.end].transpose(0, 1)[None],
            kk.repeat_interleave(group, dim=1).transpose(0, 1)[None],
            vv.repeat_interleave(group, dim=1).transpose(0, 1)[None],
            attn_mask=mask,
            scale=scale,
        )
        outs.append(o[0].transpose(0, 1))
        index.append(torch.arange(seg.start, seg.end, device=q.device))
    out = torch.zeros_like(q)
    if outs:
        out = out.index_put((torch.cat(index),), torch.cat(outs))
    return _launched("ws1.native.attention", out)


def silu(x: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    v.tensor("native_torch.silu", "x", x, 2)
    ctx.check_rows("native_torch.silu", x.shape[0])
    return _launched("ws1.native.silu", F.silu(x))


def swiglu(gate: torch.Tensor, up: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    where = "native_torch.swiglu"
    v.tensor(where, "gate", gate, 2)
    v.tensor(where, "up", up, 2)
    v.dims(where, "up", up, tuple(gate.shape))
    ctx.check_rows(where, gate.shape[0])
    return _launched("ws1.native.swiglu", (F.silu(gate.float()) * up.float()).to(_BF))


def logp(logits: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    where = "native_torch.logp"
    v.tensor(where, "logits", logits, 2)
    ctx.check_rows(where, logits.shape[0])
    check_targets(where, targets, logits.shape[1], logits.shape[0])
    lp = torch.log_softmax(logits.float(), dim=-1).gather(1, targets[:, None]).squeeze(1)
    return _launched("ws1.native.logp", lp)


def linear_logp(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext
) -> torch.Tensor:
    where = "native_torch.linear_logp"
    v.tensor(where, "x", x, 2)
    v.tensor(where, "weight", weight, 2)
    v.dims(where, "weight", weight, (None, x.shape[1]))
    ctx.check_rows(where, x.shape[0])
    check_targets(where, targets, weight.shape[0], x.shape[0])
    lp = torch.log_softmax(F.linear(x, weight).float(), dim=-1).gather(1, targets[:, None]).squeeze(1)
    return _launched("ws1.native.linear_logp", lp)
