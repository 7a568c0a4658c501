"""Cheap input checks shared by candidates and references (shape, dtype, id range): one-line KernelInputError."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .errors import KernelInputError

__all__ = ["KernelInputError", "dims", "positive", "tensor", "token_ids"]

_FLOATS = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def tensor(
    where: str, name: str, t: object, ndim: int, dtype: torch.dtype | None = torch.bfloat16
) -> torch.Tensor:
    """``t`` must be a tensor of ``ndim`` dims and (if given) ``dtype``; float tensors may not be empty."""
    if not isinstance(t, torch.Tensor):
        raise KernelInputError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise KernelInputError(f"{where}: {name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if dtype is not None and t.dtype != dtype:
        raise KernelInputError(f"{where}: {name} must be {dtype}, got {t.dtype}")
    if dtype is None and t.dtype not in _FLOATS:
        raise KernelInputError(f"{where}: {name} must be a float tensor, got {t.dtype}")
    return t


def dims(where: str, name: str, t: torch.Tensor, expected: Sequence[int | None]) -> None:
    """Each non-None entry of ``expected`` must equal the matching dim of ``t``."""
    for i, e in enumerate(expected):
        if e is not None and t.shape[i] != e:
            raise KernelInputError(f"{where}: {name} has shape {tuple(t.shape)}, dim {i} must be {e}")


def token_ids(where: str, name: str, ids: object, vocab: int) -> torch.Tensor:
    """1-D int64 ids inside ``[0, vocab)``: an out-of-range id is refused, never read."""
    if not isinstance(ids, torch.Tensor):
        raise KernelInputError(f"{where}: {name} must be a torch.Tensor, got {type(ids).__name__}")
    if ids.dim() != 1 or ids.dtype != torch.int64:
        raise KernelInputError(f"{where}: {name} must be 1-D int64, got {ids.dtype} shape {tuple(ids.shape)}")
    if ids.numel() == 0:
        raise KernelInputError(f"{where}: empty batch (0 rows)")
    lo, hi = torch.aminmax(ids)
    lo_i, hi_i = int(lo), int(hi)
    if lo_i < 0 or hi_i >= vocab:
        bad = lo_i if lo_i < 0 else hi_i
        raise KernelInputError(f"{where}: {name} holds id {bad} outside [0, {vocab})")
    return ids


def positive(where: str, name: str, value: object) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise KernelInputError(f"{where}: {name} must be a positive number, got {value!r}")
    return float(value)
