"""The gate's regression suite: portable_cpu candidates each broken the way real kernels break.

Every fault is a plug-in profile of one operator (`teeth_profiles:<NAME>`, or `profile(name)` in process) and
`FAULTS[name]` says which judgments it must turn red and for which reason. Each fault needs a hard case of the
workload to be seen (a repeated token id, a zero of either sign, a row whose mean square is near eps, a call of
a few rows, a padded call), or a check of the harness (every call observed, inputs unchanged, output shapes).
`tests/ws1_harness/test_harness_teeth_faults.py` runs each one at the `tiny` widths and asserts it is red for
its own reason.

    PYTHONPATH=tests/ws1_harness ws1 matrix --profile teeth_embedding_repeat_once \\
        --candidates teeth_profiles:EMBEDDING_REPEAT_ONCE --op embedding --model tiny --out /tmp/teeth
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ws1_kernels import LayoutContext, registry
from ws1_kernels.registry import Candidate

Tensor = torch.Tensor

# the ops a fault wrapper adds around the portable candidate (forward and backward); declared, so that only the
# fault itself can turn a cell red
WRAPPER_OPS = frozenset(
    {
        "aten._local_scalar_dense",
        "aten.add",
        "aten.any",
        "aten.bitwise_and",
        "aten.bitwise_not",
        "aten.cat",
        "aten.clone",
        "aten.div",
        "aten.eq",
        "aten.full_like",
        "aten.index",
        "aten.index_put_",
        "aten.logical_and",
        "aten.logical_not",
        "aten.lt",
        "aten.masked_fill",
        "aten.mul",
        "aten.mul_",
        "aten.ones_like",
        "aten.scalar_tensor",
        "aten.select",
        "aten.signbit",
        "aten.slice",
        "aten.unique",
        "aten.unsqueeze",
        "aten.where",
        "aten.zeros",
    }
)


def portable(op: str) -> Candidate:
    return registry.resolve("portable_cpu", op, device="cpu")


class ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the incoming gradient by `factor` (or by a mask)."""

    @staticmethod
    def forward(ctx, x, factor):  # type: ignore[override]
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return g * ctx.factor, None


def scale_grad(x: Tensor, factor: float | Tensor) -> Tensor:
    return ScaleGrad.apply(x, factor)


# ---- the faults -------------------------------------------------------------------------------------------


def embedding_repeat_once(ids: Tensor, weight: Tensor, ctx: LayoutContext) -> Tensor:
    """The backward counts a repeated token id once: only its first occurrence in the call adds a gradient."""
    out = portable("embedding").fn(ids, weight, ctx)
    first = torch.zeros(ids.shape[0], dtype=torch.bool)
    seen: set[int] = set()
    for i, t in enumerate(ids.tolist()):
        if t not in seen:
            first[i] = True
            seen.add(t)
    return scale_grad(out, first[:, None].to(out.dtype))


def swiglu_neg_zero_padded(gate: Tensor, up: Tensor, ctx: LayoutContext) -> Tensor:
    """Turns every +0.0 of the output into -0.0, only in calls that hold pad rows."""
    out = portable("swiglu").fn(gate, up, ctx)
    if bool((ctx.sample_ids < 0).any()):
        plus_zero = (out == 0) & ~torch.signbit(out)
        out = torch.where(plus_zero, torch.full_like(out, -0.0), out)
    return out


def rms_norm_no_eps(x: Tensor, weight: Tensor, eps: float, ctx: LayoutContext) -> Tensor:
    """Ignores eps (1e-30 in its place, the kernel refuses 0): fine while every row's RMS is near 1, wrong on
    rows whose mean square is comparable to eps."""
    return portable("rms_norm").fn(x, weight, 1e-30, ctx)


def det_gemm_dx_times(factor: float) -> Callable[..., Tensor]:
    def fn(x: Tensor, weight: Tensor, ctx: LayoutContext) -> Tensor:
        """dx scaled by `factor`; the forward and dW are right."""
        return portable("det_gemm").fn(scale_grad(x, factor), weight, ctx)

    return fn


def linear_logp_bf16_logits(x: Tensor, weight: Tensor, targets: Tensor, ctx: LayoutContext) -> Tensor:
    """The logprob of bf16-rounded logits: the lm_head output rounded to bf16, then the logprob kernel."""
    logits = portable("lm_head").fn(x, weight, ctx)
    return portable("logp").fn(logits, targets, ctx)


def silu_silent_small_calls(x: Tensor, ctx: LayoutContext) -> Tensor:
    """Calls of four rows or fewer run an unrecorded computation (same values, nothing at a launch site)."""
    if x.shape[0] <= 4:
        xf = x.float()
        return (xf * torch.sigmoid(xf)).to(torch.bfloat16)
    return portable("silu").fn(x, ctx)


def rms_norm_writes_weight(x: Tensor, weight: Tensor, eps: float, ctx: LayoutContext) -> Tensor:
    """Changes its weight through `.data` (no version bump), after computing with the right one."""
    out = portable("rms_norm").fn(x, weight, eps, ctx)
    weight.data.mul_(1.0078125)
    return out


def det_gemm_flinear(x: Tensor, weight: Tensor, ctx: LayoutContext) -> Tensor:
    """A quiet fallback to the stock bf16 `F.linear`, recording the portable kernel id."""
    from ws1_kernels.launches import record

    record(portable("det_gemm").kernel_id, "fwd")
    return F.linear(x, weight)


def silu_extra_row(x: Tensor, ctx: LayoutContext) -> Tensor:
    """One output row too many."""
    out = portable("silu").fn(x, ctx)
    return torch.cat([out, out[:1]])


def times_output(op: str, factor: float = 1.1) -> Callable[..., Tensor]:
    base = portable(op).fn

    def fn(*args: object) -> Tensor:
        """Every output element scaled by `factor`."""
        return base(*args) * factor

    return fn


def times_gradient(op: str, factor: float = 1.1) -> Callable[..., Tensor]:
    base = portable(op).fn

    def fn(*args: object) -> Tensor:
        """Every gradient, token and parameter, scaled by `factor` (the upstream gradient is scaled)."""
        return scale_grad(base(*args), factor)

    return fn


# ---- the table ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One broken candidate: its operator, function, the judgments it must turn red, and the reasons allowed."""

    operator: str
    fn: Callable[..., Tensor]
    red: tuple[str, ...]
    reasons: frozenset[str]
    extra_ops: frozenset[str] = frozenset()
    extra_kernels: frozenset[str] = frozenset()


ACCURACY = frozenset({"tolerance_exceeded", "non_finite"})
DIFFERENTIABLE = ("embedding", "rms_norm", "qk_norm", "det_gemm", "rope", "attention", "silu", "swiglu")
OPERATORS = (*DIFFERENTIABLE, "lm_head", "logp", "linear_logp")

FAULTS: dict[str, Fault] = {
    "embedding_repeat_once": Fault(
        "embedding", embedding_repeat_once, ("gradient_accuracy",), frozenset({"tolerance_exceeded"})
    ),
    "swiglu_neg_zero_padded": Fault(
        "swiglu", swiglu_neg_zero_padded, ("forward_invariance",), frozenset({"bits_differ"})
    ),
    "rms_norm_no_eps": Fault("rms_norm", rms_norm_no_eps, ("forward_accuracy",), ACCURACY),
    "det_gemm_dx_x1_5": Fault(
        "det_gemm", det_gemm_dx_times(1.5), ("gradient_accuracy",), frozenset({"tolerance_exceeded"})
    ),
    "det_gemm_dx_x1_1": Fault(
        "det_gemm", det_gemm_dx_times(1.1), ("gradient_accuracy",), frozenset({"tolerance_exceeded"})
    ),
    "linear_logp_bf16_logits": Fault(
        "linear_logp",
        linear_logp_bf16_logits,
        ("forward_accuracy",),
        frozenset({"tolerance_exceeded"}),
        extra_ops=frozenset({"aten.amax", "aten.maximum", "aten.gather", "aten.log", "aten.sub"})
        | registry.resolve("portable_cpu", "lm_head", device="cpu").declared_ops
        | registry.resolve("portable_cpu", "logp", device="cpu").declared_ops,
        extra_kernels=frozenset({portable("lm_head").kernel_id, portable("logp").kernel_id}),
    ),
    "silu_silent_small_calls": Fault(
        "silu",
        silu_silent_small_calls,
        ("forward_accuracy", "forward_invariance"),
        frozenset({"no_kernel_observed"}),
        extra_ops=frozenset({"aten.sigmoid", "aten.sigmoid_backward"}),
    ),
    "rms_norm_writes_weight": Fault(
        "rms_norm",
        rms_norm_writes_weight,
        ("forward_accuracy", "forward_invariance"),
        frozenset({"input_modified"}),
    ),
    "det_gemm_flinear": Fault(
        "det_gemm", det_gemm_flinear, ("forward_accuracy", "forward_invariance"), frozenset({"undeclared_op"})
    ),
    "silu_extra_row": Fault(
        "silu",
        silu_extra_row,
        ("forward_accuracy", "forward_invariance", "gradient_accuracy", "gradient_invariance"),
        frozenset({"shape_mismatch"}),
    ),
}
for _op in OPERATORS:
    FAULTS[f"{_op}_output_x1_1"] = Fault(_op, times_output(_op), ("forward_accuracy",), ACCURACY)
for _op in (*DIFFERENTIABLE, "lm_head", "logp", "linear_logp"):
    FAULTS[f"{_op}_gradient_x1_1"] = Fault(_op, times_gradient(_op), ("gradient_accuracy",), ACCURACY)


def candidate(name: str) -> Candidate:
    """The broken candidate of fault `name`, as a portable candidate of profile `teeth_<name>`."""
    fault = FAULTS[name]
    base = portable(fault.operator)
    return replace(
        base,
        profile=f"teeth_{name}",
        fn=fault.fn,
        declared_ops=base.declared_ops | WRAPPER_OPS | fault.extra_ops,
        kernel_ids=base.kernel_ids | fault.extra_kernels,
    )


def profile(name: str) -> tuple[str, list[Candidate]]:
    """The plug-in profile of one fault."""
    cand = candidate(name)
    return cand.profile, [cand]


def _plugin(name: str) -> Callable[[], tuple[str, list[Candidate]]]:
    return lambda: profile(name)


EMBEDDING_REPEAT_ONCE = _plugin("embedding_repeat_once")
SWIGLU_NEG_ZERO_PADDED = _plugin("swiglu_neg_zero_padded")
RMS_NORM_NO_EPS = _plugin("rms_norm_no_eps")
DET_GEMM_DX_X1_5 = _plugin("det_gemm_dx_x1_5")
DET_GEMM_DX_X1_1 = _plugin("det_gemm_dx_x1_1")
LINEAR_LOGP_BF16_LOGITS = _plugin("linear_logp_bf16_logits")
SILU_SILENT_SMALL_CALLS = _plugin("silu_silent_small_calls")
RMS_NORM_WRITES_WEIGHT = _plugin("rms_norm_writes_weight")
DET_GEMM_FLINEAR = _plugin("det_gemm_flinear")
SILU_EXTRA_ROW = _plugin("silu_extra_row")
