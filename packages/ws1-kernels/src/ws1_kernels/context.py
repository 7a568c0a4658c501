"""LayoutContext: what a candidate knows about the physical call it runs on.

The caller sets it explicitly for every call: one ``sample_id`` and ``position`` per physical row (pads have
``-1`` for both), and for attention in chunked/decode calls the earlier keys of each sample (``kv_prefix``).
Rows of one sample are contiguous and have consecutive positions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import torch

from .errors import KernelInputError


@dataclass(frozen=True)
class Segment:
    """The rows ``[start, end)`` of one sample inside a call; ``first_position`` is the position of ``start``."""

    sample_id: int
    start: int
    end: int
    first_position: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, eq=False)
class LayoutContext:
    """Per-call layout: ``sample_ids[T]``, ``positions[T]`` (int64, CPU or device) and the key prefix."""

    sample_ids: torch.Tensor
    positions: torch.Tensor
    kv_prefix: Mapping[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return int(self.sample_ids.shape[0]) if self.sample_ids.dim() == 1 else -1

    @cached_property
    def segments(self) -> tuple[Segment, ...]:
        """Contiguous runs of real (non-pad) rows, in row order; validated once per context."""
        sid, pos = self.sample_ids, self.positions
        if not isinstance(sid, torch.Tensor) or not isinstance(pos, torch.Tensor):
            raise KernelInputError("LayoutContext: sample_ids and positions must be tensors")
        if sid.dim() != 1 or pos.dim() != 1 or sid.shape != pos.shape:
            raise KernelInputError(
                f"LayoutContext: sample_ids {tuple(sid.shape)} and positions {tuple(pos.shape)} must be 1-D of one length"
            )
        if sid.dtype != torch.int64 or pos.dtype != torch.int64:
            raise KernelInputError("LayoutContext: sample_ids and positions must be int64")
        ids = sid.tolist()
        ps = pos.tolist()
        segs: list[Segment] = []
        seen: set[int] = set()
        i, n = 0, len(ids)
        while i < n:
            s = ids[i]
            if s < 0:
                if s != -1 or ps[i] != -1:
                    raise KernelInputError(f"LayoutContext: row {i}: pad rows need sample_id = position = -1")
                i += 1
                continue
            if s in seen:
                raise KernelInputError(f"LayoutContext: sample {s} is not contiguous in the call")
            seen.add(s)
            j = i + 1
            while j < n and ids[j] == s:
                if ps[j] != ps[j - 1] + 1:
                    raise KernelInputError(
                        f"LayoutContext: row {j}: positions of sample {s} are not consecutive"
                    )
                j += 1
            if ps[i] < 0:
                raise KernelInputError(f"LayoutContext: row {i}: negative position for sample {s}")
            segs.append(Segment(s, i, j, ps[i]))
            i = j
        return tuple(segs)

    def on(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sample_ids, positions)`` on ``device``, copied once per context and device.

        The harness builds the context on the host, so ``segments`` never syncs with a device; a kernel that
        needs the per-row ids on the GPU takes them from here (one host-to-device copy per physical call).
        """
        dev = torch.device(device)
        cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = self.__dict__.setdefault("_on", {})
        if dev not in cache:
            cache[dev] = (
                self.sample_ids.to(dev, non_blocking=True),
                self.positions.to(dev, non_blocking=True),
            )
        return cache[dev]

    def check_rows(self, where: str, rows: int) -> tuple[Segment, ...]:
        """Validate the context against a call of ``rows`` physical rows; return its segments."""
        if rows == 0:
            raise KernelInputError(f"{where}: empty batch (0 rows)")
        if self.num_rows != rows:
            raise KernelInputError(f"{where}: ctx has {self.num_rows} rows but the input has {rows}")
        return self.segments
