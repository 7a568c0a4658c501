"""Launch log: candidates record the kernel id at the code that actually computes.

Usage::

    with launches.observe() as log:
        y = cand.fn(x, w, ctx); y.backward(g)
    log.kernels   # ["ws1.cpu.det_gemm.rowblock32", "ws1.cpu.det_gemm.rowblock32"]  (fwd, then bwd)
    log.events    # [("ws1.cpu.det_gemm.rowblock32", "fwd"), ("ws1.cpu.det_gemm.rowblock32", "bwd")]

Why: a declared candidate name proves nothing (a wrapper may delegate elsewhere); the harness compares what was
recorded at the launch sites with what the profile declares.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

_state = threading.local()


@dataclass
class LaunchLog:
    """Kernel ids recorded while the ``observe()`` block was active, in launch order (``events`` adds the phase)."""

    kernels: list[str] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)

    def kernel_ids(self) -> set[str]:
        """The distinct kernel ids."""
        return set(self.kernels)


def _stack() -> list[LaunchLog]:
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = []
        _state.stack = stack
    return stack


@contextmanager
def observe() -> Iterator[LaunchLog]:
    """Collect every launch recorded in this thread (and in autograd's backward, see ``record``)."""
    log = LaunchLog()
    _stack().append(log)
    _GLOBAL.append(log)
    try:
        yield log
    finally:
        _stack().remove(log)
        _GLOBAL.remove(log)


# Autograd on the CPU runs backward in the calling thread, but a device backward may run in an autograd worker
# thread; logs opened anywhere also see launches from threads that have no log of their own.
_GLOBAL: list[LaunchLog] = []
_lock = threading.Lock()


def record(kernel_id: str, phase: str) -> None:
    """Called at a launch site, immediately before the computation it names."""
    logs = _stack() or _GLOBAL
    with _lock:
        for log in logs:
            log.kernels.append(kernel_id)
            log.events.append((kernel_id, phase))
