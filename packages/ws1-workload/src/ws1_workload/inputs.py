"""Deterministic inputs keyed by logical identity.

Every value derives from `(case_id, tensor name, logical key)` alone: a SHA-256 of those three gives the seed
of a torch.Generator for that one row. So a case run alone sees the same bytes as in the full sweep, and a
row's data never depends on which other rows (samples, layouts, filters) exist. Values are standard normal
draws rounded to bf16 (exactly representable in bf16, hence in fp32), with exact zeros replaced.

Hard rows: a tensor may be asked to hold rows of the kinds in `HARD_ROW_KINDS` (the manifest names which
tensors hold which kinds). Row `(s, p)` is of kind K when `(s + p) % HARD_ROW_PERIOD == HARD_ROW_SLOT[K]`, so
every run of six consecutive positions holds one row of each kind its tensor asks for, whatever the batch.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any

import torch

from .errors import WorkloadError

#: Replacement for a draw that rounds to exactly zero (bf16-exact, small, positive).
ZERO_REPLACEMENT = 2.0**-8

#: The kinds of hard row a logical tensor can hold, and what each one is:
#: - `signed_zero_rows`: every element an exact zero, +0 at even and -0 at odd indices (a norm must rely on
#:   eps there, a pointwise op must keep each zero's sign);
#: - `tiny_norm_rows`: N(0, 1) scaled by 2^-10, a mean square near 1e-6, comparable to the models' RMSNorm eps;
#: - `large_logit_rows`: N(0, 1) scaled by 2^10 (up to about 2^14 after the logp adapter's scale of 4): exp
#:   overflows fp32 beyond 88, so a logsumexp that does not subtract the row maximum first turns to inf. Not
#:   nearer the bf16 range on purpose: above about 2^15, `lse = m + log(s)` in fp32 loses log(s) (ulp(m) > 1),
#:   and every logsumexp-based softmax backward (fp32 math included) counts a tied maximum twice; measured at
#:   2^118 on portable_cpu: relative gradient error 1.0 at tied maxima.
HARD_ROW_KINDS: tuple[str, ...] = ("signed_zero_rows", "tiny_norm_rows", "large_logit_rows")
HARD_ROW_PERIOD = 6
HARD_ROW_SLOT: dict[str, int] = {"signed_zero_rows": 1, "large_logit_rows": 2, "tiny_norm_rows": 3}
TINY_ROW_SCALE = 2.0**-10
LARGE_ROW_SCALE = 2.0**10
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


def hard_row_kind(key: Any, kinds: Sequence[str]) -> str | None:
    """The kind of hard row at logical key `(sample_id, position)` among `kinds`, or None for an ordinary row.

    A pure function of the key: `(s + p) % HARD_ROW_PERIOD` picks the slot. Keys that are not a
    (sample, position) pair never hold hard rows.
    """
    if not kinds or not isinstance(key, (tuple, list)) or len(key) != 2:
        return None
    slot = (int(key[0]) + int(key[1])) % HARD_ROW_PERIOD
    for kind in kinds:
        if HARD_ROW_SLOT[kind] == slot:
            return kind
    return None


def _signed_zeros(shape: tuple[int, ...]) -> torch.Tensor:
    flat = torch.zeros(math.prod(shape), dtype=torch.float32)
    flat[1::2] = -0.0
    return flat.reshape(shape)


def logical_tensor(
    case_id: str,
    name: str,
    logical_keys: Sequence[Any],
    row_shape: Sequence[int] | int,
    dtype: torch.dtype = torch.bfloat16,
    hard_rows: Sequence[str] = (),
) -> torch.Tensor:
    """Tensor [len(logical_keys), *row_shape]; row r depends only on (case_id, name, logical_keys[r]).

    Values are N(0, 1) draws rounded to bf16, never zero, returned in `dtype` (bf16, fp32 or fp64 exactly;
    any other dtype must hold every value exactly or WorkloadError is raised). `hard_rows` names the kinds of
    hard row (`HARD_ROW_KINDS`) this tensor holds; their rows follow `hard_row_kind` instead (zero rows are
    the only place a zero appears).
    """
    shape = (row_shape,) if isinstance(row_shape, int) else tuple(int(d) for d in row_shape)
    if any(d < 0 for d in shape):
        raise WorkloadError(f"logical_tensor {name!r}: negative row shape {shape}")
    unknown = sorted(set(hard_rows) - set(HARD_ROW_KINDS))
    if unknown:
        raise WorkloadError(f"logical_tensor {name!r}: unknown hard row kinds {unknown}")
    gen = torch.Generator(device="cpu")
    rows = []
    zero_rows = []
    for i, key in enumerate(logical_keys):
        gen.manual_seed(derive_seed("logical", case_id, name, canonical_key(key)))
        row = torch.empty(shape, dtype=torch.float32).normal_(generator=gen)
        kind = hard_row_kind(key, hard_rows)
        if kind == "tiny_norm_rows":
            row = row * TINY_ROW_SCALE
        elif kind == "large_logit_rows":
            row = row * LARGE_ROW_SCALE
        elif kind == "signed_zero_rows":
            zero_rows.append(i)
        rows.append(row)
    data = torch.stack(rows) if rows else torch.empty((0, *shape), dtype=torch.float32)
    out = round_to_bf16(data)
    for i in zero_rows:
        out[i] = _signed_zeros(shape).to(torch.bfloat16)
    if dtype in _EXACT_DTYPES:
        return out.to(dtype)
    cast = out.to(dtype)
    if not torch.equal(cast.to(torch.bfloat16), out) or bool(((cast == 0) != (out == 0)).any()):
        raise WorkloadError(f"logical_tensor {name!r}: dtype {dtype} cannot hold the bf16 values exactly")
    return cast
