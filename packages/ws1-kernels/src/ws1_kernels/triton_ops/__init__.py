"""The ``triton_cuda_bf16`` profile: Triton kernels, batch-invariant by construction.

One module per operator family; each holds its ``@triton.jit`` kernels, its ``torch.autograd.Function`` and the
public entry points, and exports for every operator it implements::

    OPS[operator] = OpSpec(fn, kernels, declared_ops, forward)

``forward`` is the kernel the forward launches, the candidate's primary id (what the manifest's profile table
names, as ``triton:<forward>``); ``kernels`` are the Triton kernel names the operator may launch (forward and backward), recorded at the launch
site as ``triton:<name>`` (``_launch.launch``) and seen again by the harness through Triton's own launch hook;
``declared_ops`` are the aten overload packets the entry point may dispatch around its launches (allocation,
the host-to-device copy of the layout ids).

Rules every kernel here follows (docs/kernels.md): each output element's reduction order depends only on the
reduced length; no split-K, no batch-dependent split-KV, no atomics on reduced values, no runtime autotuner
(tile tables are frozen and keyed by shape buckets); fp32 accumulation; parameter gradients under
``sample_blocks_main_grad``.  Under ``TRITON_INTERPRET=1`` the same kernels run on CPU tensors for logic tests.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PROFILE = "triton_cuda_bf16"
MIN_ARCH = "sm80"

# operator -> module of this package that implements it
MODULES: dict[str, str] = {
    "det_gemm": "gemm",
    "lm_head": "gemm",
    "logp": "logprob",
    "linear_logp": "logprob",
    "rms_norm": "norm",
    "qk_norm": "norm",
    "rope": "pointwise",
    "silu": "pointwise",
    "swiglu": "pointwise",
    "embedding": "embedding",
    "attention": "attention",
}


@dataclass(frozen=True)
class OpSpec:
    """What the registry needs of one Triton operator."""

    fn: Callable[..., Any]
    kernels: frozenset[str]
    declared_ops: frozenset[str]
    forward: str

    def __post_init__(self) -> None:
        if self.forward not in self.kernels:
            raise ValueError(f"OpSpec: forward kernel {self.forward!r} is not among {sorted(self.kernels)}")

    @property
    def kernel_id(self) -> str:
        """The primary id: the forward kernel, as launch sites and the launch hook name it."""
        return f"triton:{self.forward}"

    @property
    def kernel_ids(self) -> frozenset[str]:
        return frozenset(f"triton:{k}" for k in self.kernels)


def triton_missing() -> str | None:
    """None when Triton imports, else a one-line reason."""
    try:
        import triton  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"triton does not import: {type(exc).__name__}: {exc}".splitlines()[0]
    return None


def load_ops() -> tuple[dict[str, OpSpec], dict[str, str]]:
    """Import every operator module; return (operator -> OpSpec, operator -> why it is missing)."""
    found: dict[str, OpSpec] = {}
    missing: dict[str, str] = {}
    why_no_triton = triton_missing()
    for op, module in MODULES.items():
        if why_no_triton is not None:
            missing[op] = why_no_triton
            continue
        try:
            mod = importlib.import_module(f"{__name__}.{module}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{module}":
                missing[op] = f"module triton_ops.{module} not written yet"
                continue
            raise
        spec = getattr(mod, "OPS", {}).get(op)
        if spec is None:
            missing[op] = f"triton_ops.{module} has no OPS[{op!r}]"
        else:
            found[op] = spec
    return found, missing
