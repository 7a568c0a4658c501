"""Watch what a candidate really ran.

A wrapper that quietly delegates to a stock kernel looks compliant if the harness trusts the name a candidate
declares. So the harness records three things inside every candidate call, forward and backward: the kernel ids
the candidate logged at its launch sites (`ws1_kernels.launches`), every torch operator dispatched (a
`TorchDispatchMode`, which sees stock ops and `TORCH_LIBRARY` extension ops whatever Python wrapper calls them),
and, on a GPU, every Triton kernel really launched (Triton's own launch hook, which reports the compiled
kernel's name). A call whose recorded Triton kernels differ from the launched ones is a `kernel_mismatch`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
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


# Matrix products that a stock fallback runs in the candidate's own dtype. Dispatched with a bf16 or fp16 operand
# they are recorded as `<op>:bf16` / `<op>:fp16`: a quiet fallback to `F.linear` dispatches `aten.t` and `aten.mm`
# like a candidate that runs fixed-shape fp32 `aten.mm` blocks, and only the operand dtype tells them apart.
LOW_PRECISION_GEMMS: frozenset[str] = frozenset(
    {"aten.mm", "aten.addmm", "aten.addmm_", "aten.bmm", "aten.baddbmm", "aten.addbmm", "aten.matmul"}
)
_LOW_PRECISION = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def _gemm_dtype(args: Any) -> str | None:
    for a in args:
        if isinstance(a, torch.Tensor) and a.dtype in _LOW_PRECISION:
            return _LOW_PRECISION[a.dtype]
    return None


class _OpRecorder(TorchDispatchMode):
    """Records the overload packet name (`aten.mm`) of every op dispatched while active; a matrix product with
    a bf16 or fp16 operand as `aten.mm:bf16` (see LOW_PRECISION_GEMMS)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.overloadpacket)
        low = _gemm_dtype(args) if name in LOW_PRECISION_GEMMS else None
        self.ops.add(name if low is None else f"{name}:{low}")
        return func(*args, **(kwargs or {}))


TRITON_PREFIX = "triton:"


@dataclass
class Observation:
    """What ran inside the observed region.

    kernels: ids recorded at the launch sites; ops: dispatched torch ops; launched: Triton kernels seen by the
    launch hook (``triton:<name>``, only while the hook watches); mismatches: one record per observed call
    whose recorded Triton kernels differ from the launched ones.
    """

    kernels: set[str] = field(default_factory=set)
    ops: set[str] = field(default_factory=set)
    launched: set[str] = field(default_factory=set)
    mismatches: list[dict[str, list[str]]] = field(default_factory=list)
    # one record ({"layout", "call"}) per physical call in which nothing was recorded or launched: a merged
    # observation would hide a call that ran something unrecorded among calls that did record
    silent_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def saw_kernel(self) -> bool:
        """Whether anything was recorded at a launch site or launched."""
        return bool(self.kernels or self.launched)

    def merge(self, other: Observation) -> None:
        self.kernels |= other.kernels
        self.ops |= other.ops
        self.launched |= other.launched
        self.mismatches.extend(other.mismatches)
        self.silent_calls.extend(other.silent_calls)

    def undeclared_ops(self, declared: frozenset[str]) -> list[str]:
        """Dispatched ops the candidate did not declare, bookkeeping excepted, sorted."""
        return sorted(op for op in self.ops if op not in declared and op not in BOOKKEEPING_OPS)


class _TritonLaunches:
    """Triton's launch hook, installed once per process, feeding every open region.

    Triton 3.6 exposes ``triton.knobs.runtime.launch_enter_hook`` as a plain attribute, later versions as a hook
    chain with ``add``/``remove``; both are handled, and a hook someone else installed keeps running. The
    interpreter (``TRITON_INTERPRET=1``) calls no hook, so the harness asks for it only on a GPU.
    """

    def __init__(self) -> None:
        self.open: list[set[str]] = []
        self.lock = threading.Lock()
        self.installed: bool | None = None

    def __call__(self, metadata: Any) -> None:
        data = getattr(metadata, "data", None)
        name = data.get("name") if isinstance(data, dict) else None
        if name is None and hasattr(metadata, "get"):
            name = metadata.get().get("name")
        with self.lock:
            for sink in self.open:
                sink.add(f"{TRITON_PREFIX}{name}")

    def install(self) -> bool:
        """Install the hook once; False when Triton is missing (nothing can be launched through it then)."""
        if self.installed is not None:
            return self.installed
        try:
            import triton
        except Exception:
            self.installed = False
            return False
        runtime = triton.knobs.runtime
        hook = runtime.launch_enter_hook
        if hasattr(hook, "add"):
            hook.add(self)
        else:
            previous = hook

            def chained(metadata: Any) -> None:
                self(metadata)
                if previous is not None:
                    previous(metadata)

            runtime.launch_enter_hook = chained
        self.installed = True
        return True


TRITON_LAUNCHES = _TritonLaunches()


@contextmanager
def observe(watch_launches: bool = False, watch_ops: bool = True) -> Iterator[Observation]:
    """Observe one candidate region (a forward call or a backward call).

    ``watch_launches`` (set by the harness on a GPU) also records the Triton kernels really launched and checks
    them against the ones recorded at the launch sites. ``watch_ops=False`` skips the dispatch watch (used only
    for the stock baseline's non-canonical layouts: its ops are recorded, never judged, and the Python dispatch
    hook costs a stock CUDA call many times its own time).
    """
    obs = Observation()
    recorder = _OpRecorder()
    launched: set[str] = set()
    watching = watch_launches and TRITON_LAUNCHES.install()
    if watching:
        with TRITON_LAUNCHES.lock:
            TRITON_LAUNCHES.open.append(launched)
    try:
        with launches.observe() as log, recorder if watch_ops else contextlib.nullcontext():
            yield obs
    finally:
        if watching:
            with TRITON_LAUNCHES.lock:
                TRITON_LAUNCHES.open.remove(launched)
    obs.kernels |= set(log.kernels)
    obs.ops |= recorder.ops
    if watching:
        obs.launched |= launched
        recorded = {k for k in obs.kernels if k.startswith(TRITON_PREFIX)}
        if recorded != launched:
            obs.mismatches.append({"recorded": sorted(recorded), "launched": sorted(launched)})
