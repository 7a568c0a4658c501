"""Judge one (candidate, operator, tier): run every layout once, render the four judgments.

A unit is the smallest thing the harness executes. Its four verdicts are independent: forward_accuracy
(canonical output vs the fp32 reference), forward_invariance (every other layout vs canonical, raw bits),
gradient_accuracy and gradient_invariance (the same for token and parameter gradients, training layouts only).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ws1_contract import Contract
from ws1_harness.run.adapters import OperatorAdapter, shared_param
from ws1_harness.run.compare import Comparison, bitwise_equal, tolerance_check
from ws1_harness.run.layouts_exec import LayoutRun, LogicalInputs, crash_text, run_layout, run_reference
from ws1_harness.run.observe import Observation
from ws1_harness.verdict.cells import check_record
from ws1_workload import Fixture, Layout, LayoutSpec, build_layout, logical_tensor
from ws1_workload.token_probes import apply_edit

Tensor = torch.Tensor

JUDGMENTS = ("forward_accuracy", "forward_invariance", "gradient_accuracy", "gradient_invariance")
CANONICAL_TYPE = "packed"


@dataclass(frozen=True)
class CandidateUnderTest:
    """What the harness needs of a registry candidate, plus the kernel ids the profile declares for it."""

    candidate_id: str
    fn: Callable[..., Tensor]
    reference: Callable[..., Tensor]
    declared_kernels: frozenset[str]
    declared_ops: frozenset[str]
    param_grad_rule: str | None
    # a stock baseline (native_torch): the ops it dispatches are torch's own choice per device and are recorded,
    # not judged; its bits are what the cells report
    stock: bool = False


@dataclass
class JudgmentResult:
    """One judgment's verdict with machine-readable reason and diagnostics."""

    judgment: str
    status: str  # "green" | "red" | "error"
    reason_code: str | None = None
    diagnostics: dict[str, Any] = field(default_factory=dict)
    layouts: list[dict[str, Any]] = field(default_factory=list)

    def add(self, reason: str, detail: Mapping[str, Any], status: str = "red") -> None:
        """Add a reason that applies beside those already found; every one is kept.

        `reason_code` stays the first reason found (a comparison outcome when there is one, since those are
        found first); `diagnostics["reasons"]` lists them all, and `detail` is merged into the diagnostics
        (where it applies: the undeclared ops, the silent calls, the crashed layouts). A red
        verdict outranks an error: a definite failure stands even when another layout could not be judged.
        """
        reasons = self.diagnostics.setdefault(
            "reasons", [] if self.reason_code is None else [self.reason_code]
        )
        if reason not in reasons:
            reasons.append(reason)
        self.diagnostics.update(detail)
        if self.status == "green":
            self.status, self.reason_code = status, reason
        elif self.status == "error" and status == "red":
            self.status = "red"


@dataclass
class UnitResult:
    operator: str
    judgments: dict[str, JudgmentResult]
    observed_kernels: list[str]
    observed_ops: list[str]
    layouts: list[str]
    wall_s: float
    device: dict[str, Any] | None = None
    peak_device_bytes: int | None = None
    #: wall seconds of the unit's phases (`PhaseClock`): where a slow cell's time went
    phases_s: dict[str, float] = field(default_factory=dict)


@dataclass
class PhaseClock:
    """Wall seconds per phase of a unit, summed by name: ``inputs`` (the logical tensors drawn or read from the
    parameter cache and moved to the device), ``reference`` (the fp32 reference), ``canonical`` (the candidate's
    canonical layout and the accuracy judgments), ``layouts`` (every other layout, run and compared).

    Why: a merged GPU run is bound by its slots, and a cell's single ``wall_s`` cannot say whether the
    reference, the inputs or the candidate's layouts fill it. The device is synchronised at each mark, so a phase
    holds its own device work and not the queue the previous phase left (a handful of syncs a unit)."""

    device: torch.device | None = None
    last: float = field(default_factory=time.perf_counter)
    phases: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str) -> None:
        """Close the phase ``name``: the seconds since the previous mark are added to it."""
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + (now - self.last)
        self.last = now

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self.phases.items()}


def upstream_draw_dtype(output_dtype: torch.dtype) -> torch.dtype:
    """The dtype the upstream gradient is drawn and masked in: the output's own when that is bf16, else fp32.

    Why: the values are bf16 draws (and probe values exact in bf16), and the mask is 0 or 1, so masking in bf16
    gives the bits of masking in fp32 and rounding; but lm_head's `[T, 151936]` upstream in fp32 cost three more
    full-size copies (a third of the unit's input time on two cores). tests/ws1_harness/test_upstream_draw.py
    holds it to the fp32 definition."""
    return torch.bfloat16 if output_dtype == torch.bfloat16 else torch.float32


def logical_inputs(
    adapter: OperatorAdapter,
    fixture: Fixture,
    case_id: str,
    pad_id: int,
    train: bool,
    device: torch.device | str = "cpu",
    param_case: str | None = None,
) -> LogicalInputs:
    """Every logical tensor of the case, each row a pure function of (case_id, tensor name, logical key).

    Generated on the host (the generator's stream does not depend on the device) and moved to ``device`` once,
    so a GPU run judges exactly the values a CPU run does.
    """
    samples = sorted(fixture.samples, key=lambda s: s.sample_id)
    keys = [(s.sample_id, p) for s in samples for p in range(s.length)]
    offsets: dict[int, int] = {}
    total = 0
    for s in samples:
        offsets[s.sample_id] = total
        total += s.length
    token_ids = torch.cat([s.token_ids for s in samples]).long()
    next_ids = torch.cat(
        [torch.cat([s.token_ids[1:], torch.tensor([pad_id], dtype=s.token_ids.dtype)]) for s in samples]
    ).long()
    tokens: dict[str, Tensor] = {}
    for spec in adapter.token_inputs:
        if spec.kind == "token_id":
            tokens[spec.name] = token_ids
        elif spec.kind == "target":
            tokens[spec.name] = next_ids
        else:
            name = f"{adapter.operator}.{spec.name}"
            kinds = fixture.hard_rows.get(name, ())
            x = logical_tensor(case_id, name, keys, spec.row_shape, torch.bfloat16, hard_rows=kinds)
            x = apply_edit(x, keys, fixture.token_edits.get(name))  # token order probes (token_probes)
            # a scale of 1 leaves every bf16 value as it is (exact in fp32): skip the two full-size copies
            tokens[spec.name] = x if spec.scale == 1.0 else (x.float() * spec.scale).to(torch.bfloat16)
    # A weight belongs to the model, not to the batch: the caller names it by (operator, model) in `param_case`,
    # so every tier of an operator judges the same weight and the worker generates a [151936, 4096] weight once
    # per sweep, not once per tier (about 5 s each on one host core).
    seed = param_case if param_case is not None else case_id
    params = {p.name: shared_param(f"{seed}|{adapter.operator}", p) for p in adapter.params}
    upstream = None
    if train:
        # N(0, 1) on active tokens, zero on prompts: gradients of order one, so an absolute threshold judges
        # them (dividing by the active-token count, as a mean loss does, made every gradient tiny against it)
        active = torch.cat([s.active for s in samples]).bool()
        if not bool(active.any()):
            raise ValueError(f"fixture {fixture.tier}: no active token; the gradient judgments need one")
        name = f"{adapter.operator}.upstream"
        kinds = fixture.hard_rows.get(name, ())  # dot-order probes of dx's reduction over the outputs
        g = logical_tensor(case_id, name, keys, adapter.output_row_shape, upstream_draw_dtype(adapter.output_dtype),
                           hard_rows=kinds)  # fmt: skip
        g = apply_edit(g, keys, fixture.token_edits.get(name))  # the weight-gradient order probe's values
        mask = active.reshape(-1, *([1] * len(adapter.output_row_shape))).to(g.dtype)
        upstream = (g * mask).to(adapter.output_dtype)
    dev = torch.device(device)
    tokens = {name: t.to(dev) for name, t in tokens.items()}
    params = {name: p.to(dev) for name, p in params.items()}
    upstream = None if upstream is None else upstream.to(dev)
    return LogicalInputs(tokens, params, upstream, offsets, keys)


def _combine(results: Mapping[str, Comparison]) -> tuple[bool, str | None, dict[str, Any]]:
    """All comparisons must pass; the first failure names the reason."""
    diagnostics = {name: c.to_json() for name, c in results.items()}
    for c in results.values():
        if not c.passed:
            return False, c.reason_code, diagnostics
    return True, None, diagnostics


def _per_layout(results: Mapping[str, Comparison]) -> list[dict[str, Any]]:
    """Group invariance comparisons named `<layout>` or `<layout>.<tensor>` into one record per layout.

    Each record carries one check per tensor (`output` for the forward comparison): the gate re-judges the
    layout's verdict from them.
    """
    grouped: dict[str, dict[str, Comparison]] = {}
    for name, comparison in results.items():
        grouped.setdefault(name.split(".", 1)[0], {})[name] = comparison
    out = []
    for layout, comps in grouped.items():
        passed, reason, diagnostics = _combine(comps)
        checks = [
            check_record(name.split(".", 1)[1] if "." in name else "output", "bitwise", c.to_json())
            for name, c in comps.items()
        ]
        out.append(
            {
                "layout": layout,
                "passed": passed,
                "reason_code": reason,
                "diagnostics": diagnostics,
                "checks": checks,
            }
        )
    return out


def _accuracy_layout(layout: str, results: Mapping[str, Comparison]) -> dict[str, Any]:
    """The one layout record of an accuracy judgment: the canonical layout, one tolerance check per tensor."""
    passed, reason, _ = _combine(results)
    checks = [check_record(name, "tolerance", c.to_json()) for name, c in results.items()]
    return {"layout": layout, "passed": passed, "reason_code": reason, "diagnostics": {}, "checks": checks}


def _verdict(
    judgment: str,
    results: Mapping[str, Comparison],
    extra: Mapping[str, Any],
    per_layout: bool = False,
    canonical: str | None = None,
) -> JudgmentResult:
    """All comparisons must pass. Invariance (`per_layout`) records one layout result per compared layout;
    accuracy records one for the `canonical` layout it compared on."""
    if not results:
        return JudgmentResult(judgment, "red", "not_run", {"why": "no comparison was made", **extra})
    passed, reason, diagnostics = _combine(results)
    if per_layout:
        layouts = _per_layout(results)
    else:
        layouts = [] if canonical is None else [_accuracy_layout(canonical, results)]
    if per_layout:
        diagnostics = {"failed_layouts": [lr["layout"] for lr in layouts if not lr["passed"]]}
    return JudgmentResult(judgment, "green" if passed else "red", reason, {**diagnostics, **extra}, layouts)


def _observation_problems(obs: Observation, cand: CandidateUnderTest) -> list[tuple[str, dict[str, Any]]]:
    """Every observation problem of one pass (forward or backward), each with where it was seen.

    A call in which nothing was recorded or launched is `no_kernel_observed` with its layout and call index,
    even when the other calls did record: observation merged over a unit would not notice one call that ran
    something unrecorded.
    """
    problems: list[tuple[str, dict[str, Any]]] = []
    if obs.silent_calls:
        problems.append(
            (
                "no_kernel_observed",
                {"silent_calls": obs.silent_calls[:8], "n_silent_calls": len(obs.silent_calls)},
            )
        )
    undeclared_kernels = sorted(k for k in obs.kernels | obs.launched if k not in cand.declared_kernels)
    if undeclared_kernels:
        problems.append(("undeclared_kernel", {"undeclared_kernels": undeclared_kernels}))
    if obs.mismatches:
        problems.append(
            ("kernel_mismatch", {"calls": obs.mismatches[:4], "mismatched_calls": len(obs.mismatches)})
        )
    undeclared_ops = [] if cand.stock else obs.undeclared_ops(cand.declared_ops)
    if undeclared_ops:
        problems.append(("undeclared_op", {"undeclared_ops": undeclared_ops}))
    return problems


def _observation_problem(obs: Observation, cand: CandidateUnderTest) -> tuple[str, dict[str, Any]] | None:
    """The first of `_observation_problems`, or None."""
    problems = _observation_problems(obs, cand)
    return problems[0] if problems else None


def device_record(t: Tensor) -> dict[str, Any]:
    """Where a tensor lives, as evidence records it: read from the tensor, never assumed."""
    dev = t.device
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        return {"type": "cuda", "name": torch.cuda.get_device_name(dev), "capability": f"sm_{major}{minor}"}
    return {"type": dev.type, "name": dev.type, "capability": None}


@dataclass
class _UnitState:
    """What one unit has seen so far: observations, crashes, layout facts, and the judgments rendered.

    Why a record: `run_unit` runs in steps (the canonical layout and accuracy, every other layout and
    invariance, then the reasons that apply beside the numbers); each step reads and adds to this state.
    """

    train: bool
    canon_name: str
    fwd_obs: Observation = field(default_factory=Observation)
    bwd_obs: Observation = field(default_factory=Observation)
    layout_info: dict[str, Any] = field(default_factory=dict)
    # what a layout's failure to run means for each pass: {layout: {"why", "at"}}
    fwd_crashes: dict[str, dict[str, str]] = field(default_factory=dict)
    bwd_crashes: dict[str, dict[str, str]] = field(default_factory=dict)
    backward_errors: dict[str, str] = field(default_factory=dict)
    modified: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"forward": [], "backward": []})
    judgments: dict[str, JudgmentResult] = field(default_factory=dict)

    def absorb(self, run: LayoutRun) -> None:
        self.fwd_obs.merge(run.forward_obs)
        self.bwd_obs.merge(run.backward_obs)
        self.layout_info[run.layout] = {"kind": run.kind, "calls": run.n_calls}
        for m in run.modified:
            self.modified[m["pass"]].append({"layout": run.layout, **m})
        if run.backward_crash is not None:
            self.bwd_crashes[run.layout] = run.backward_crash
        elif run.backward_error is not None:
            self.backward_errors[run.layout] = run.backward_error

    def crashed(self, spec: LayoutSpec, exc: Exception) -> None:
        self.fwd_crashes[spec.name] = crash_text(exc)
        if self.train and spec.kind == "training":
            self.bwd_crashes[spec.name] = self.fwd_crashes[spec.name]

    def backward_ran(self, layout: str) -> bool:
        return layout not in self.bwd_crashes and layout not in self.backward_errors


def _judge_accuracy(
    state: _UnitState,
    canon: LayoutRun,
    reference: LayoutRun,
    contract: Contract,
    op_class: str,
    dtype: str,
    keys: list[tuple[int, int]],
) -> None:
    """forward_accuracy (and gradient_accuracy when training): the canonical layout against the fp32 reference."""
    if canon.output_problem is not None:
        acc = {"output": canon.output_problem}
    else:
        spec = contract.resolve("forward_accuracy", op_class, dtype)
        acc = {"output": tolerance_check(canon.output, reference.output, spec, keys=keys)}
    state.judgments["forward_accuracy"] = _verdict("forward_accuracy", acc, {}, canonical=canon.layout)
    if state.train and canon.output_problem is not None:
        # a wrong output shape is the verdict, whatever the backward then does
        state.judgments["gradient_accuracy"] = _verdict("gradient_accuracy", acc, {}, canonical=canon.layout)
    elif state.train and state.backward_ran(canon.layout):
        state.judgments["gradient_accuracy"] = _gradient_accuracy(
            canon, reference, contract, op_class, dtype, keys
        )


def _compare_layout(
    state: _UnitState,
    run: LayoutRun,
    canon: LayoutRun | None,
    keys: list[tuple[int, int]],
    fwd_inv: dict[str, Comparison],
    grad_inv: dict[str, Comparison],
) -> None:
    """One non-canonical layout against canonical: raw bits of the output and, for training, the gradients."""
    canon_ok = canon is not None and canon.output_problem is None
    if run.output_problem is not None:
        fwd_inv[run.layout] = run.output_problem
    elif canon_ok and canon is not None:
        fwd_inv[run.layout] = bitwise_equal(run.output, canon.output, keys=keys)
    if state.train and run.kind == "training":
        if run.output_problem is not None:
            grad_inv[f"{run.layout}.output"] = run.output_problem
        elif (
            canon_ok
            and canon is not None
            and state.backward_ran(canon.layout)
            and state.backward_ran(run.layout)
        ):
            grad_inv.update(_gradient_invariance(run, canon, keys))


def _judge_invariance(
    state: _UnitState, fwd_inv: dict[str, Comparison], grad_inv: dict[str, Comparison]
) -> None:
    """forward_invariance and gradient_invariance from the layouts' comparisons (na when not differentiable)."""
    j = state.judgments
    if fwd_inv or not state.fwd_crashes:
        j["forward_invariance"] = _verdict(
            "forward_invariance", fwd_inv, {"layouts": state.layout_info}, per_layout=True
        )
    if not state.train:
        for name in ("gradient_accuracy", "gradient_invariance"):
            j[name] = JudgmentResult(
                name, "na", "not_differentiable", {"why": "the manifest marks it non-differentiable"}
            )
        return
    if grad_inv or not (state.bwd_crashes or state.backward_errors):
        j["gradient_invariance"] = _verdict("gradient_invariance", grad_inv, {}, per_layout=True)
    if state.backward_errors:
        for name in ("gradient_accuracy", "gradient_invariance"):
            j.setdefault(name, JudgmentResult(name, "green"))
            j[name].add("missing_backward", {"layouts_without_backward": state.backward_errors})


def _add_observed_reasons(state: _UnitState, cand: CandidateUnderTest) -> None:
    """The reasons that apply beside the numbers: what ran, what it changed, what could not run."""
    passes = [("forward", ("forward_accuracy", "forward_invariance"), state.fwd_obs, state.fwd_crashes)]
    if state.train:
        passes.append(
            ("backward", ("gradient_accuracy", "gradient_invariance"), state.bwd_obs, state.bwd_crashes)
        )
    for phase, names, obs, crashes in passes:
        for j in names:
            state.judgments.setdefault(j, JudgmentResult(j, "green"))
        problems = _observation_problems(obs, cand)
        if state.modified[phase]:
            problems.append(("input_modified", {"modified": state.modified[phase][:8]}))
        for reason, detail in problems:
            for j in names:
                state.judgments[j].add(reason, detail)
                state.judgments[j].diagnostics.setdefault("observed_ops", sorted(obs.ops))
        if crashes:
            # a crash of the canonical layout leaves every judgment of the pass unjudged; one of another
            # layout only the invariance judgment (accuracy reads the canonical layout alone)
            hit = names if state.canon_name in crashes else names[1:]
            for j in hit:
                state.judgments[j].add("exception", {"crashed_layouts": crashes}, status="error")
    for jr in state.judgments.values():
        if jr.status != "green" and jr.reason_code is not None:
            jr.diagnostics.setdefault("reasons", [jr.reason_code])


def run_unit(
    cand: CandidateUnderTest,
    adapter: OperatorAdapter,
    fixture: Fixture,
    layout_specs: tuple[LayoutSpec, ...],
    contract: Contract,
    op_class: str,
    *,
    case_id: str,
    pad_id: int,
    differentiable: bool = True,
    dtype: str = "bf16",
    device: torch.device | str = "cpu",
    param_case: str | None = None,
) -> UnitResult:
    """Execute the candidate once per layout and render the four judgments.

    Memory stays bounded at full Qwen3-8B widths (a [151936, 4096] weight and its fp32 gradient are 2.5 GB
    each): the reference and the canonical layout run first, accuracy is judged and the reference dropped,
    then every other layout is run, compared with canonical at once, and dropped.
    """
    dev = torch.device(device)
    on_gpu = dev.type == "cuda"
    if on_gpu:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    start = time.perf_counter()
    clock = PhaseClock(dev)
    canonical_specs = [s for s in layout_specs if s.type == CANONICAL_TYPE]
    if len(canonical_specs) != 1:
        raise ValueError(f"manifest layouts: expected exactly one '{CANONICAL_TYPE}' layout")
    canon_spec = canonical_specs[0]
    train = differentiable and bool(adapter.grad_inputs or adapter.params)
    inputs = logical_inputs(adapter, fixture, case_id, pad_id, train, dev, param_case)
    keys = inputs.keys
    clock.mark("inputs")
    state = _UnitState(train=train, canon_name=canon_spec.name)
    scratch: dict[str, Tensor] = {}

    def execute(layout: Layout, pool: dict[str, Tensor] | None = None) -> LayoutRun:
        return run_layout(
            cand.fn,
            adapter,
            layout,
            inputs,
            case_id=case_id,
            pad_id=pad_id,
            train=train and layout.kind == "training",
            param_rule=cand.param_grad_rule,
            main_grad_pool=pool,
            watch_launches=on_gpu,
            # the stock baseline's ops are recorded on its canonical layout, not judged anywhere
            watch_ops=not cand.stock or layout.name == canon_spec.name,
        )

    # 1. the canonical layout and the fp32 reference: the accuracy judgments, then the reference is dropped
    canon_layout = build_layout(fixture, canon_spec)
    reference = run_reference(cand.reference, adapter, canon_layout, inputs, train=train)
    clock.mark("reference")
    canon: LayoutRun | None
    try:
        canon = execute(canon_layout)
    except Exception as exc:  # nothing of the candidate's is judged yet; the other layouts still run
        state.crashed(canon_spec, exc)
        canon = None
    ran_on = None
    if canon is not None:
        state.absorb(canon)
        if canon.output_problem is None:
            ran_on = device_record(canon.output)
        _judge_accuracy(state, canon, reference, contract, op_class, dtype, keys)
    del reference
    clock.mark("canonical")

    # 2. every other layout, compared with canonical at once and dropped (its buffers are reused)
    fwd_inv: dict[str, Comparison] = {}
    grad_inv: dict[str, Comparison] = {}
    for spec in layout_specs:
        if spec.name == canon_spec.name:
            continue
        try:
            run = execute(build_layout(fixture, spec), scratch)
        except Exception as exc:  # the verdicts already found stand; this layout is an error
            state.crashed(spec, exc)
            continue
        state.absorb(run)
        _compare_layout(state, run, canon, keys, fwd_inv, grad_inv)
        del run
    _judge_invariance(state, fwd_inv, grad_inv)
    clock.mark("layouts")

    # 3. what ran, what it changed, what could not run
    _add_observed_reasons(state, cand)
    peak = None
    if on_gpu:
        torch.cuda.synchronize(dev)  # the wall time covers the device work, not only its launches
        peak = int(torch.cuda.max_memory_allocated(dev))
    return UnitResult(
        operator=adapter.operator,
        judgments=state.judgments,
        observed_kernels=sorted(
            state.fwd_obs.kernels | state.bwd_obs.kernels | state.fwd_obs.launched | state.bwd_obs.launched
        ),
        observed_ops=sorted(state.fwd_obs.ops | state.bwd_obs.ops),
        layouts=list(state.layout_info),
        wall_s=time.perf_counter() - start,
        device=ran_on,
        peak_device_bytes=peak,
        phases_s=clock.rounded(),
    )


def _gradient_accuracy(
    canon: LayoutRun,
    reference: LayoutRun,
    contract: Contract,
    op_class: str,
    dtype: str,
    keys: list[tuple[int, int]],
) -> JudgmentResult:
    """Token and parameter gradients of the canonical layout vs the fp32 reference gradients."""
    spec = contract.resolve("gradient_accuracy", op_class, dtype)
    acc: dict[str, Comparison] = {}
    for name, grad in canon.token_grads.items():
        acc[f"d_{name}"] = tolerance_check(grad, reference.token_grads[name], spec, keys=keys)
    for name, grad in canon.param_grads.items():
        acc[f"d_{name}"] = tolerance_check(grad, reference.param_grads[name], spec)
    return _verdict("gradient_accuracy", acc, {}, canonical=canon.layout)


def _gradient_invariance(
    run: LayoutRun, canon: LayoutRun, keys: list[tuple[int, int]]
) -> dict[str, Comparison]:
    """Raw-bit comparisons of one training layout's token and parameter gradients with canonical's."""
    out: dict[str, Comparison] = {}
    for name, grad in run.token_grads.items():
        out[f"{run.layout}.d_{name}"] = bitwise_equal(grad, canon.token_grads[name], keys=keys)
    for name, grad in run.param_grads.items():
        out[f"{run.layout}.d_{name}"] = bitwise_equal(grad, canon.param_grads[name])
    return out
