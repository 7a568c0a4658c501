"""Timers and the two hardware ceilings of one `ws1 bench` run.

On CUDA the timer is `triton.testing.do_bench(..., return_mode="median")`: it runs the function once (compile,
autotune of the stock libraries), estimates its time, warms up for `warmup_ms`, then times each call with CUDA
events for `rep_ms`, zeroing a 256 MB buffer before every timed call, so no input is served from L2 and a small
weight (the 32 MB o-projection fits the H200's 50 MB L2) is read from HBM as it is in a real step where the
other layers evict it. Without Triton a CUDA-event loop does the same (`cuda_events`). On the CPU a wall-clock
median loop (`wall_cpu`) keeps the machinery testable; its numbers are not evidence of GPU speed.

The ceilings are measured in the same process with the same timer, so ratios to them are not skewed by clocks,
driver or thermal state differing between runs: device-to-device copy bandwidth (bytes read + written) and a
bf16 n^3 `torch.mm`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

Fn = Callable[[], Any]
# L2 flush buffer of the CUDA-event fallback: 256 MB, the size do_bench uses (well above any current L2).
_FLUSH_BYTES = 256 * 1024 * 1024
# Bounds of the loop timers: at least 3 timed calls for a median, at most 1000 (tiny ops on a 2-core CPU).
_MIN_REPS, _MAX_REPS, _MAX_WARMUP = 3, 1000, 200


class Timer(Protocol):
    """Median time of `fn` in ms. `grad_to_none` leaves get `.grad = None` before each timed call; `label` says
    what is timed ("candidate", "peer", "copy", "mm") and is used only by test timers."""

    name: str

    def __call__(self, fn: Fn, *, grad_to_none: Sequence[torch.Tensor] = (), label: str = "") -> float: ...


def _clear(leaves: Sequence[torch.Tensor]) -> None:
    for t in leaves:
        t.grad = None


class DoBenchTimer:
    """`triton.testing.do_bench` median (CUDA)."""

    name = "do_bench_median"

    def __init__(self, warmup_ms: float, rep_ms: float):
        from triton.testing import do_bench

        self._do_bench = do_bench
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms

    def __call__(self, fn: Fn, *, grad_to_none: Sequence[torch.Tensor] = (), label: str = "") -> float:
        return float(
            self._do_bench(
                fn,
                warmup=self.warmup_ms,
                rep=self.rep_ms,
                grad_to_none=list(grad_to_none) or None,
                return_mode="median",
            )
        )


class _LoopTimer:
    """Shared loop: one untimed call, an estimate, warm-up for warmup_ms, then timed calls for rep_ms."""

    name = "loop"

    def __init__(self, warmup_ms: float, rep_ms: float):
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms

    def _time_one(self, fn: Fn) -> float:  # pragma: no cover - overridden
        raise NotImplementedError

    def __call__(self, fn: Fn, *, grad_to_none: Sequence[torch.Tensor] = (), label: str = "") -> float:
        fn()
        _clear(grad_to_none)
        est = max(self._time_one(fn), 1e-6)
        n_warm = min(_MAX_WARMUP, int(self.warmup_ms / est))
        n_rep = min(_MAX_REPS, max(_MIN_REPS, int(self.rep_ms / est)))
        for _ in range(n_warm):
            fn()
        times = []
        for _ in range(n_rep):
            _clear(grad_to_none)
            times.append(self._time_one(fn))
        return float(statistics.median(times))


class WallCpuTimer(_LoopTimer):
    """Wall-clock median on the CPU (`time.perf_counter`)."""

    name = "wall_cpu"

    def _time_one(self, fn: Fn) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


class CudaEventTimer(_LoopTimer):
    """CUDA-event median with an L2 flush before each timed call (used when Triton does not import)."""

    name = "cuda_events_median"

    def __init__(self, warmup_ms: float, rep_ms: float):
        super().__init__(warmup_ms, rep_ms)
        self._flush = torch.empty(_FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def _time_one(self, fn: Fn) -> float:
        self._flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))


def make_timer(device: str, warmup_ms: float, rep_ms: float) -> Timer:
    """The timer for `device`: do_bench on CUDA (CUDA events without Triton), wall clock on the CPU."""
    if device == "cuda":
        try:
            return DoBenchTimer(warmup_ms, rep_ms)
        except ImportError:
            return CudaEventTimer(warmup_ms, rep_ms)
    return WallCpuTimer(warmup_ms, rep_ms)


def l2_policy(timer: Timer) -> str:
    if timer.name == "do_bench_median":
        return "flushed before every timed call (do_bench zeroes a 256 MB buffer); inputs are not rotated"
    if timer.name == "cuda_events_median":
        return "flushed before every timed call (256 MB buffer zeroed); inputs are not rotated"
    return "not controlled (CPU wall clock)"


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _copy_ceiling(device: str, timer: Timer, copy_bytes: int) -> dict[str, Any]:
    src = torch.empty(copy_bytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src), label="copy")
    moved = 2 * copy_bytes  # read + written
    return {"bytes": copy_bytes, "moved_bytes": moved, "ms": ms, "GB_s": moved / ms / 1e6, "error": None}


def _mm_ceiling(device: str, timer: Timer, n: int) -> dict[str, Any]:
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=gen, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, generator=gen, device=device, dtype=torch.bfloat16)
    ms = timer(lambda: torch.mm(a, b), label="mm")
    flops = 2 * n**3
    return {"n": n, "dtype": "bf16", "flops": flops, "ms": ms, "TFLOP_s": flops / ms / 1e9, "error": None}


def measure_ceilings(device: str, timer: Timer, copy_bytes: int, mm_n: int) -> dict[str, Any]:
    """Copy bandwidth and bf16 mm throughput, each with `error: None` or a one-line error (never fatal)."""
    out: dict[str, Any] = {}
    try:
        out["copy"] = _copy_ceiling(device, timer, copy_bytes)
    except Exception as exc:  # noqa: BLE001 - a failed ceiling is recorded, never fatal
        out["copy"] = {"bytes": copy_bytes, "ms": None, "GB_s": None, "error": one_line(exc)}
    try:
        out["mm"] = _mm_ceiling(device, timer, mm_n)
    except Exception as exc:  # noqa: BLE001
        out["mm"] = {"n": mm_n, "dtype": "bf16", "ms": None, "TFLOP_s": None, "error": one_line(exc)}
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
