"""Launch a Triton kernel and record it at the launch site.

The id recorded is ``triton:<kernel name>``: the same name Triton's launch hook reports, so the harness can check
that what a candidate says it launched is what Triton really launched.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..errors import KernelInputError
from ..launches import record
from ._bound import BoundLauncher


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1`` (kernels run on CPU tensors, for logic tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_IDS: dict[int, tuple[str, bool]] = {}


def kernel_name(kernel: Any) -> str:
    """The name of a ``@triton.jit`` function, as the launch hook reports it."""
    fn = getattr(kernel, "fn", kernel)
    return str(getattr(fn, "__name__", kernel))


def _kernel_facts(kernel: Any) -> tuple[str, bool]:
    """``triton:<name>`` and whether the kernel is interpreted, once per kernel (both are fixed when Triton
    decorates it: ``TRITON_INTERPRET`` is read then; a per-call environment read is host time)."""
    facts = _IDS.get(id(kernel))
    if facts is None:
        facts = _IDS[id(kernel)] = (f"triton:{kernel_name(kernel)}", interpreting())
        _KEEP.append(kernel)
    return facts


_KEEP: list[Any] = []  # the kernels _IDS names by id, kept alive so an id is never reused


_LAUNCHER: BoundLauncher | None = None


def launcher() -> BoundLauncher:
    """The process's bound-kernel launcher (made on first use, so ``WS1_TRITON_LAUNCH`` is read then)."""
    global _LAUNCHER
    if _LAUNCHER is None:
        _LAUNCHER = BoundLauncher()
    return _LAUNCHER


def launch(kernel: Any, grid: Any, phase: str, *args: Any, **kwargs: Any) -> Any:
    """Record ``triton:<name>`` for ``phase`` ("fwd" or "bwd"), then launch ``kernel[grid](*args, **kwargs)``.

    On a GPU the launch goes through the bound-kernel fast path (``_bound``): the same compiled kernel Triton would
    pick, without Triton's per-call binding. Under the interpreter it is Triton's own call.
    """
    kid, interpreted = _IDS.get(id(kernel)) or _kernel_facts(kernel)
    record(kid, phase)
    if interpreted:
        return kernel[grid](*args, **kwargs)
    return (_LAUNCHER or launcher())(kernel, grid, args, kwargs)


def check_device(where: str, *tensors: torch.Tensor) -> torch.device:
    """Every tensor on one CUDA device (or on the CPU under the interpreter); returns that device."""
    dev = tensors[0].device
    for t in tensors:
        if t.device != dev:
            raise KernelInputError(f"{where}: tensors on different devices ({dev} and {t.device})")
    if dev.type != "cuda" and not interpreting():
        raise KernelInputError(
            f"{where}: needs CUDA tensors, got {dev} (set TRITON_INTERPRET=1 for CPU logic runs)"
        )
    return dev


def check_contiguous(where: str, **tensors: torch.Tensor) -> None:
    """Kernels index with row strides only: a non-contiguous input is refused, never silently copied."""
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise KernelInputError(f"{where}: {name} must be contiguous (strides {tuple(t.stride())})")
