"""Input checks of the operators, shared by every backend and by the fp32 reference.

A floor under the backends: the reference and every candidate module import these, and none of them imports
another backend's module for its checks (the reference once took its attention and rope checks from the
portable candidate). Each raises `KernelInputError` with one line naming the call and the input.
"""

from __future__ import annotations

import math

import torch

from . import _validate as v
from .context import LayoutContext
from .errors import KernelInputError


def check_attention(where: str, q, k, v_, scale, ctx: LayoutContext, dtype: torch.dtype | None):
    """Shapes, dtypes, GQA ratio and a kv_prefix that matches each sample's first position."""
    v.tensor(where, "q", q, 3, dtype)
    v.tensor(where, "k", k, 3, dtype)
    v.tensor(where, "v", v_, 3, dtype)
    v.dims(where, "k", k, (q.shape[0], None, q.shape[2]))
    v.dims(where, "v", v_, tuple(k.shape))
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise KernelInputError(
            f"{where}: {q.shape[1]} query heads are not a multiple of {k.shape[1]} kv heads"
        )
    scale = v.positive(where, "scale", scale)
    segs = ctx.check_rows(where, q.shape[0])
    for seg in segs:
        pre = ctx.kv_prefix.get(seg.sample_id)
        plen = 0 if pre is None else pre[0].shape[0]
        if plen != seg.first_position:
            raise KernelInputError(
                f"{where}: sample {seg.sample_id} starts at position {seg.first_position} but its kv_prefix has {plen} keys"
            )
        if pre is not None:
            for name, tns in (("k", pre[0]), ("v", pre[1])):
                v.tensor(where, f"kv_prefix[{seg.sample_id}].{name}", tns, 3, dtype)
                v.dims(where, f"kv_prefix[{seg.sample_id}].{name}", tns, (plen, k.shape[1], k.shape[2]))
    return scale


def check_rope(
    where: str, x: torch.Tensor, theta: float, ctx: LayoutContext, dtype: torch.dtype | None
) -> float:
    v.tensor(where, "x", x, 3, dtype)
    if x.shape[-1] % 2:
        raise v.KernelInputError(f"{where}: head_dim {x.shape[-1]} must be even")
    theta = v.positive(where, "theta", theta)
    if not math.isfinite(theta):
        raise v.KernelInputError(f"{where}: theta must be finite")
    ctx.check_rows(where, x.shape[0])
    return theta


def check_targets(where: str, targets: torch.Tensor, vocab: int, rows: int) -> None:
    v.token_ids(where, "targets", targets, vocab)
    if targets.shape[0] != rows:
        raise v.KernelInputError(f"{where}: targets has {targets.shape[0]} rows but the input has {rows}")
