"""fp32 references: the gold side of forward_accuracy and gradient_accuracy.

Same signatures as the candidates.  Inputs are upcast to fp32 (pass fp32 leaves, e.g.
``x.detach().float().requires_grad_()``, to get fp32 gradients), the math is plain fp32 torch, differentiable
by ordinary autograd, and TF32 is off inside every call (restored after).  Outputs are fp32.  No blocking, no
invariance tricks: this is the textbook formula.  Weight gradients land in ``weight.grad``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from . import _validate as v
from .context import LayoutContext
from .portable.attention import check_attention
from .portable.pointwise import check_rope, rope_tables, rotate

__all__ = [
    "attention",
    "det_gemm",
    "embedding",
    "fp32_math",
    "linear_logp",
    "lm_head",
    "logp",
    "qk_norm",
    "rms_norm",
    "rope",
    "silu",
    "swiglu",
]

_F32 = None  # dtype check: any float dtype is accepted and upcast


@contextmanager
def fp32_math() -> Iterator[None]:
    """TF32 off and float32 matmul precision "highest" for the duration (previous settings restored)."""
    old = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old[0], old[1]
        torch.set_float32_matmul_precision(old[2])


def embedding(token_ids: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    where = "reference.embedding"
    v.tensor(where, "weight", weight, 2, _F32)
    v.token_ids(where, "token_ids", token_ids, weight.shape[0])
    ctx.check_rows(where, token_ids.shape[0])
    with fp32_math():
        return weight.float()[token_ids]


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, ctx: LayoutContext) -> torch.Tensor:
    where = "reference.rms_norm"
    v.tensor(where, "x", x, 2, _F32)
    v.tensor(where, "weight", weight, 1, _F32)
    v.dims(where, "weight", weight, (x.shape[1],))
    eps = v.positive(where, "eps", eps)
    ctx.check_rows(where, x.shape[0])
    with fp32_math():
        return _rms(x, weight, eps)


def qk_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, ctx: LayoutContext) -> torch.Tensor:
    where = "reference.qk_norm"
    v.tensor(where, "x", x, 3, _F32)
    v.tensor(where, "weight", weight, 1, _F32)
    v.dims(where, "weight", weight, (x.shape[2],))
    eps = v.positive(where, "eps", eps)
    ctx.check_rows(where, x.shape[0])
    with fp32_math():
        return _rms(x, weight, eps)


def _linear(where: str, x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    v.tensor(where, "x", x, 2, _F32)
    v.tensor(where, "weight", weight, 2, _F32)
    v.dims(where, "weight", weight, (None, x.shape[1]))
    ctx.check_rows(where, x.shape[0])
    with fp32_math():
        return x.float() @ weight.float().t()


def det_gemm(x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    return _linear("reference.det_gemm", x, weight, ctx)


def lm_head(x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    return _linear("reference.lm_head", x, weight, ctx)


def rope(x: torch.Tensor, theta: float, ctx: LayoutContext) -> torch.Tensor:
    theta = check_rope("reference.rope", x, theta, ctx, _F32)
    with fp32_math():
        cos, sin = rope_tables(ctx.on(x.device)[1], x.shape[-1], theta)
        return rotate(x.float(), cos, sin)


def attention(
    q: torch.Tensor, k: torch.Tensor, v_: torch.Tensor, scale: float, ctx: LayoutContext
) -> torch.Tensor:
    """Explicit per-sample causal softmax(q k^T * scale) v with GQA; prefix keys first."""
    scale = check_attention("reference.attention", q, k, v_, scale, ctx, _F32)
    group = q.shape[1] // k.shape[1]
    with fp32_math():
        rows = []
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        for seg in ctx.segments:
            kk, vv = k[seg.start : seg.end].float(), v_[seg.start : seg.end].float()
            pre = ctx.kv_prefix.get(seg.sample_id)
            if pre is not None:
                kk = torch.cat([pre[0].float(), kk])
                vv = torch.cat([pre[1].float(), vv])
            kh = kk.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, L, D]
            vh = vv.repeat_interleave(group, dim=1).transpose(0, 1)
            qh = q[seg.start : seg.end].float().transpose(0, 1)  # [Hq, n, D]
            s = (qh @ kh.transpose(1, 2)) * scale
            qpos = torch.arange(seg.first_position, seg.first_position + seg.length, device=q.device)
            kpos = torch.arange(kk.shape[0], device=q.device)
            s = s.masked_fill(kpos[None, :] > qpos[:, None], float("-inf"))
            rows.append((seg, (torch.softmax(s, dim=-1) @ vh).transpose(0, 1)))
        if not rows:
            return out
        index = torch.cat([torch.arange(seg.start, seg.end, device=q.device) for seg, _ in rows])
        return out.index_put((index,), torch.cat([o for _, o in rows]))


def silu(x: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    v.tensor("reference.silu", "x", x, 2, _F32)
    ctx.check_rows("reference.silu", x.shape[0])
    with fp32_math():
        return torch.nn.functional.silu(x.float())


def swiglu(gate: torch.Tensor, up: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    where = "reference.swiglu"
    v.tensor(where, "gate", gate, 2, _F32)
    v.tensor(where, "up", up, 2, _F32)
    v.dims(where, "up", up, tuple(gate.shape))
    ctx.check_rows(where, gate.shape[0])
    with fp32_math():
        return torch.nn.functional.silu(gate.float()) * up.float()


def logp(logits: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    where = "reference.logp"
    v.tensor(where, "logits", logits, 2, _F32)
    ctx.check_rows(where, logits.shape[0])
    v.token_ids(where, "targets", targets, logits.shape[1])
    v.dims(where, "targets", targets, (logits.shape[0],))
    with fp32_math():
        return torch.log_softmax(logits.float(), dim=-1).gather(1, targets[:, None]).squeeze(1)


def linear_logp(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext
) -> torch.Tensor:
    where = "reference.linear_logp"
    logits = _linear(where, x, weight, ctx)
    v.token_ids(where, "targets", targets, weight.shape[0])
    v.dims(where, "targets", targets, (x.shape[0],))
    with fp32_math():
        return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None]).squeeze(1)
