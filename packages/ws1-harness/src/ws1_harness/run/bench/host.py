"""Host cost of one call: what a layer pays on the CPU before its kernel runs, at M = 1 (decode).

At M = 1 a kernel takes a few microseconds on the GPU, so a call whose Python side (validation, planning, the
launcher) takes 40 us leaves the GPU idle most of a decode step. Three figures per side, each the median of
`REPEATS` bursts of `CALLS` back-to-back calls:

- `issue_us`: wall time to issue one call (the burst's wall time before any sync, divided by the calls). The
  burst is far too short to fill the launch queue, so this is the host's own cost: the figure the 10 us target
  judges.
- `eager_us`: the same burst up to a device sync, per call: max(host, device) and the queue's latency.
- `graph_us`: one CUDA graph holding the same `CALLS` calls, replayed, per call: the device's time with no host
  in the way. A call that cannot be captured (a host sync, a host-to-device copy of a per-call table) gets the
  capture's error instead, which is itself the finding: such a call cannot be part of a captured decode step.

The CPU has no graphs and no queue; `issue_us` there is the whole call (it exercises the machinery in CI and
says nothing about a GPU).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ws1_harness.run.bench.timing import one_line, synchronize

#: the host cost a call may have at M = 1 (the issue's target: validate once per plan, not once per call)
HOST_TARGET_US = 10.0
#: the rows that get host figures: forward rows at these M (decode sizes)
HOST_MS = (1,)
CALLS, REPEATS, WARMUP = 20, 7, 3


@dataclass(frozen=True)
class HostCost:
    """One side's host figures in microseconds per call (None where not measured) and why not."""

    issue_us: float | None = None
    eager_us: float | None = None
    graph_us: float | None = None
    graph_error: str | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _bursts(device: str, call: Callable[[], Any]) -> tuple[float, float]:
    issue, eager = [], []
    for _ in range(REPEATS):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(CALLS):
            call()
        t1 = time.perf_counter()
        synchronize(device)
        t2 = time.perf_counter()
        issue.append((t1 - t0) / CALLS * 1e6)
        eager.append((t2 - t0) / CALLS * 1e6)
    return statistics.median(issue), statistics.median(eager)


def _graph(call: Callable[[], Any]) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as torch's capture recipe asks
        for _ in range(WARMUP):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            call()
    graph.replay()
    times = []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / CALLS * 1e6)
    return statistics.median(times)


def measure(device: str, call: Callable[[], Any]) -> HostCost:
    """The three figures for `call` (no grad: a forward); an exception is recorded, never raised."""
    try:
        with torch.no_grad():
            for _ in range(WARMUP):
                call()
            issue, eager = _bursts(device, call)
    except Exception as exc:  # noqa: BLE001 - a side that cannot run is a recorded error
        return HostCost(error=one_line(exc))
    if device != "cuda":
        return HostCost(issue_us=issue, eager_us=eager, graph_error="no CUDA graphs on the CPU")
    try:
        with torch.no_grad():
            graph = _graph(call)
    except Exception as exc:  # noqa: BLE001 - not capturable: the finding, recorded
        torch.cuda.synchronize()
        return HostCost(issue_us=issue, eager_us=eager, graph_error=one_line(exc))
    return HostCost(issue_us=issue, eager_us=eager, graph_us=graph)


def judge(cost: HostCost | None) -> bool | None:
    """Whether the candidate's host cost meets the target (None: not measured)."""
    if cost is None or cost.issue_us is None:
        return None
    return cost.issue_us <= HOST_TARGET_US
