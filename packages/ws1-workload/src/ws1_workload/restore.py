"""The layout map both ways: restore per-call physical outputs to logical order, refusing any inconsistent map,
and its inverse per call (the logical row of every physical row, and each sample's run of rows).

Everything that needs the map (the harness building a call's inputs, the fp32 reference chain walking a call's
samples) calls these; the kernels' `LayoutContext.segments` derives its runs from the same two id rows on its
own, because the kernels package depends on torch alone and must validate what any caller hands it.

Restoring only moves rows (no arithmetic), so the bits of every value are preserved. Every logical key
(sample_id, position) of the fixture must appear exactly once across the calls: a missing, extra (not in the
fixture) or duplicate key raises LayoutError naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .errors import LayoutError
from .layouts import Layout, PhysicalCall


def call_rows(call: PhysicalCall, offsets: Sequence[int] | Mapping[int, int]) -> torch.Tensor:
    """Logical row index of every physical row of one call (host int64), -1 on pad rows: the inverse of
    `restore` for that call. `offsets[s]` is the logical row of sample s's position 0."""
    sids = call.sample_ids.to(torch.int64)
    pos = call.positions.to(torch.int64)
    table = torch.tensor([offsets[i] for i in range(len(offsets))], dtype=torch.int64)
    rows = torch.full_like(sids, -1)
    real = sids >= 0
    rows[real] = table[sids[real]] + pos[real]
    return rows


def sample_runs(call: PhysicalCall) -> list[tuple[int, int, int]]:
    """(sample_id, first row, row count) of each sample's contiguous run in the call; checks that a sample's rows
    are contiguous and that their positions run on from its key prefix."""
    sids, pos = call.sample_ids.tolist(), call.positions.tolist()
    runs: list[tuple[int, int, int]] = []
    seen: set[int] = set()
    i = 0
    while i < len(sids):
        s = sids[i]
        if s < 0:
            i += 1
            continue
        if s in seen:
            raise LayoutError(f"call {call.index}: rows of sample {s} are not contiguous")
        seen.add(s)
        j = i
        while j < len(sids) and sids[j] == s:
            j += 1
        start = call.prefix_lengths.get(s)
        if start is None:
            raise LayoutError(f"call {call.index}: no prefix length for sample {s}")
        if pos[i:j] != list(range(start, start + j - i)):
            raise LayoutError(f"call {call.index}: sample {s} positions do not run from its prefix {start}")
        runs.append((s, i, j - i))
        i = j
    return runs


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
