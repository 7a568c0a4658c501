"""The native_torch profile: stock torch ops in bf16, the baseline.

Stock kernels are batch-variant where the backend is (CPU fp32/bf16 GEMM switches path with M; cuBLAS picks
split-K by shape), and that is the point: the gate must show it red.  Parameter gradients follow
``autograd_accumulate`` (stock autograd into ``weight.grad``).  Launches are recorded at the call (``fwd``) and
through a gradient hook on the output (``bwd``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import _validate as v
from .backend import Backend, OpEntry
from .context import LayoutContext
from .launches import record
from .op_checks import check_attention, check_rope, check_targets
from .rope_math import rope_tables

_BF = torch.bfloat16
# SDPA's fused kernels in the order torch preferred them before it ranked cuDNN first on Hopper: the flash kernel
# for causal and unmasked calls (the kernel most training stacks run), memory-efficient attention for masked ones.
# Measured on the H200 (torch 2.11, cuDNN 9.19, ci/sdpa_probe.py): the default choice, cuDNN, builds a plan for
# every new key length at 40-60 ms each, so a decode sweep of about a thousand steps spent over a minute building
# plans. Which kernel ran is recorded: the dispatch watch lists the SDPA op of the canonical layout.
_SDPA_ORDER = [
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.MATH,
]


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


def _sdpa_call(
    q: torch.Tensor, k: torch.Tensor, v_: torch.Tensor, first_position: int, scale: float
) -> torch.Tensor:
    """One sample's attention through SDPA, the way transformers' SDPA path calls it.

    ``q`` [n, H, D] holds positions ``first_position ..`` of a sample whose keys ``k``/``v_`` [L, Hkv, D] start at
    position 0.  A block that sees exactly its own keys gets SDPA's causal flag and no mask, a single query that
    sees every key gets neither, and only a chunk that attends an earlier key prefix gets an explicit mask.  This
    is what a stock model does, and it leaves SDPA free to use its unmasked fused kernels (flash) for all but
    the chunked calls.
    """
    n, length = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    # keys and values repeated per query head (transformers' repeat_kv): `enable_gqa` with an explicit mask has
    # no fused CUDA kernel
    qq = q.transpose(0, 1)[None]
    kk = k.repeat_interleave(group, dim=1).transpose(0, 1)[None]
    vv = v_.repeat_interleave(group, dim=1).transpose(0, 1)[None]
    with sdpa_kernel(_SDPA_ORDER, set_priority=True):
        if first_position == 0 and n == length:
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=scale)
        elif n == 1 and first_position == length - 1:
            o = F.scaled_dot_product_attention(qq, kk, vv, scale=scale)
        else:
            qpos = torch.arange(first_position, first_position + n, device=q.device)
            mask = torch.arange(length, device=q.device)[None, :] <= qpos[:, None]
            o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, scale=scale)
    return o[0].transpose(0, 1)


def attention(
    q: torch.Tensor, k: torch.Tensor, v_: torch.Tensor, scale: float, ctx: LayoutContext
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` per sample (GQA by repeated keys, causal from the prefix length)."""
    scale = check_attention("native_torch.attention", q, k, v_, scale, ctx, _BF)
    outs, index = [], []
    for seg in ctx.segments:
        kk, vv = k[seg.start : seg.end], v_[seg.start : seg.end]
        pre = ctx.kv_prefix.get(seg.sample_id)
        if pre is not None:
            kk, vv = torch.cat([pre[0], kk]), torch.cat([pre[1], vv])
        outs.append(_sdpa_call(q[seg.start : seg.end], kk, vv, seg.first_position, scale))
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


# The aten ops each stock op may dispatch, forward and backward, recorded over every layout type on the CPU and
# on CUDA (tests/ws1_kernels/test_registry.py re-records them); stock kernels are recorded, never judged.
_DECLARED: dict[str, frozenset[str]] = {
    "embedding": frozenset(
        {
            "aten._local_scalar_dense",
            "aten.add_",
            "aten.aminmax",
            "aten.detach",
            "aten.embedding",
            "aten.embedding_dense_backward",
        }
    ),
    "rope": frozenset(
        {
            "aten._to_copy",
            "aten.add",
            "aten.arange",
            "aten.cat",
            "aten.clamp",
            "aten.cos",
            "aten.detach",
            "aten.div",
            "aten.mul",
            "aten.neg",
            "aten.pow",
            "aten.reciprocal",
            "aten.sin",
            "aten.slice",
            "aten.slice_backward",
            "aten.unsqueeze",
        }
    ),
    "silu": frozenset(
        {
            "aten.detach",
            "aten.silu",
            "aten.silu_backward",
        }
    ),
    "swiglu": frozenset(
        {
            "aten._to_copy",
            "aten.detach",
            "aten.mul",
            "aten.silu",
            "aten.silu_backward",
        }
    ),
    "rms_norm": frozenset(
        {
            "aten._to_copy",
            "aten.add",
            "aten.add_",
            "aten.detach",
            "aten.div",
            "aten.expand",
            "aten.mean",
            "aten.mul",
            "aten.pow",
            "aten.rsqrt",
            "aten.sum",
            "aten.view",
        }
    ),
    "det_gemm": frozenset(
        {
            "aten.add_",
            "aten.detach",
            "aten.mm",
            "aten.t",
        }
    ),
    "attention": frozenset(
        {
            "aten._scaled_dot_product_flash_attention_for_cpu",
            "aten._scaled_dot_product_flash_attention_for_cpu_backward",
            "aten.add",
            "aten.arange",
            "aten.cat",
            "aten.clone",
            "aten.detach",
            "aten.expand",
            "aten.index",
            "aten.index_put",
            "aten.le",
            "aten.scalar_tensor",
            "aten.select",
            "aten.select_backward",
            "aten.slice",
            "aten.slice_backward",
            "aten.squeeze",
            "aten.sum",
            "aten.transpose",
            "aten.unsqueeze",
            "aten.view",
            "aten.where",
            "aten.zeros_like",
        }
    ),
    "logp": frozenset(
        {
            "aten._local_scalar_dense",
            "aten._log_softmax",
            "aten._log_softmax_backward_data",
            "aten._to_copy",
            "aten.aminmax",
            "aten.detach",
            "aten.gather",
            "aten.new_zeros",
            "aten.scatter_add",
            "aten.squeeze",
            "aten.unsqueeze",
        }
    ),
    "linear_logp": frozenset(
        {
            "aten._local_scalar_dense",
            "aten._log_softmax",
            "aten._log_softmax_backward_data",
            "aten._to_copy",
            "aten.add_",
            "aten.aminmax",
            "aten.detach",
            "aten.gather",
            "aten.mm",
            "aten.new_zeros",
            "aten.scatter_add",
            "aten.squeeze",
            "aten.t",
            "aten.unsqueeze",
        }
    ),
}

_DECLARED["qk_norm"] = _DECLARED["rms_norm"]  # the same stock path
_DECLARED["lm_head"] = _DECLARED["det_gemm"]

OPS: dict[str, OpEntry] = {
    op: OpEntry(fn, f"ws1.native.{op}", _DECLARED[op])
    for op, fn in {
        "embedding": embedding,
        "rms_norm": rms_norm,
        "qk_norm": qk_norm,
        "det_gemm": det_gemm,
        "rope": rope,
        "attention": attention,
        "silu": silu,
        "swiglu": swiglu,
        "lm_head": lm_head,
        "logp": logp,
        "linear_logp": linear_logp,
    }.items()
}

# the stock baseline runs wherever torch does ("any"): on CUDA when a GPU is present, else on the CPU
BACKEND = Backend(
    device="any", min_arch=None, param_grad_rule="autograd_accumulate", load=lambda: (OPS, None)
)
