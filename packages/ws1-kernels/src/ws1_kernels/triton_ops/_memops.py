"""Helpers shared by the memory-bound operator modules (norm, pointwise, embedding).

- dtypes: bf16 is the production dtype; fp32 is accepted too (same kernels, no final rounding) because the
  Triton interpreter's bf16 is not faithful, so the CPU logic tests run in fp32.
- ``COMPILE``: launch options of every kernel here.  ``enable_fp_fusion=False`` keeps each ``a*b + c`` a
  rounded product then a rounded sum, the rounding points of the fp32 references (an FMA would change bits
  and make the math differ from the formula written in the kernel); these kernels are memory-bound, so the
  lost FMAs cost nothing measurable.
- ``precise()``: on CUDA the kernels call libdevice (``__nv_expf``, ``__nv_cos``...) for transcendental
  functions, which are accurate to a couple of ulp, instead of Triton's fast approximations; the interpreter
  has no libdevice, so there they use ``tl.exp``/``tl.cos`` (numpy).
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import KernelInputError
from ._launch import interpreting

FLOAT_DTYPES = (torch.bfloat16, torch.float32)
COMPILE: dict[str, Any] = {"enable_fp_fusion": False}


def precise() -> bool:
    """True when the kernels may call libdevice (compiled for CUDA, not interpreted)."""
    return not interpreting()


def float_dtype(where: str, **tensors: torch.Tensor) -> torch.dtype:
    """Every named tensor is bf16 (or fp32, the interpreter's logic-test dtype), all of one dtype."""
    dtype = None
    for name, t in tensors.items():
        if t.dtype not in FLOAT_DTYPES:
            raise KernelInputError(f"{where}: {name} must be torch.bfloat16 (or float32), got {t.dtype}")
        if dtype is not None and t.dtype != dtype:
            raise KernelInputError(f"{where}: {name} is {t.dtype} but the other inputs are {dtype}")
        dtype = t.dtype
    assert dtype is not None
    return dtype


def row_warps(elements: int) -> int:
    """Warps for a program that holds one ``elements``-wide fp32 tile in registers.

    About 16 fp32 values per thread (512 per warp): two 16-byte bf16 vector loads per thread per tensor, few
    enough registers that the backward's five live tiles do not spill.  Not tuned on the H200 yet (no GPU ran
    this code when it was written); a change here changes the reduction tree but never makes it depend on T.
    """
    return max(1, min(16, elements // 512))
