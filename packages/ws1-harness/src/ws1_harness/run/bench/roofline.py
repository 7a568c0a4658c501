"""The roofline of a bench row: the least time its work can take on this device, from the ceilings measured in the
same run, and how close each side comes to it.

Why: a ratio against the peer says who is faster, not whether either is near what the card can do. A row's floor is
`max(FLOPs / mm ceiling, bytes / copy ceiling)`: the bf16 matmul rate and the copy bandwidth the run itself
measured (not data-sheet figures), the FLOPs of `work` and the least bytes the call must read and write
(`OpCase.traffic`, each tensor once). Each side is held to the floor of its own rule: a `sample_blocks_main_grad`
candidate's backward reads and writes an fp32 `main_grad` (8 bytes a weight element), the first peer writes a fresh
bf16 `weight.grad` (2 bytes), so at small M their floors differ by that traffic. `bound` says which term sets the
candidate's floor. A figure that cannot be formed (no ceiling, no time) is None, never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def floor_ms(
    flops: float | None, nbytes: float, mm_tflops: float | None, copy_gbs: float | None
) -> float | None:
    """The least time in ms of `flops` and `nbytes` at the two ceilings; None without both ceilings."""
    if not mm_tflops or not copy_gbs or mm_tflops <= 0 or copy_gbs <= 0:
        return None
    compute = (flops or 0.0) / (mm_tflops * 1e9)  # TFLOP/s -> FLOP per ms
    memory = nbytes / (copy_gbs * 1e6)  # GB/s -> bytes per ms
    return max(compute, memory)


def _fraction(floor: float | None, ms: float | None) -> float | None:
    return floor / ms if floor is not None and ms and ms > 0 else None


def row_roofline(
    row: Mapping[str, Any], mm_tflops: float | None, copy_gbs: float | None
) -> dict[str, Any] | None:
    """The roofline record of one JSON row (None when the row has no traffic: its op has no roofline)."""
    traffic = row.get("traffic_bytes")
    if not traffic or row.get("metric") != "TFLOP/s":
        return None
    flops = row.get("work")
    floors = {side: floor_ms(flops, nbytes, mm_tflops, copy_gbs) for side, nbytes in traffic.items()}
    second = row.get("peer_main_grad") or {}
    times = {
        "candidate": row.get("candidate_ms"),
        "peer": row.get("peer_ms"),
        "peer_main_grad": second.get("ms"),
    }
    cand_floor = floors.get("candidate")
    bound = None
    if cand_floor is not None and mm_tflops and flops is not None:
        bound = "compute" if flops / (mm_tflops * 1e9) >= cand_floor else "memory"
    return {
        "floor_ms": floors,
        "of_floor": {side: _fraction(floors[side], times.get(side)) for side in floors},
        "bound": bound,
    }


def annotate(rows: Sequence[dict[str, Any]], ceilings: Mapping[str, Any]) -> None:
    """Give every row with traffic its `roofline` record, in place (the others get None)."""
    mm = (ceilings.get("mm") or {}).get("TFLOP_s")
    copy = (ceilings.get("copy") or {}).get("GB_s")
    for r in rows:
        r["roofline"] = row_roofline(r, mm, copy)
