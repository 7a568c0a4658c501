"""Restore per-call physical outputs to logical order, refusing any inconsistent map.

Restoring only moves rows (no arithmetic), so the bits of every value are preserved. Every logical key
(sample_id, position) of the fixture must appear exactly once across the calls: a missing, extra (not in the
fixture) or duplicate key raises LayoutError naming the key.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .errors import LayoutError
from .layouts import Layout


def logical_rows(layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """(is_token mask over the concatenated physical rows, logical row index of each token row).

    Validates the map: pads are (-1, -1), keys lie in the fixture, and every key occurs exactly once.
    """
    fx = layout.fixture
    if not layout.calls:
        raise LayoutError(f"layout {layout.name!r}: no calls")
    sids = torch.cat([c.sample_ids for c in layout.calls]).to(torch.int64)
    pos = torch.cat([c.positions for c in layout.calls]).to(torch.int64)
    pad = sids == -1
    bad_pad = pad != (pos == -1)
    if bool(bad_pad.any()):
        i = int(bad_pad.nonzero()[0])
        raise LayoutError(f"layout {layout.name!r}: half-pad row with key ({int(sids[i])}, {int(pos[i])})")
    token = ~pad
    s, p = sids[token], pos[token]
    lengths = torch.tensor([smp.length for smp in fx.samples], dtype=torch.int64)
    offsets = torch.tensor(fx.offsets, dtype=torch.int64)
    in_range = (s >= 0) & (s < len(fx.samples))
    in_range &= (p >= 0) & (p < lengths[s.clamp(0, len(fx.samples) - 1)])
    if not bool(in_range.all()):
        i = int((~in_range).nonzero()[0])
        raise LayoutError(
            f"layout {layout.name!r}: extra key ({int(s[i])}, {int(p[i])}) not in fixture {fx.case_id}"
        )
    index = offsets[s] + p
    counts = torch.bincount(index, minlength=fx.total_tokens)
    if bool((counts > 1).any()):
        row = int((counts > 1).nonzero()[0])
        raise LayoutError(
            f"layout {layout.name!r}: duplicate key {fx.logical_keys[row]} ({int(counts[row])} physical rows)"
        )
    if bool((counts == 0).any()):
        row = int((counts == 0).nonzero()[0])
        raise LayoutError(f"layout {layout.name!r}: missing key {fx.logical_keys[row]}")
    return token, index


def restore(layout: Layout, outputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """Logical tensor [total_tokens, ...] from per-call outputs (outputs[i] has one row per physical row)."""
    if len(outputs) != len(layout.calls):
        raise LayoutError(f"layout {layout.name!r}: expected {len(layout.calls)} outputs, got {len(outputs)}")
    first = outputs[0]
    for call, out in zip(layout.calls, outputs, strict=True):
        if out.dim() == 0 or out.shape[0] != call.num_rows:
            raise LayoutError(
                f"layout {layout.name!r}: call {call.index} has {call.num_rows} rows, output has "
                f"shape {tuple(out.shape)}"
            )
        if out.shape[1:] != first.shape[1:] or out.dtype != first.dtype or out.device != first.device:
            raise LayoutError(
                f"layout {layout.name!r}: call {call.index} output {tuple(out.shape)} {out.dtype} "
                f"differs from call 0 output {tuple(first.shape)} {first.dtype}"
            )
    token, index = logical_rows(layout)
    flat = torch.cat(list(outputs))
    result = torch.empty(
        (layout.fixture.total_tokens, *first.shape[1:]), dtype=first.dtype, device=first.device
    )
    result[index.to(first.device)] = flat[token.to(first.device)]
    return result
