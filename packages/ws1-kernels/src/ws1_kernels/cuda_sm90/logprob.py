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
its launches record the generic id.
"""

from __future__ import annotations

import torch

from .. import _validate as v
from ..backend import OpEntry
from ..context import LayoutContext
from ..cuda import logprob as generic
from ..cuda._common import check_inputs
from ..launches import record
from ..main_grad import check_main_grad
from ..op_checks import check_targets
from .linear import _check_align

KERNEL = "ws1.cuda_sm90.logp.onepass"
LINEAR_KERNEL = "ws1.cuda_sm90.linear_logp.wgmma"


class _Logp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets):  # type: ignore[override]
        record(KERNEL, "fwd")
        out, lse = torch.ops.ws1_sm90.logp_fwd(logits, targets)
        ctx.save_for_backward(logits, targets, lse)
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None, None
        record(KERNEL, "bwd")
        logits, targets, lse = ctx.saved_tensors
        return torch.ops.ws1_sm90.logp_bwd(logits, targets, lse, g.float().contiguous()), None


def logp(logits: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``log_softmax(logits)[t, targets[t]]`` in fp32: ``[T,V], [T] -> [T]``."""
    where = "cuda_bf16_sm90.logp"
    v.tensor(where, "logits", logits, 2, None)
    check_inputs(where, ctx, logits.shape[0], logits=logits)
    check_targets(where, targets, logits.shape[1], logits.shape[0])
    if targets.device != logits.device:
        raise v.KernelInputError(f"{where}: targets on {targets.device}, logits on {logits.device}")
    return _Logp.apply(logits, targets.contiguous())


class _LinearLogp(generic._LinearLogp):
    """The generic autograd function with the Hopper forward; its backward (the generic kernels) is inherited."""

    @staticmethod
    def forward(ctx, x, weight, targets, lctx):  # type: ignore[override]
        record(LINEAR_KERNEL, "fwd")
        logits = torch.ops.ws1_sm90.gemm_f32(x, weight)
        out, lse = torch.ops.ws1_sm90.logp_fwd_f32(logits, targets)
        ctx.save_for_backward(x, weight, targets, logits, lse)
        ctx.lctx = lctx
        return out


def linear_logp(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext
) -> torch.Tensor:
    """``log_softmax(x W^T)[t, targets[t]]`` with fp32 logits: ``[T,H], [V,H], [T] -> [T]``."""
    where = "cuda_bf16_sm90.linear_logp"
    v.tensor(where, "x", x, 2, None)
    v.tensor(where, "weight", weight, 2, None)
    v.dims(where, "weight", weight, (None, x.shape[1]))
    _check_align(where, x, weight)
    check_inputs(where, ctx, x.shape[0], x=x, weight=weight)
    check_targets(where, targets, weight.shape[0], x.shape[0])
    if targets.device != x.device:
        raise v.KernelInputError(f"{where}: targets on {targets.device}, x on {x.device}")
    check_main_grad(where, weight)
    return _LinearLogp.apply(x, weight, targets.contiguous(), ctx)


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
