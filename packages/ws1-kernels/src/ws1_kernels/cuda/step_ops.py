"""``cuda_bf16``'s raw inference ops for the step path (``integrations.step``): the extension's torch ops with
no autograd, no per-call validation and no host tables. They are the same kernels, called with the same
operands, as this package's candidates, so the step gives the judged path's bits; the step's plan validates
once per step what each candidate checks once per call."""

from __future__ import annotations

import torch

from ..step_ops import StepOps
from .attention import tiled


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_base: torch.Tensor,
    n_keys: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    if tiled(q.shape[1], k.shape[1], q.shape[2]):  # the candidate's choice; one block per row (no host table)
        return torch.ops.ws1.attn_fwd_tiled(q, k, v, key_base, n_keys, None, scale)[0]
    return torch.ops.ws1.attn_fwd(q, k, v, key_base, n_keys, scale)[0]


STEP_OPS = StepOps(
    embedding=lambda ids, w: torch.ops.ws1.embedding_fwd(ids, w),
    norm=lambda x, w, eps: torch.ops.ws1.norm_fwd(x, w, eps),
    linear=lambda x, w: torch.ops.ws1.gemm(x, w, True),
    rope=lambda x, positions, theta: torch.ops.ws1.rope(x, positions, theta, False),
    attention=_attention,
    swiglu=lambda gate, up: torch.ops.ws1.swiglu_fwd(gate, up),
    logp=lambda logits, targets: torch.ops.ws1.logp_fwd(logits, targets)[0],
    namespaces=("ws1",),
)
