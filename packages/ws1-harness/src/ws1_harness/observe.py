"""Watch what a candidate really ran.

Trap 7: a wrapper that quietly delegates to a stock kernel looks compliant if the harness trusts the name a
candidate declares. So the harness records two things inside every candidate call, forward and backward:
the kernel ids the candidate logged at its launch sites (`ws1_kernels.launches`), and every torch operator
dispatched (a `TorchDispatchMode`), which sees stock ops whatever Python wrapper calls them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from ws1_kernels import launches

# Ops that only move or view data, or build tensors; dispatched by autograd's own bookkeeping around any
# candidate (grad accumulation, gradient seeding). They do no arithmetic on the judged values, so a candidate
# need not declare them.
BOOKKEEPING_OPS: frozenset[str] = frozenset(
    {
        "aten.detach",
        "aten.alias",
        "aten.view",
        "aten._unsafe_view",
        "aten.empty",
        "aten.empty_like",
        "aten.empty_strided",
        "aten.ones_like",
        "aten.zeros_like",
        "aten.lift_fresh",
        "aten._to_copy",
        "aten.copy_",
        "aten.new_empty_strided",
        "aten.new_empty",
        "aten.new_zeros",
        "aten.t",
        "aten.expand",
        "aten.as_strided",
        "aten.clone",
    }
)


class _OpRecorder(TorchDispatchMode):
    """Records the overload packet name (`aten.mm`) of every op dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@dataclass
class Observation:
    """What ran inside the observed region: kernel ids from launch sites and dispatched torch ops."""

    kernels: set[str] = field(default_factory=set)
    ops: set[str] = field(default_factory=set)

    def merge(self, other: Observation) -> None:
        self.kernels |= other.kernels
        self.ops |= other.ops

    def undeclared_ops(self, declared: frozenset[str]) -> list[str]:
        """Dispatched ops the candidate did not declare, bookkeeping excepted, sorted."""
        return sorted(op for op in self.ops if op not in declared and op not in BOOKKEEPING_OPS)


@contextmanager
def observe() -> Iterator[Observation]:
    """Observe one candidate region (a forward call or a backward call)."""
    obs = Observation()
    recorder = _OpRecorder()
    with launches.observe() as log, recorder:
        yield obs
    obs.kernels |= set(log.kernels)
    obs.ops |= recorder.ops
