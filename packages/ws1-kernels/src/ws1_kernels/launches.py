"""Launch log: candidates record the kernel id at the code that actually computes.

Usage::

    with launches.observe() as log:
        y = cand.fn(x, w, ctx); y.backward(g)
    log.kernels   # ["ws1.cpu.det_gemm.rowblock48", "ws1.cpu.det_gemm.rowblock48"]  (fwd, then bwd)
    log.events    # [("ws1.cpu.det_gemm.rowblock48", "fwd"), ("ws1.cpu.det_gemm.rowblock48", "bwd")]

Why: a declared candidate name proves nothing (a wrapper may delegate elsewhere); the harness compares what was
recorded at the launch sites with what the profile declares.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

_state = threading.local()


@dataclass(eq=False)
class LaunchLog:
    """Kernel ids recorded while the ``observe()`` block was active, in launch order (``events`` adds the phase).

    Compared by identity: two nested logs that happen to hold the same ids are still two logs, and leaving a
    block must pop its own log off the stack, not an equal one.
    """

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
    """Collect every launch recorded in this thread (and in autograd's device backward, see ``record``)."""
    log = LaunchLog()
    _stack().append(log)
    with _lock:
        _GLOBAL.append(log)
    try:
        yield log
    finally:
        _stack().remove(log)
        with _lock:
            _GLOBAL.remove(log)


# Autograd runs a CPU backward in the thread that called ``backward()``, but a device backward runs in one of
# autograd's own worker threads, which the C++ engine starts (Python sees them as "dummy" threads: not started by
# ``threading``) and which have no log of their own. Their records go to every log open in any thread: with
# two threads observing device backwards at once each sees the other's kernels too, which the harness reports
# as undeclared kernels (red), never as a pass. A thread that Python started records only into its own logs.
_GLOBAL: list[LaunchLog] = []
_lock = threading.Lock()


def _engine_thread() -> bool:
    """True in a thread that Python's ``threading`` did not start (autograd's device worker threads)."""
    return isinstance(threading.current_thread(), threading._DummyThread)


def record(kernel_id: str, phase: str) -> None:
    """Called at a launch site, immediately before the computation it names.

    Recorded into the logs this thread opened; a thread with none records nothing, except autograd's engine
    threads, whose records go to every open log (see above).
    """
    logs = _stack()
    if not logs:
        if not _engine_thread():
            return
        logs = _GLOBAL
    with _lock:
        for log in logs:
            log.kernels.append(kernel_id)
            log.events.append((kernel_id, phase))
