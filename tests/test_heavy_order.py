"""The work-stealing order of the collected tests (tests/heavy_order.py): the same items, heavy units at the fronts
of the workers' shares and balanced between them, everything else in collection order. Each property with the case
that must be left alone beside it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from heavy_order import deal, heavy_first, share_sizes


@dataclass
class _Mark:
    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Node:
    nodeid: str
    parent: Any = None
    own_markers: list[_Mark] = field(default_factory=list)

    def get_closest_marker(self, name: str) -> _Mark | None:
        node: Any = self
        while node is not None:
            for mark in node.own_markers:
                if mark.name == name:
                    return mark
            node = node.parent
        return None


class Module(_Node):
    """Named as pytest's module node is: heavy_order finds a test's module by its class name."""


def _items() -> list[_Node]:
    """Twelve tests: a heavy module of two (module fixture), two heavy tests of one function, eight light ones."""
    light = Module("test_light.py")
    block = Module("test_block.py", own_markers=[_Mark("heavy", {"seconds": 60})])
    compiles = Module("test_compiles.py")
    out = [_Node(f"test_light.py::t{i}", light) for i in range(4)]
    out += [_Node("test_compiles.py::c[a]", compiles, [_Mark("heavy", {"seconds": 50})])]
    out += [_Node(f"test_light.py::u{i}", light) for i in range(4)]
    out += [_Node("test_block.py::b0", block), _Node("test_block.py::b1", block)]
    out += [_Node("test_compiles.py::c[b]", compiles, [_Mark("heavy", {"seconds": 50})])]
    return out


def test_shares_are_the_ones_xdist_sends_first() -> None:
    assert share_sizes(10, 2) == [5, 5]
    assert share_sizes(11, 2) == [5, 6]
    assert share_sizes(10, 3) == [3, 3, 4]
    assert sum(share_sizes(2078, 2)) == 2078


def test_the_longest_unit_goes_to_the_share_with_the_fewest_heavy_seconds() -> None:
    units = [("a", 1, 65.0), ("b", 1, 50.0), ("c", 1, 50.0), ("d", 1, 20.0)]
    assert deal(units, [10, 10]) == [["a", "d"], ["b", "c"]]
    # a unit larger than any share cannot be placed: the caller keeps the collected order
    assert deal([("big", 6, 1.0)], [5, 5]) is None


def test_heavy_units_lead_each_share_and_the_rest_keep_their_order() -> None:
    items = _items()
    order = heavy_first(items, 2)
    ids = [i.nodeid for i in order]
    assert sorted(ids) == sorted(i.nodeid for i in items)  # the same items: nothing added or dropped
    first, second = ids[:6], ids[6:]
    # the module block (60 s) leads one share, the two compiles (50 s each) the other; the block stays whole
    assert first[:2] == ["test_block.py::b0", "test_block.py::b1"]
    assert second[:2] == ["test_compiles.py::c[a]", "test_compiles.py::c[b]"]
    light = [i.nodeid for i in items if i.nodeid.startswith("test_light.py")]
    assert [n for n in ids if n.startswith("test_light.py")] == light


@pytest.mark.parametrize("workers", [0, 1])
def test_without_two_workers_the_order_is_left_alone(workers: int) -> None:
    items = _items()
    assert heavy_first(items, workers) is items


def test_without_a_heavy_test_the_order_is_left_alone() -> None:
    items = [i for i in _items() if i.get_closest_marker("heavy") is None]
    assert heavy_first(items, 2) is items
