"""Checks every cuda_bf16 entry point makes before its op: bf16, one CUDA device, contiguous, the layout rows."""

from __future__ import annotations

import torch

from ..context import LayoutContext
from ..errors import KernelInputError


def check_inputs(where: str, ctx: LayoutContext, rows: int, **tensors: torch.Tensor) -> torch.device:
    dev = None
    for name, t in tensors.items():
        if t.dtype != torch.bfloat16:
            raise KernelInputError(f"{where}: {name} must be bfloat16, got {t.dtype}")
        if t.device.type != "cuda":
            raise KernelInputError(f"{where}: {name} must be a CUDA tensor, got {t.device}")
        if dev is not None and t.device != dev:
            raise KernelInputError(f"{where}: tensors on different devices ({dev} and {t.device})")
        dev = t.device
        if not t.is_contiguous():
            raise KernelInputError(f"{where}: {name} must be contiguous (strides {tuple(t.stride())})")
    ctx.check_rows(where, rows)
    assert dev is not None
    return dev
