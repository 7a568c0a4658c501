"""Plug-in profiles for the `ws1 bench` tests (`--candidates bench_plugins:RAISING`).

`bench_raises`: det_gemm raises on every call (an error row, never a crash), silu has no backward (its forward
runs under no_grad: a skipped bwd row), rms_norm is the healthy portable candidate.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ws1_kernels import registry
from ws1_kernels.registry import Candidate

PROFILE = "bench_raises"
MESSAGE = "bench_plugins: deliberate failure"


def _raise(*args: object) -> torch.Tensor:
    raise RuntimeError(MESSAGE)


def _no_backward(x: torch.Tensor, ctx: object) -> torch.Tensor:
    with torch.no_grad():
        return registry.resolve("portable_cpu", "silu", device="cpu").fn(x, ctx)


def _profile() -> tuple[str, list[Candidate]]:
    def portable(op: str) -> Candidate:
        return replace(registry.resolve("portable_cpu", op, device="cpu"), profile=PROFILE)

    return PROFILE, [
        replace(portable("det_gemm"), fn=_raise),
        replace(portable("silu"), fn=_no_backward),
        portable("rms_norm"),
    ]


RAISING = _profile
