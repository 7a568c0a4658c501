"""logp and linear_logp (cuda_bf16): selected-token log-probabilities in fp32 (``torch.ops.ws1.logp_fwd``).

One block per row: fixed-order max and sum of ``exp(x - max)`` (the order depends only on V), ``lse`` kept for the
backward, ``dlogits = g * (onehot - exp(x - lse))`` one element per thread (csrc/kernels/logprob.cu).

linear_logp keeps its logits in fp32: ``gemm_f32_out`` (the det_gemm kernel with an fp32 store), the same row
kernels on fp32 input, then ``dlogits`` split into two bf16 halves (hi + lo) through the det_gemm kernels for dx
and the sample-block weight gradient (two MMAs per step: near fp32 precision). It materialises the ``[T, V]`` fp32 logits (the fused, chunked form is later work): correct, not lean.
"""

from __future__ import annotations

import torch

from .. import _validate as v
from ..backend import OpEntry
from ..context import LayoutContext
from ..launches import record
from ..main_grad import check_main_grad
from ..op_checks import check_targets
from ._common import check_inputs
from .linear import wgrad_into_main_grad

KERNEL = "ws1.cuda.logp.rowwise"
LINEAR_KERNEL = "ws1.cuda.linear_logp.vocabblock"


class _Logp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets):  # type: ignore[override]
        record(KERNEL, "fwd")
        out, lse = torch.ops.ws1.logp_fwd(logits, targets)
        ctx.save_for_backward(logits, targets, lse)
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None, None
        record(KERNEL, "bwd")
        logits, targets, lse = ctx.saved_tensors
        return torch.ops.ws1.logp_bwd(logits, targets, lse, g.float().contiguous()), None


def logp(logits: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``log_softmax(logits)[t, targets[t]]`` in fp32: ``[T,V], [T] -> [T]``."""
    where = "cuda_bf16.logp"
    v.tensor(where, "logits", logits, 2, None)
    check_inputs(where, ctx, logits.shape[0], logits=logits)
    check_targets(where, targets, logits.shape[1], logits.shape[0])
    if targets.device != logits.device:
        raise v.KernelInputError(f"{where}: targets on {targets.device}, logits on {logits.device}")
    return _Logp.apply(logits, targets.contiguous())


class _LinearLogp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, lctx):  # type: ignore[override]
        record(LINEAR_KERNEL, "fwd")
        logits = torch.ops.ws1.gemm_f32_out(x, weight)
        out, lse = torch.ops.ws1.logp_fwd_f32(logits, targets)
        ctx.save_for_backward(x, weight, targets, logits, lse)
        ctx.lctx = lctx
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        x, weight, targets, logits, lse = ctx.saved_tensors
        do_dx, do_dw = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
        if not (do_dx or do_dw):
            return None, None, None, None
        record(LINEAR_KERNEL, "bwd")
        # fp32 dlogits as two bf16 halves (hi + lo): each GEMM step takes both, near fp32 precision (one bf16
        # dlogits put the tiny-width long-tier weight gradient 2.4x over the contract's bound)
        hi, lo = torch.ops.ws1.logp_bwd_f32(logits, targets, lse, g.float().contiguous())
        dx = torch.ops.ws1.gemm(hi, weight, False, lo) if do_dx else None
        if do_dw:
            wgrad_into_main_grad(hi, x, weight, ctx.lctx, lo)
        return dx, None, None, None


def linear_logp(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext
) -> torch.Tensor:
    """``log_softmax(x W^T)[t, targets[t]]`` with fp32 logits: ``[T,H], [V,H], [T] -> [T]``."""
    where = "cuda_bf16.linear_logp"
    v.tensor(where, "x", x, 2, None)
    v.tensor(where, "weight", weight, 2, None)
    v.dims(where, "weight", weight, (None, x.shape[1]))
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
        "ws1.logp_fwd",
        "ws1.logp_bwd",
        "aten.aminmax",
        "aten._local_scalar_dense",
        "aten._to_copy",
        "aten.clone",
        "aten.detach",
    }
)
_LINEAR_DECLARED = frozenset(
    {
        "ws1.gemm_f32_out",
        "ws1.logp_fwd_f32",
        "ws1.logp_bwd_f32",
        "ws1.gemm",
        "ws1.gemm_wgrad",
        "aten.aminmax",
        "aten._local_scalar_dense",
        "aten._to_copy",
        "aten.lift_fresh",
        "aten.zeros",
        "aten.clone",
        "aten.detach",
    }
)
OPS: dict[str, OpEntry] = {
    "logp": OpEntry(logp, KERNEL, _DECLARED),
    "linear_logp": OpEntry(linear_logp, LINEAR_KERNEL, _LINEAR_DECLARED),
}
