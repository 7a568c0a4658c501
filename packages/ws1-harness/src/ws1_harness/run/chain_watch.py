"""Taps on a swapped model (ws1_kernels.integrations.qwen3): the per-node op watch and the per-node dump.

**Op watch.** The harness's matrix watches one candidate at a time. A whole model has a second way to cheat: a
stock module left between the candidates (a stock ``nn.Linear`` dispatches ``aten.mm``, which the ``det_gemm``
candidate also declares, so a watch over the whole model would not see it). ``NodeWatch`` therefore attributes
every dispatched op to the node that ran it: ops inside a candidate call (forward, and backward through hooks on
the candidate's autograd node) must be declared by that candidate; ops outside every candidate call must be the
drop-in's own glue (``qwen3.GLUE_OPS``: the residual add and data movement). Every call must also record its
kernel id at the launch site.

**Dump.** ``NodeDump`` keeps every node's output (and, for training, the gradient arriving at it) keyed by
logical ``(sample_id, position)``, so two runs of the same tokens under different layouts (the rollout and the
trainer, two training layouts, a candidate and the fp32 reference) can be compared node by node in the order the
model runs them; the first node that differs names where a divergence starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ws1_harness.run.observe import BOOKKEEPING_OPS
from ws1_kernels import LayoutContext, launches
from ws1_kernels.integrations.qwen3 import GLUE_OPS, Runtime, Site, Tap

GLUE = "<glue>"


class _RegionRecorder(TorchDispatchMode):
    """Records each dispatched op under the region (node name) open at that moment."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.ops: dict[str, set[str]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        region = self.stack[-1] if self.stack else GLUE
        self.ops.setdefault(region, set()).add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class WatchProblem:
    """One finding of the op watch: a node (or ``<glue>``) and what it did that it may not."""

    node: str
    what: str
    items: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "what": self.what, "items": list(self.items)}


@dataclass
class NodeWatch(Tap):
    """Tap that attributes dispatched ops and recorded kernel ids to the node that ran them."""

    runtime: Runtime
    recorder: _RegionRecorder = field(default_factory=_RegionRecorder)
    sites: dict[str, Site] = field(default_factory=dict)
    kernels: dict[str, set[str]] = field(default_factory=dict)
    silent: set[str] = field(default_factory=set)

    def call(
        self, site: Site, fn: Callable[..., torch.Tensor], args: tuple[Any, ...], ctx: LayoutContext
    ) -> Any:
        self.sites[site.name] = site
        self.recorder.stack.append(site.name)
        try:
            with launches.observe() as log:
                out = fn(*args)
        finally:
            self.recorder.stack.pop()
        self.kernels.setdefault(site.name, set()).update(log.kernels)
        if not log.kernels:
            self.silent.add(site.name)
        node = getattr(out, "grad_fn", None)
        if node is not None:
            stack = self.recorder.stack

            def enter(_grad_outputs: Any, name: str = site.name) -> None:
                stack.append(name)

            def leave(_grad_inputs: Any, _grad_outputs: Any) -> None:
                stack.pop()

            node.register_prehook(enter)
            node.register_hook(leave)
        return out

    @contextmanager
    def watching(self) -> Iterator[NodeWatch]:
        """Record while the block runs (forward, backward, or both)."""
        with self.recorder:
            yield self

    def problems(self) -> list[WatchProblem]:
        """Undeclared ops per node, stock ops outside every node, and calls that recorded no kernel id."""
        out: list[WatchProblem] = []
        cands = self.runtime.candidates
        for name, ops in sorted(self.recorder.ops.items()):
            if name == GLUE:
                extra = sorted(op for op in ops if op not in GLUE_OPS and op not in BOOKKEEPING_OPS)
                if extra:
                    out.append(WatchProblem(GLUE, "stock ops outside every candidate call", tuple(extra)))
                continue
            cand = cands.get(self.sites[name].operator)
            declared = cand.declared_ops if cand is not None else frozenset()
            extra = sorted(op for op in ops if op not in declared and op not in BOOKKEEPING_OPS)
            if extra:
                out.append(WatchProblem(name, "ops its candidate does not declare", tuple(extra)))
        for name in sorted(self.silent):
            out.append(WatchProblem(name, "a call recorded no kernel id at a launch site", ()))
        for name, kernels in sorted(self.kernels.items()):
            cand = cands.get(self.sites[name].operator)
            allowed = cand.all_kernel_ids if cand is not None else frozenset()
            foreign = sorted(k for k in kernels if k not in allowed)
            if foreign:
                out.append(WatchProblem(name, "kernel ids its candidate does not declare", tuple(foreign)))
        return out


@dataclass
class StepWatch:
    """The op watch of a rollout on the step path (``integrations.step_runner``).

    No candidate is called there, so nothing can be attributed to a node: every dispatched op must be one of
    the profile's raw step ops (``torch.ops.<namespace>.*``) or the step's glue (``step.STEP_GLUE_OPS``), and
    every kernel id recorded at a launch site must be one the profile's candidates declare or a step kernel
    of the profile (``step_kernels``). A stock module left on the step path dispatches something else."""

    namespaces: tuple[str, ...]
    allowed_kernels: frozenset[str]
    recorder: _RegionRecorder = field(default_factory=_RegionRecorder)
    kernels: set[str] = field(default_factory=set)

    @contextmanager
    def watching(self) -> Iterator[StepWatch]:
        with self.recorder, launches.observe() as log:
            yield self
        self.kernels.update(log.kernels)

    def is_step_op(self, op: str) -> bool:
        """Whether ``op`` (an overload packet's name) is one of the profile's step ops."""
        return op.split(".", 1)[0] in self.namespaces

    def problems(self) -> list[WatchProblem]:
        from ws1_kernels.integrations.step import STEP_GLUE_OPS

        ops = set().union(*self.recorder.ops.values()) if self.recorder.ops else set()
        extra = sorted(
            op
            for op in ops
            if not self.is_step_op(op) and op not in STEP_GLUE_OPS and op not in BOOKKEEPING_OPS
        )
        out = []
        if extra:
            out.append(
                WatchProblem("<step>", "ops outside the profile's step ops and the step's glue", tuple(extra))
            )
        foreign = sorted(k for k in self.kernels if k not in self.allowed_kernels)
        if foreign:
            out.append(WatchProblem("<step>", "kernel ids the profile does not declare", tuple(foreign)))
        return out


@contextmanager
def tapped(runtime: Runtime, tap: Tap) -> Iterator[Tap]:
    """Install ``tap`` on a swapped model's runtime for the block, then restore the previous one."""
    previous = runtime.tap
    runtime.tap = tap
    try:
        yield tap
    finally:
        runtime.tap = previous


@dataclass
class _Rows:
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)

    def add(self, ctx: LayoutContext, value: torch.Tensor) -> None:
        real = ctx.sample_ids >= 0
        keys = torch.stack([ctx.sample_ids[real], ctx.positions[real]], dim=1)
        self.keys.append(keys)
        self.values.append(value.detach()[real.to(value.device)].to("cpu").clone())

    def logical(self) -> dict[tuple[int, int], torch.Tensor]:
        out: dict[tuple[int, int], torch.Tensor] = {}
        for keys, values in zip(self.keys, self.values, strict=True):
            for i, (s, p) in enumerate(keys.tolist()):
                out[(s, p)] = values[i]  # a row seen twice (never in a valid layout) keeps the later value
        return out


@dataclass
class NodeDump(Tap):
    """Tap that keeps each node's output (``forward``) and the gradient arriving at it (``backward``) by logical
    row. Node names are kept in the order of their first call (forward) and first gradient (backward)."""

    forward: dict[str, _Rows] = field(default_factory=dict)
    backward: dict[str, _Rows] = field(default_factory=dict)
    sites: dict[str, Site] = field(default_factory=dict)

    def call(
        self, site: Site, fn: Callable[..., torch.Tensor], args: tuple[Any, ...], ctx: LayoutContext
    ) -> Any:
        out = fn(*args)
        self.sites[site.name] = site
        self.forward.setdefault(site.name, _Rows()).add(ctx, out)
        if getattr(out, "requires_grad", False):

            def keep(g: torch.Tensor, name: str = site.name, c: LayoutContext = ctx) -> None:
                self.backward.setdefault(name, _Rows()).add(c, g)

            out.register_hook(keep)
        return out


@dataclass(frozen=True)
class NodeDifference:
    """The first node where two dumps differ: its name, operator, layer, phase, and the first logical token."""

    node: str
    operator: str
    layer: int | None
    phase: str  # "forward" or "backward" (the gradient arriving at the node's output)
    token: tuple[int, int]
    rows_compared: int
    rows_differing: int
    max_abs_diff: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "operator": self.operator,
            "layer": self.layer,
            "phase": self.phase,
            "token": list(self.token),
            "rows_compared": self.rows_compared,
            "rows_differing": self.rows_differing,
            "max_abs_diff": self.max_abs_diff,
        }


RowJudge = Callable[[Site, torch.Tensor, torch.Tensor], torch.Tensor]


def same_bits_rows(site: Site, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per row: raw bits equal (``a`` and ``b`` are ``[R, ...]`` of one dtype)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return torch.zeros(a.shape[0], dtype=torch.bool)
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    eq = a.contiguous().view(width) == b.contiguous().view(width)
    return eq.reshape(a.shape[0], -1).all(dim=1)


def first_difference(
    left: NodeDump, right: NodeDump, judge: RowJudge = same_bits_rows, phases: tuple[str, ...] = ("forward",)
) -> NodeDifference | None:
    """Walk the nodes of ``left`` in run order (forward, then backward in the order gradients arrived) and
    return the first whose rows, on the logical rows both dumps hold, fail ``judge``; None if every node
    agrees. The token is the first failing row in logical order (sample ascending, position ascending)."""
    for phase in phases:
        ltab, rtab = getattr(left, phase), getattr(right, phase)
        for name, lrows in ltab.items():
            if name not in rtab:
                continue
            lmap, rmap = lrows.logical(), rtab[name].logical()
            keys = sorted(set(lmap) & set(rmap))
            if not keys:
                continue
            a = torch.stack([lmap[k] for k in keys])
            b = torch.stack([rmap[k] for k in keys])
            ok = judge(left.sites[name], a, b)
            if bool(ok.all()):
                continue
            bad = (~ok).nonzero().reshape(-1)
            diff = (a.double() - b.double()).abs()
            finite = diff[torch.isfinite(diff)]
            site = left.sites[name]
            return NodeDifference(
                node=name,
                operator=site.operator,
                layer=site.layer,
                phase=phase,
                token=keys[int(bad[0])],
                rows_compared=len(keys),
                rows_differing=int(bad.numel()),
                max_abs_diff=float(finite.max()) if finite.numel() else None,
            )
    return None
