"""The order of the collected tests under `pytest -n N --dist worksteal` (what `nox -s cpu_contract` runs): the
tests marked `heavy` first, spread over the workers, so no worker ends the run alone on a minute-long test.

Why: pytest-xdist's work stealing hands worker i the i-th contiguous share of the collected list and later moves
queued tests (not running ones) to a worker that ran dry. A heavy test near the end of the list (the full-model
weight hash, 65 s, sat in the last directory) then started late, and the run ended with one worker busy and the
other idle for about a minute. Here the heavy units are dealt out longest first to the share with the fewest
heavy seconds, at the front of each share; every other test keeps its place in collection order. Nothing is
added, dropped or deselected: the order of the same items changes, and only under worksteal with two or more
workers.

A `heavy` mark on a test function moves each of its items on its own; on a module (`pytestmark`) it moves the
module's tests as one block, in their order, so module-scoped fixtures are built once. `seconds=` is the unit's
measured cost (the mark's default otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: the cost of a `heavy` unit whose mark names none
DEFAULT_SECONDS = 30.0


def share_sizes(n_items: int, workers: int) -> list[int]:
    """How many of `n_items` collected tests xdist's work stealing first sends to each of `workers` workers: worker
    i gets the next `remaining // (workers - i)` (xdist.scheduler.worksteal, check_schedule)."""
    sizes: list[int] = []
    remaining = n_items
    for i in range(workers):
        size = remaining // (workers - i)
        sizes.append(size)
        remaining -= size
    return sizes


def deal(units: Sequence[tuple[str, int, float]], sizes: Sequence[int]) -> list[list[str]] | None:
    """The heavy units (name, number of items, seconds) of each share, longest first to the share with the fewest
    heavy seconds that still has room; None when one does not fit anywhere (the caller keeps the order)."""
    load = [0.0] * len(sizes)
    used = [0] * len(sizes)
    shares: list[list[str]] = [[] for _ in sizes]
    for name, count, seconds in sorted(units, key=lambda u: -u[2]):  # stable: ties keep collection order
        room = [i for i in range(len(sizes)) if used[i] + count <= sizes[i]]
        if not room:
            return None
        i = min(room, key=lambda b: (load[b], b))
        shares[i].append(name)
        load[i] += seconds
        used[i] += count
    return shares


def _unit(item: Any) -> tuple[str, float] | None:
    """(the unit `item` moves with, the unit's seconds) when it is marked heavy, else None."""
    mark = item.get_closest_marker("heavy")
    if mark is None:
        return None
    seconds = float(mark.kwargs.get("seconds", DEFAULT_SECONDS))
    module = item.parent
    while module is not None and type(module).__name__ != "Module":
        module = module.parent
    if module is not None and any(m.name == "heavy" for m in module.own_markers):
        return module.nodeid, seconds
    return item.nodeid, seconds


def heavy_first(items: list[Any], workers: int) -> list[Any]:
    """`items` reordered for `workers` work-stealing workers (see the module docstring); unchanged with fewer than
    two workers, no heavy test, or heavy units that cannot fit the shares."""
    if workers < 2:
        return items
    members: dict[str, list[Any]] = {}
    seconds: dict[str, float] = {}
    light: list[Any] = []
    for item in items:
        unit = _unit(item)
        if unit is None:
            light.append(item)
        else:
            members.setdefault(unit[0], []).append(item)
            seconds[unit[0]] = unit[1]
    if not members:
        return items
    sizes = share_sizes(len(items), workers)
    shares = deal([(name, len(members[name]), seconds[name]) for name in members], sizes)
    if shares is None:
        return items
    order: list[Any] = []
    rest = iter(light)
    for size, names in zip(sizes, shares, strict=True):
        heavy = [item for name in names for item in members[name]]
        order += heavy + [next(rest) for _ in range(size - len(heavy))]
    assert len(order) == len(items) and next(rest, None) is None
    return order
