"""logp (cuda_bf16_sm90): selected-token log-probabilities in fp32 in one pass over the bf16 logits
(``torch.ops.ws1_sm90.logp_fwd``, csrc/sm90/logp_sm90.cu).

One block per row: each thread folds its 16-byte vectors of the row, in ascending order, into an online
(max, sum of exp) pair; the warps' pairs fold in a fixed order, so the bits depend only on V. The generic kernel
reads each row twice with scalar loads (0.78 ms at 4096 x 151936 on the H200); this one reads it once at copy
bandwidth. The backward is elementwise, one 16-byte vector per thread. A row whose address or width does not allow
16-byte loads takes scalar loads and the same arithmetic (the GPU tests check that both give the same bits).

linear_logp: the forward's fp32 logits come from the Hopper GEMM with an fp32 epilogue (``ws1_sm90.gemm_f32``: the
wgmma mainloop of det_gemm, the accumulator stored unrounded) and go through the same one-pass kernel on fp32
(``ws1_sm90.logp_fwd_f32``). The logits are still materialised (``[T, V]`` fp32, as in the generic path), and the
backward is the generic one (``dlogits`` as two bf16 halves through the generic dx and weight-gradient kernels), so
its launches record the generic id (the generic module's autograd function, with this profile's forward).
"""

from __future__ import annotations

import torch

from ..backend import OpEntry
from ..context import LayoutContext
from ..cuda import logprob as generic
from .linear import _check_align

KERNEL = "ws1.cuda_sm90.logp.onepass"
LINEAR_KERNEL = "ws1.cuda_sm90.linear_logp.wgmma"

HOPPER = generic.LogpKernels(
    lambda logits, targets: torch.ops.ws1_sm90.logp_fwd(logits, targets),
    lambda logits, targets, lse, g: torch.ops.ws1_sm90.logp_bwd(logits, targets, lse, g),
    KERNEL,
)
HOPPER_LINEAR = generic.LinearLogpForward(
    lambda x, weight: torch.ops.ws1_sm90.gemm_f32(x, weight),
    lambda logits, targets: torch.ops.ws1_sm90.logp_fwd_f32(logits, targets),
    LINEAR_KERNEL,
)


def logp(logits: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``log_softmax(logits)[t, targets[t]]`` in fp32: ``[T,V], [T] -> [T]``."""
    return generic.checked_logp("cuda_bf16_sm90.logp", HOPPER, logits, targets, ctx)


def linear_logp(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext
) -> torch.Tensor:
    """``log_softmax(x W^T)[t, targets[t]]`` with fp32 logits: ``[T,H], [V,H], [T] -> [T]``."""
    return generic.checked_linear_logp(
        "cuda_bf16_sm90.linear_logp", HOPPER_LINEAR, x, weight, targets, ctx, _check_align
    )


# aminmax/_local_scalar_dense: the host check of the target range; _to_copy/clone: g as contiguous fp32;
# detach: autograd's bookkeeping
_DECLARED = frozenset(
    {
        "ws1_sm90.logp_fwd",
        "ws1_sm90.logp_bwd",
        "aten.aminmax",
        "aten._local_scalar_dense",
        "aten._to_copy",
        "aten.clone",
        "aten.detach",
    }
)
_LINEAR_DECLARED = (generic._LINEAR_DECLARED - {"ws1.gemm_f32_out", "ws1.logp_fwd_f32"}) | {
    "ws1_sm90.gemm_f32",
    "ws1_sm90.logp_fwd_f32",
}
OPS: dict[str, OpEntry] = {
    "logp": OpEntry(logp, KERNEL, _DECLARED),
    "linear_logp": OpEntry(linear_logp, LINEAR_KERNEL, _LINEAR_DECLARED, frozenset({generic.LINEAR_KERNEL})),
}
