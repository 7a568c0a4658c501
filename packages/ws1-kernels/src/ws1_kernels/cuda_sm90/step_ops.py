"""``cuda_bf16_sm90``'s raw inference ops for the step path (``integrations.step``): ``cuda_bf16``'s, with the
Hopper GEMM (``torch.ops.ws1_sm90.gemm``, TMA + wgmma) for every projection and the lm_head, and the one-pass
logp (``torch.ops.ws1_sm90.logp_fwd``), as this profile's candidates run them: the rollout's logprob and the
trainer's are the same kernel's. The other nodes are the generic kernels here as in the profile."""

from __future__ import annotations

import dataclasses

import torch

from ..cuda.step_ops import STEP_OPS as GENERIC

STEP_OPS = dataclasses.replace(
    GENERIC,
    linear=lambda x, w: torch.ops.ws1_sm90.gemm(x, w, True),
    logp=lambda logits, targets: torch.ops.ws1_sm90.logp_fwd(logits, targets)[0],
    namespaces=("ws1", "ws1_sm90"),
)
