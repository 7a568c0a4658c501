"""Physical layouts of one logical batch, each with its map physical row -> logical (sample_id, position).

A layout is a list of calls run in list order. Each call is a flat list of physical rows (a padded grid
(B, S) is flattened row-major); a pad row has sample_id = position = -1 and token id = pad_id. Inside a call
the rows of one sample are contiguous with consecutive positions, starting at `prefix_lengths[s]`, the number
of earlier tokens of s that the call reads as a key prefix (non-zero only in chunked and decode calls).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import torch

from .errors import LayoutError
from .fixtures import Fixture
from .manifest import LayoutSpec

PAD = -1


@dataclass(frozen=True, eq=False)
class PhysicalCall:
    index: int
    sample_ids: torch.Tensor  # int64 [T], -1 on pads
    positions: torch.Tensor  # int64 [T], -1 on pads
    token_ids: torch.Tensor  # int64 [T], pad_id on pads
    grid: tuple[int, int] | None  # (B, S) for a padded grid, else None
    prefix_lengths: Mapping[int, int]  # sample id -> key-prefix length, for every sample in the call

    @property
    def num_rows(self) -> int:
        return int(self.sample_ids.shape[0])

    @property
    def is_pad(self) -> torch.Tensor:
        return self.sample_ids < 0


@dataclass(frozen=True, eq=False)
class Layout:
    name: str
    kind: str  # "training" | "inference"
    fixture: Fixture
    calls: tuple[PhysicalCall, ...]
    type: str = "packed"


Row = tuple[int, int] | None  # (sample_id, position) or a pad


def _make_call(
    fx: Fixture,
    index: int,
    rows: Sequence[Row],
    prefix: Mapping[int, int],
    grid: tuple[int, int] | None = None,
) -> PhysicalCall:
    sids = [PAD if r is None else r[0] for r in rows]
    pos = [PAD if r is None else r[1] for r in rows]
    toks = [fx.pad_id if r is None else int(fx.samples[r[0]].token_ids[r[1]]) for r in rows]
    return PhysicalCall(
        index=index,
        sample_ids=torch.tensor(sids, dtype=torch.int64),
        positions=torch.tensor(pos, dtype=torch.int64),
        token_ids=torch.tensor(toks, dtype=torch.int64),
        grid=grid,
        prefix_lengths=MappingProxyType(dict(prefix)),
    )


def _whole(fx: Fixture, sids: Sequence[int]) -> list[Row]:
    return [(s, p) for s in sids for p in range(fx.samples[s].length)]


def _param(spec: LayoutSpec, key: str) -> object:
    if key not in spec.params:
        raise LayoutError(f"layout {spec.name!r}: missing parameter {key!r}")
    return spec.params[key]


def _int_param(spec: LayoutSpec, key: str, minimum: int = 1) -> int:
    value = _param(spec, key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise LayoutError(
            f"layout {spec.name!r}: parameter {key!r} must be an integer >= {minimum}, got {value!r}"
        )
    return value


def permutation(num_samples: int, seed: int) -> list[int]:
    """Seeded sample order; never the identity when there are two or more samples (then it is rotated)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    order = torch.randperm(num_samples, generator=gen).tolist()
    if num_samples >= 2 and order == sorted(order):
        order = order[1:] + order[:1]
    return order


def build_layout(fx: Fixture, spec: LayoutSpec) -> Layout:
    """Lay the fixture out as `spec` says; calls of training layouts hold whole samples in ascending order."""
    n = fx.num_samples
    ids = list(range(n))
    calls: list[PhysicalCall] = []
    if spec.type == "packed":
        calls.append(_make_call(fx, 0, _whole(fx, ids), dict.fromkeys(ids, 0)))
    elif spec.type == "split":
        raw = _param(spec, "samples_per_call")
        per = max(1, math.ceil(n / 2)) if raw == "half" else _int_param(spec, "samples_per_call")
        for i, start in enumerate(range(0, n, per)):
            group = ids[start : start + per]
            calls.append(_make_call(fx, i, _whole(fx, group), dict.fromkeys(group, 0)))
    elif spec.type == "padded":
        side = _param(spec, "side")
        if side not in ("right", "left"):
            raise LayoutError(f"layout {spec.name!r}: side must be 'right' or 'left', got {side!r}")
        multiple = _int_param(spec, "pad_to_multiple")
        width = math.ceil(max(s.length for s in fx.samples) / multiple) * multiple
        rows: list[Row] = []
        for s in fx.samples:
            tokens: list[Row] = [(s.sample_id, p) for p in range(s.length)]
            pads: list[Row] = [None] * (width - s.length)
            rows.extend(tokens + pads if side == "right" else pads + tokens)
        calls.append(_make_call(fx, 0, rows, dict.fromkeys(ids, 0), grid=(n, width)))
    elif spec.type == "permuted":
        order = permutation(n, _int_param(spec, "seed", minimum=0))
        calls.append(_make_call(fx, 0, _whole(fx, order), dict.fromkeys(order, 0)))
    elif spec.type == "chunked":
        size = _int_param(spec, "chunk_size")
        longest = max(s.length for s in fx.samples)
        for c in range(math.ceil(longest / size)):
            lo = c * size
            present = [s for s in fx.samples if s.length > lo]
            rows = [(s.sample_id, p) for s in present for p in range(lo, min(s.length, lo + size))]
            calls.append(_make_call(fx, c, rows, {s.sample_id: lo for s in present}))
    elif spec.type == "decode":
        prompts = [(s.sample_id, p) for s in fx.samples for p in range(s.prompt_len)]
        with_prompt = [s.sample_id for s in fx.samples if s.prompt_len > 0]
        calls.append(_make_call(fx, 0, prompts, dict.fromkeys(with_prompt, 0)))
        steps = max(s.length - s.prompt_len for s in fx.samples)
        for k in range(steps):
            present = [s for s in fx.samples if s.prompt_len + k < s.length]
            rows = [(s.sample_id, s.prompt_len + k) for s in present]
            calls.append(_make_call(fx, k + 1, rows, {s.sample_id: s.prompt_len + k for s in present}))
    else:
        raise LayoutError(f"layout {spec.name!r}: unknown layout type {spec.type!r}")
    return Layout(name=spec.name, kind=spec.kind, fixture=fx, calls=tuple(calls), type=spec.type)
