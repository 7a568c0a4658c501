"""logp and linear_logp (cuda_bf16): selected-token log-probabilities in fp32 (``torch.ops.ws1.logp_fwd``).

One block per row: fixed-order max and sum of ``exp(x - max)`` (the order depends only on V), ``lse`` kept for the
backward, ``dlogits = g * (onehot - exp(x - lse))`` one element per thread (csrc/kernels/logprob.cu).

linear_logp keeps its logits in fp32: ``gemm_f32_out`` (the det_gemm kernel with an fp32 store), the same row
kernels on fp32 input, then ``dlogits`` split into two bf16 halves (hi + lo) through the det_gemm kernels for dx
and the sample-block weight gradient (two MMAs per step: near fp32 precision). It materialises the ``[T, V]`` fp32 logits (the fused, chunked form is later work): correct, not lean.

The autograd functions take their kernels as an argument (``LogpKernels``, ``LinearLogpForward``), so the Hopper
profile (``cuda_sm90.logprob``) runs its own forward kernels through the same checks and the same backward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import _validate as v
from ..backend import OpEntry
from ..context import LayoutContext
from ..launches import record
from ..main_grad import check_main_grad
from ..op_checks import check_targets
from ._common import check_inputs
from .linear import WgradPick, pick_wgrad, wgrad_into_main_grad

KERNEL = "ws1.cuda.logp.rowwise"
LINEAR_KERNEL = "ws1.cuda.linear_logp.vocabblock"


@dataclass(frozen=True)
class LogpKernels:
    """A profile's logp: ``fwd(logits, targets) -> (out, lse)``, ``bwd(logits, targets, lse, g) -> dlogits`` and the
    kernel id both record."""

    fwd: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    bwd: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    kernel: str


@dataclass(frozen=True)
class LinearLogpForward:
    """A profile's linear_logp forward and the id it records; the backward is this module's (the generic kernels,
    recording ``LINEAR_KERNEL``).

    ``logits(x, weight)`` gives the fp32 logits. Unfused (``logp`` set), the forward materialises them, runs
    ``logp(logits, targets) -> (out, lse)`` and keeps them for the backward. Fused (``fused`` set), the forward is
    ``fused(x, weight, targets) -> (out, lse)`` and never writes them: the backward recomputes them with ``logits``
    (the same GEMM, so the same bits the fused forward reduced) and records ``kernel`` for that GEMM.

    ``dx(hi, lo, weight) -> dx`` (bf16), if set, replaces the generic dx GEMM over the two bf16 halves of
    ``dlogits`` and records ``kernel``. ``wgrad(weight)``, if set, may give the profile's own weight gradient for
    that weight (by its shape alone): (the id it records, its op)."""

    logits: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    kernel: str
    logp: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    fused: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = (
        None
    )
    dx: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    wgrad: WgradPick | None = None

    def __post_init__(self) -> None:
        if (self.logp is None) == (self.fused is None):
            raise ValueError("LinearLogpForward: give exactly one of logp (unfused) and fused")


class _Logp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, k):  # type: ignore[override]
        record(k.kernel, "fwd")
        out, lse = k.fwd(logits, targets)
        ctx.save_for_backward(logits, targets, lse)
        ctx.k = k
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None, None, None
        record(ctx.k.kernel, "bwd")
        logits, targets, lse = ctx.saved_tensors
        return ctx.k.bwd(logits, targets, lse, g.float().contiguous()), None, None


GENERIC = LogpKernels(
    lambda logits, targets: torch.ops.ws1.logp_fwd(logits, targets),
    lambda logits, targets, lse, g: torch.ops.ws1.logp_bwd(logits, targets, lse, g),
    KERNEL,
)


def checked_logp(
    where: str, k: LogpKernels, logits: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext
) -> torch.Tensor:
    """The checks every profile's logp makes, then ``k`` through the autograd function."""
    v.tensor(where, "logits", logits, 2, None)
    check_inputs(where, ctx, logits.shape[0], logits=logits)
    check_targets(where, targets, logits.shape[1], logits.shape[0])
    if targets.device != logits.device:
        raise v.KernelInputError(f"{where}: targets on {targets.device}, logits on {logits.device}")
    return _Logp.apply(logits, targets.contiguous(), k)


def logp(logits: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``log_softmax(logits)[t, targets[t]]`` in fp32: ``[T,V], [T] -> [T]``."""
    return checked_logp("cuda_bf16.logp", GENERIC, logits, targets, ctx)


class _LinearLogp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, lctx, f):  # type: ignore[override]
        record(f.kernel, "fwd")
        if f.fused is not None:
            out, lse = f.fused(x, weight, targets)
            ctx.save_for_backward(x, weight, targets, lse)
        else:
            logits = f.logits(x, weight)
            out, lse = f.logp(logits, targets)
            ctx.save_for_backward(x, weight, targets, lse, logits)
        ctx.lctx, ctx.f = lctx, f
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        x, weight, targets, lse, *kept = ctx.saved_tensors
        do_dx, do_dw = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
        if not (do_dx or do_dw):
            return None, None, None, None, None
        if kept:
            (logits,) = kept
        else:  # the fused forward kept no logits: the same GEMM again
            record(ctx.f.kernel, "bwd")
            logits = ctx.f.logits(x, weight)
        record(LINEAR_KERNEL, "bwd")
        # fp32 dlogits as two bf16 halves (hi + lo): each GEMM step takes both, near fp32 precision (one bf16
        # dlogits put the tiny-width long-tier weight gradient 2.4x over the contract's bound)
        hi, lo = torch.ops.ws1.logp_bwd_f32(logits, targets, lse, g.float().contiguous())
        del logits
        dx = None
        if do_dx and ctx.f.dx is not None:
            record(ctx.f.kernel, "bwd")
            dx = ctx.f.dx(hi, lo, weight)
        elif do_dx:
            dx = torch.ops.ws1.gemm(hi, weight, False, lo)
        if do_dw:
            kernel, op = pick_wgrad(
                ctx.f.wgrad, weight, None
            )  # the generic one is LINEAR_KERNEL's, recorded above
            if kernel is not None:
                record(kernel, "bwd")
            wgrad_into_main_grad(hi, x, weight, ctx.lctx, lo, op=op)
        return dx, None, None, None, None


GENERIC_LINEAR = LinearLogpForward(
    lambda x, weight: torch.ops.ws1.gemm_f32_out(x, weight),
    LINEAR_KERNEL,
    logp=lambda logits, targets: torch.ops.ws1.logp_fwd_f32(logits, targets),
)


def checked_linear_logp(
    where: str,
    f: LinearLogpForward,
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ctx: LayoutContext,
    check: Callable[[str, torch.Tensor, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """The checks every profile's linear_logp makes (``check``: a profile's own, e.g. alignment), then ``f``'s
    forward and the generic backward through the autograd function."""
    v.tensor(where, "x", x, 2, None)
    v.tensor(where, "weight", weight, 2, None)
    v.dims(where, "weight", weight, (None, x.shape[1]))
    if check is not None:
        check(where, x, weight)
    check_inputs(where, ctx, x.shape[0], x=x, weight=weight)
    check_targets(where, targets, weight.shape[0], x.shape[0])
    if targets.device != x.device:
        raise v.KernelInputError(f"{where}: targets on {targets.device}, x on {x.device}")
    check_main_grad(where, weight)
    return _LinearLogp.apply(x, weight, targets.contiguous(), ctx, f)


def linear_logp(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext
) -> torch.Tensor:
    """``log_softmax(x W^T)[t, targets[t]]`` with fp32 logits: ``[T,H], [V,H], [T] -> [T]``."""
    return checked_linear_logp("cuda_bf16.linear_logp", GENERIC_LINEAR, x, weight, targets, ctx)


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
