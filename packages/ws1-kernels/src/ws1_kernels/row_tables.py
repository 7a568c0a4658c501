"""Host-built row tables for the norm and embedding backwards, copied to the device once per call (a floor under
the Triton and CUDA backends).

Both tables come from ``ctx.segments`` (host data, validated once per context), so building them never syncs
with the device.  They are cached per ``(context, device)``: one physical call runs every layer's norms and
the embedding on the same context, so the host-to-device copy happens once per call, not once per launch.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from .context import LayoutContext
from .main_grad import WGRAD_BLOCK

# context -> {(table kind, device): tables}; a weak key, so a finished call's tables go with its context
_CACHE: weakref.WeakKeyDictionary[LayoutContext, dict[tuple[str, torch.device], object]] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class BlockTable:
    """``rows[p, k]``: the physical row in slot ``k`` of program ``p`` (-1 for an empty slot), int32.

    Programs ``[0, n_blocks)`` are the parameter-gradient blocks in ``sample_blocks_main_grad`` order
    (samples ascending, ``WGRAD_BLOCK`` positions aligned to each sample's position 0); the programs after
    them hold the pad rows, ``WGRAD_BLOCK`` at a time, which need a dx but contribute nothing to dW.
    """

    rows: torch.Tensor
    n_blocks: int
    n_programs: int


def _cached(ctx: LayoutContext, kind: str, device: torch.device) -> object | None:
    return _CACHE.get(ctx, {}).get((kind, device))


def _store(ctx: LayoutContext, kind: str, device: torch.device, value: object) -> object:
    _CACHE.setdefault(ctx, {})[(kind, device)] = value
    return value


def block_table(ctx: LayoutContext, rows: int, device: torch.device) -> BlockTable:
    """The wgrad blocks of the call (and its pad rows), as ``BlockTable`` on ``device``."""
    hit = _cached(ctx, "blocks", device)
    if isinstance(hit, BlockTable):
        return hit
    wb = WGRAD_BLOCK
    table: list[list[int]] = []
    covered = [False] * rows
    for seg in sorted(ctx.segments, key=lambda s: s.sample_id):
        first, last = seg.first_position, seg.first_position + seg.length - 1
        for b in range(first // wb, last // wb + 1):
            slot = [-1] * wb
            for p in range(max(first, b * wb), min(last, (b + 1) * wb - 1) + 1):
                r = seg.start + (p - first)
                slot[p - b * wb] = r
                covered[r] = True
            table.append(slot)
    n_blocks = len(table)
    pads = [r for r in range(rows) if not covered[r]]
    for i in range(0, len(pads), wb):
        chunk = pads[i : i + wb]
        table.append(chunk + [-1] * (wb - len(chunk)))
    host = torch.tensor(table, dtype=torch.int32).reshape(len(table), wb)
    out = BlockTable(host.to(device), n_blocks, len(table))
    return _store(ctx, "blocks", device, out)  # type: ignore[return-value]


def logical_rows(ctx: LayoutContext, device: torch.device) -> torch.Tensor | None:
    """The call's real rows in logical order (sample ascending, position ascending), int64; None if none."""
    hit = _cached(ctx, "logical", device)
    if isinstance(hit, torch.Tensor):
        return hit
    order = [r for seg in sorted(ctx.segments, key=lambda s: s.sample_id) for r in range(seg.start, seg.end)]
    if not order:
        return None
    return _store(ctx, "logical", device, torch.tensor(order, dtype=torch.int64).to(device))  # type: ignore[return-value]
