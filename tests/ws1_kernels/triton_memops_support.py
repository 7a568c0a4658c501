"""Support for the Triton memory-bound operator tests (norm, pointwise, embedding), interpreter and GPU.

Layouts and logical batches come from ``kernels_support``; the runner here is device- and dtype-generic (the
interpreter tests run fp32 on the CPU, the GPU tests bf16 on CUDA) and returns outputs and gradients in
logical order, with ``weight.main_grad`` as the parameter gradient.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from kernels_support import Batch, context, layout, logical_index
from torch.utils._python_dispatch import TorchDispatchMode

from ws1_kernels import LayoutContext, launches

INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_interpreter = pytest.mark.skipif(
    not INTERPRETING, reason="Triton CPU logic tests need TRITON_INTERPRET=1 (set before triton is imported)"
)

__all__ = ["Batch", "context", "layout"]


def tolerance(judgment: str, op_class: str, dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) from the contract for ``dtype`` (no private tolerances)."""
    from ws1_contract import load_contract

    spec = load_contract().resolve(judgment, op_class, {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype])
    return spec.atol, spec.rtol


def assert_close(
    name: str,
    cand: torch.Tensor,
    ref: torch.Tensor,
    judgment: str,
    op_class: str,
    dtype: torch.dtype | None = None,
) -> None:
    """Candidate within the contract tolerance of the fp32 reference, at ``dtype`` (default: the candidate's).

    An fp32 ``main_grad`` computed from bf16 inputs is judged at the bf16 tolerance, as the registry tests do.
    """
    atol, rtol = tolerance(judgment, op_class, dtype or cand.dtype)
    c, r = cand.detach().double().cpu(), ref.detach().double().cpu()
    assert c.shape == r.shape, f"{name}: shape {tuple(c.shape)} vs {tuple(r.shape)}"
    assert torch.isfinite(c).all(), f"{name}: non-finite candidate values"
    err = (c - r).abs()
    bad = err > atol + rtol * r.abs()
    assert not bad.any(), (
        f"{name}: {int(bad.sum())} of {bad.numel()} out of tolerance, max abs {float(err.max())}"
    )


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view({torch.bfloat16: torch.int16, torch.float32: torch.int32}[t.dtype])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool((bits(a) == bits(b)).all())


def assert_bitwise(name: str, a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, (
        f"{name}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    )
    diff = (bits(a) != bits(b)).reshape(a.shape[0], -1).any(-1)
    assert not diff.any(), f"{name}: rows {diff.nonzero().flatten().tolist()[:8]} differ in bits"


def gen(
    seed: int, shape, scale: float = 1.0, dtype: torch.dtype = torch.float32, device="cpu"
) -> torch.Tensor:
    """Deterministic normal values (drawn in fp32 on the CPU, then cast and moved)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype).to(device)


@dataclass
class LayoutResult:
    out: torch.Tensor  # logical order
    grads: dict[str, torch.Tensor]  # token-row gradients, logical order
    params: dict[str, torch.Tensor]  # the parameter leaves (main_grad on them)


def run_layout(
    call: Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor], LayoutContext], torch.Tensor],
    b: Batch,
    layout_name: str,
    rows: dict[str, torch.Tensor],
    params: dict[str, torch.Tensor] | None = None,
    ints: dict[str, torch.Tensor] | None = None,
    upstream: torch.Tensor | None = None,
    main_grad: torch.Tensor | None = None,
) -> LayoutResult:
    """Run ``call(phys_rows, params, ctx)`` once per physical call of ``layout_name``, restore logical order.

    ``rows``/``ints`` are logical ``[N, ...]`` tensors (pads get deterministic garbage floats / id 0);
    ``upstream`` is the logical output gradient (pads get zero) or None for a forward-only run;
    ``main_grad``: the starting value of every parameter's ``main_grad`` (zeros if None).
    """
    ints = ints or {}
    dev = next(iter({**rows, **ints}.values())).device
    train = upstream is not None
    leaves = {k: p.detach().clone().requires_grad_(train) for k, p in (params or {}).items()}
    for p in leaves.values():
        p.main_grad = (
            torch.zeros(p.shape, dtype=torch.float32, device=dev) if main_grad is None else main_grad.clone()
        )
    out_l: torch.Tensor | None = None
    grads = {k: torch.zeros_like(t) for k, t in rows.items()}
    for ci, c in enumerate(layout(b, layout_name)):
        idx = logical_index(b, c).to(dev)
        real = idx >= 0
        phys = {}
        for k, t in rows.items():
            x = t[idx.clamp(min=0)].clone()
            if (~real).any():
                x[~real] = gen(500 + ci, (int((~real).sum()), *t.shape[1:]), 1.0, t.dtype, dev)
            phys[k] = x.requires_grad_(train)
        phys_ints = {
            k: torch.where(real, t[idx.clamp(min=0)], torch.zeros_like(idx)) for k, t in ints.items()
        }
        out = call({**phys, **phys_ints}, leaves, context(c))
        if out_l is None:
            out_l = torch.zeros((b.total, *out.shape[1:]), dtype=out.dtype, device=dev)
        out_l[idx[real]] = out.detach()[real]
        if train:
            g = torch.zeros_like(out)
            g[real] = upstream[idx[real]]
            out.backward(g)
            for k, x in phys.items():
                if x.grad is not None:
                    grads[k][idx[real]] = x.grad[real]
    assert out_l is not None
    return LayoutResult(out_l, grads if train else {}, leaves)


class DispatchWatch(TorchDispatchMode):
    """Every aten overload packet dispatched inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


# what the Triton interpreter itself dispatches around every launch (it maps each tensor argument's storage
# to a host tensor and copies it back): not the candidate's ops, and absent on the GPU
INTERPRETER_OPS = frozenset({"aten.new_empty", "aten.set_", "aten.copy_", "aten.detach"})


def check_declared(spec, run: Callable[[], None], phases: set[str]) -> None:
    """``run`` launches only the OpEntry's kernels (recorded in ``phases``), dispatches only declared ops."""
    watch = DispatchWatch()
    with launches.observe() as log, watch:
        run()
    assert log.kernel_ids() <= spec.kernel_ids, (
        f"undeclared kernels {sorted(log.kernel_ids() - spec.kernel_ids)}"
    )
    assert {ph for _, ph in log.events} == phases
    seen = watch.ops - INTERPRETER_OPS if INTERPRETING else watch.ops
    assert seen <= spec.declared_ops, f"undeclared aten ops {sorted(seen - spec.declared_ops)}"
