"""The `ws1 bench` tests' timer: the times are the test's, so ratios, rates and floors are checked as arithmetic.

It calls the timed function once (a failing side still fails, as under the real timer), sets the leaves' `.grad`
to None first (as the real timer does before each timed call), records the label it was asked for, and returns the
time the test set for that label."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


class FakeTimer:
    name = "fake"

    def __init__(self, times: dict[str, float]):
        self.times = times
        self.labels: list[str] = []

    def __call__(self, fn: Callable[[], Any], *, grad_to_none: Iterable[Any] = (), label: str = "") -> float:
        for leaf in grad_to_none:
            leaf.grad = None
        fn()
        self.labels.append(label)
        return self.times[label]
