"""Deterministic inputs keyed by logical identity.

Every value derives from `(case_id, tensor name, logical key)` alone: a SHA-256 of those three gives the seed
of a torch.Generator for that one row. So a case run alone sees the same bytes as in the full sweep, and a
row's data never depends on which other rows (samples, layouts, filters) exist. Values are standard normal
draws rounded to bf16 (exactly representable in bf16, hence in fp32), with exact zeros replaced.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import torch

from .errors import WorkloadError

#: Replacement for a draw that rounds to exactly zero (bf16-exact, small, positive).
ZERO_REPLACEMENT = 2.0**-8
_EXACT_DTYPES = (torch.bfloat16, torch.float32, torch.float64)


def canonical_key(key: Any) -> str:
    """Stable text of a logical key: ints, strings and (nested) tuples/lists of them, as compact JSON."""

    def norm(k: Any) -> Any:
        if isinstance(k, bool):
            raise WorkloadError(f"logical key {key!r}: booleans are not keys")
        if isinstance(k, (tuple, list)):
            return [norm(x) for x in k]
        if isinstance(k, str):
            return k
        if isinstance(k, torch.Tensor) and k.numel() == 1 and not k.is_floating_point():
            return int(k.item())
        try:
            return int(k.__index__())
        except (AttributeError, TypeError):
            raise WorkloadError(f"logical key {key!r}: only ints, strings and tuples are keys") from None

    return json.dumps(norm(key), separators=(",", ":"), ensure_ascii=False)


def derive_seed(*parts: str) -> int:
    """63-bit seed from the SHA-256 of the NUL-joined parts (domain-separated, order-sensitive)."""
    digest = hashlib.sha256("\x00".join(("ws1", *parts)).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def derive_int(modulus: int, *parts: str) -> int:
    """Deterministic integer in [0, modulus) from the parts (used for token ids)."""
    digest = hashlib.sha256("\x00".join(("ws1", *parts)).encode("utf-8")).digest()
    return int.from_bytes(digest[:16], "little") % modulus


def round_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 to nearest-even bf16 and replace exact zeros: the result is bf16, never zero."""
    y = x.to(torch.bfloat16)
    zero = y == 0
    if bool(zero.any()):
        y = torch.where(zero, torch.full_like(y, ZERO_REPLACEMENT), y)
    return y


def logical_tensor(
    case_id: str,
    name: str,
    logical_keys: Sequence[Any],
    row_shape: Sequence[int] | int,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Tensor [len(logical_keys), *row_shape]; row r depends only on (case_id, name, logical_keys[r]).

    Values are N(0, 1) draws rounded to bf16, never zero, returned in `dtype` (bf16, fp32 or fp64 exactly;
    any other dtype must hold every value exactly or WorkloadError is raised).
    """
    shape = (row_shape,) if isinstance(row_shape, int) else tuple(int(d) for d in row_shape)
    if any(d < 0 for d in shape):
        raise WorkloadError(f"logical_tensor {name!r}: negative row shape {shape}")
    gen = torch.Generator(device="cpu")
    rows = []
    for key in logical_keys:
        gen.manual_seed(derive_seed("logical", case_id, name, canonical_key(key)))
        rows.append(torch.empty(shape, dtype=torch.float32).normal_(generator=gen))
    data = torch.stack(rows) if rows else torch.empty((0, *shape), dtype=torch.float32)
    out = round_to_bf16(data)
    if dtype in _EXACT_DTYPES:
        return out.to(dtype)
    cast = out.to(dtype)
    if not torch.equal(cast.to(torch.bfloat16), out) or bool((cast == 0).any()):
        raise WorkloadError(f"logical_tensor {name!r}: dtype {dtype} cannot hold the bf16 values exactly")
    return cast
