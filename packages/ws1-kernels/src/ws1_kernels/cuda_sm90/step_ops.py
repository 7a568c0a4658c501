"""``cuda_bf16_sm90``'s raw inference ops for the step path (``integrations.step``): ``cuda_bf16``'s, with the
Hopper GEMM (``torch.ops.ws1_sm90.gemm``, TMA + wgmma) for every projection and the lm_head, the one-pass
logp (``torch.ops.ws1_sm90.logp_fwd``) and the Hopper attention forward (``torch.ops.ws1_sm90.attn_fwd``), as this
profile's candidates run them: the rollout's logprob and the
trainer's are the same kernel's. The other nodes are the generic kernels here as in the profile."""

from __future__ import annotations

import dataclasses

import torch

from ..cuda.step_ops import STEP_OPS as GENERIC
from .attention import SCHEDULE, STEP_BLOCK_ROWS, supports


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_base: torch.Tensor,
    n_keys: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    # the candidate's choice of kernel for these widths; one token a CTA (no host table)
    if not supports(q.shape[1], k.shape[1], q.shape[2]):
        return GENERIC.attention(q, k, v, key_base, n_keys, scale)
    o, _ = torch.ops.ws1_sm90.attn_fwd(q, k, v, key_base, n_keys, None, STEP_BLOCK_ROWS, scale, SCHEDULE)
    return o


STEP_OPS = dataclasses.replace(
    GENERIC,
    linear=lambda x, w: torch.ops.ws1_sm90.gemm(x, w, True),
    logp=lambda logits, targets: torch.ops.ws1_sm90.logp_fwd(logits, targets)[0],
    attention=_attention,
    namespaces=("ws1", "ws1_sm90"),
)
