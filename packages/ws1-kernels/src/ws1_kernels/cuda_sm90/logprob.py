"""logp (cuda_bf16_sm90): selected-token log-probabilities in fp32 in one pass over the bf16 logits
(``torch.ops.ws1_sm90.logp_fwd``, csrc/sm90/logp_sm90.cu).

One block per row: each thread folds its 16-byte vectors of the row, in ascending order, into an online
(max, sum of exp) pair; the warps' pairs fold in a fixed order, so the bits depend only on V. The generic kernel
reads each row twice with scalar loads (0.78 ms at 4096 x 151936 on the H200); this one reads it once at copy
bandwidth. The backward is elementwise, one 16-byte vector per thread. A row whose address or width does not allow
16-byte loads takes scalar loads and the same arithmetic (the GPU tests check that both give the same bits).

linear_logp: the forward is fused (``ws1_sm90.linear_logp_fwd``, csrc/sm90/linear_logp_sm90.cu). The GEMM's
epilogue (det_gemm's wgmma mainloop on a tile from its own M table, ``FUSED_BUCKETS``: every tile holds the same
values of a 128-wide vocab block in the same lanes, so the bits do not depend on it) reduces each row's 128-wide
vocab block of fp32 logits, still in registers, to a (max, sum of exp) pair; a second kernel folds a row's pairs in
ascending block order. The ``[T, V]`` fp32 logits are never written: the forward keeps ``lse`` only. The backward
recomputes the logits with the same GEMM (``ws1_sm90.gemm_f32``: the same accumulators, stored unrounded) and splits ``dlogits``
into two bf16 halves with the generic kernel. dx is the Hopper GEMM again (each half times the weight with an fp32
store, summed in fp32, rounded once); the weight gradient is Hopper's own (``linear.hopper_wgrad``, over both halves)
where the weight's dims are multiples of 128, the generic sample-block kernel otherwise. Its launches record this
profile's id for the recompute and dx, the weight gradient's own id, and the generic id for the split.
"""

from __future__ import annotations

import torch

from ..backend import OpEntry
from ..context import LayoutContext
from ..cuda import logprob as generic
from .linear import WGRAD_KERNEL, _check_align, hopper_wgrad

#: the fused forward's M buckets (upper bounds, inclusive) of csrc/sm90/ws1_sm90.h (kFusedSmallM, kFusedMidM):
#: 64x128 ping-pong, 128x128, 128x256 above; the GPU tests read the extension's own and check both sides of each
FUSED_BUCKETS = (64, 256)

KERNEL = "ws1.cuda_sm90.logp.onepass"
LINEAR_KERNEL = "ws1.cuda_sm90.linear_logp.wgmma"

HOPPER = generic.LogpKernels(
    lambda logits, targets: torch.ops.ws1_sm90.logp_fwd(logits, targets),
    lambda logits, targets, lse, g: torch.ops.ws1_sm90.logp_bwd(logits, targets, lse, g),
    KERNEL,
)


def _dx(hi: torch.Tensor, lo: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``dx = hi W + lo W``: each bf16 half of ``dlogits`` through the Hopper GEMM with an fp32 store (one
    accumulator chain over V each), their sum in fp32, one rounding to bf16. Row-local, a fixed order."""
    return (
        torch.ops.ws1_sm90.gemm_f32(hi, weight, False) + torch.ops.ws1_sm90.gemm_f32(lo, weight, False)
    ).to(torch.bfloat16)


HOPPER_LINEAR = generic.LinearLogpForward(
    lambda x, weight: torch.ops.ws1_sm90.gemm_f32(x, weight, True),
    LINEAR_KERNEL,
    fused=lambda x, weight, targets: torch.ops.ws1_sm90.linear_logp_fwd(x, weight, targets),
    dx=_dx,
    wgrad=hopper_wgrad,
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
# the fused forward; the backward's recompute of the logits and its dx (gemm_f32, the halves summed by aten.add);
# the generic backward's own ops otherwise (its dlogits split and weight gradient)
_LINEAR_DECLARED = (generic._LINEAR_DECLARED - {"ws1.gemm_f32_out", "ws1.logp_fwd_f32", "ws1.gemm"}) | {
    "ws1_sm90.linear_logp_fwd",
    "ws1_sm90.gemm_f32",
    "ws1_sm90.wgrad",
    "aten.add",
}
OPS: dict[str, OpEntry] = {
    "logp": OpEntry(logp, KERNEL, _DECLARED),
    "linear_logp": OpEntry(
        linear_logp, LINEAR_KERNEL, _LINEAR_DECLARED, frozenset({generic.LINEAR_KERNEL, WGRAD_KERNEL})
    ),
}
