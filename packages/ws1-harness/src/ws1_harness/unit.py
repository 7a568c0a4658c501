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
from ws1_workload import Fixture, Layout, LayoutSpec, build_layout, logical_tensor

from .adapters import OperatorAdapter, shared_param
from .compare import Comparison, bitwise_equal, tolerance_check
from .layouts_exec import LayoutRun, LogicalInputs, run_layout, run_reference
from .observe import Observation

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
            x = logical_tensor(
                case_id, f"{adapter.operator}.{spec.name}", keys, spec.row_shape, torch.bfloat16
            )
            tokens[spec.name] = (x.float() * spec.scale).to(torch.bfloat16)
    # A weight belongs to the model, not to the batch: the caller names it by (operator, model) in `param_case`,
    # so every tier of an operator judges the same weight and the worker generates a [151936, 4096] weight once
    # per sweep, not once per tier (about 5 s each on one host core).
    seed = param_case if param_case is not None else case_id
    params = {p.name: shared_param(f"{seed}|{adapter.operator}", p) for p in adapter.params}
    upstream = None
    if train:
        active = torch.cat([s.active for s in samples]).bool()
        n_active = int(active.sum())
        if n_active == 0:
            raise ValueError(f"fixture {fixture.tier}: no active token; the gradient judgments need one")
        g = logical_tensor(
            case_id, f"{adapter.operator}.upstream", keys, adapter.output_row_shape, torch.float32
        ).float()
        mask = active.reshape(-1, *([1] * len(adapter.output_row_shape))).float()
        upstream = (g * mask / n_active).to(adapter.output_dtype)
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
    """Group invariance comparisons named `<layout>` or `<layout>.<tensor>` into one record per layout."""
    grouped: dict[str, dict[str, Comparison]] = {}
    for name, comparison in results.items():
        grouped.setdefault(name.split(".", 1)[0], {})[name] = comparison
    out = []
    for layout, comps in grouped.items():
        passed, reason, diagnostics = _combine(comps)
        out.append({"layout": layout, "passed": passed, "reason_code": reason, "diagnostics": diagnostics})
    return out


def _verdict(
    judgment: str, results: Mapping[str, Comparison], extra: Mapping[str, Any], per_layout: bool = False
) -> JudgmentResult:
    if not results:
        return JudgmentResult(judgment, "red", "not_run", {"why": "no comparison was made", **extra})
    passed, reason, diagnostics = _combine(results)
    layouts = _per_layout(results) if per_layout else []
    if per_layout:
        diagnostics = {"failed_layouts": [lr["layout"] for lr in layouts if not lr["passed"]]}
    return JudgmentResult(judgment, "green" if passed else "red", reason, {**diagnostics, **extra}, layouts)


def _observation_problem(obs: Observation, cand: CandidateUnderTest) -> tuple[str, dict[str, Any]] | None:
    """A launch or dispatch the profile did not declare makes the judgments that read it red."""
    if not obs.kernels and not obs.launched:
        return "no_kernel_observed", {"observed_kernels": []}
    undeclared_kernels = sorted(k for k in obs.kernels | obs.launched if k not in cand.declared_kernels)
    if undeclared_kernels:
        return "undeclared_kernel", {"undeclared_kernels": undeclared_kernels}
    if obs.mismatches:
        return "kernel_mismatch", {"calls": obs.mismatches[:4], "mismatched_calls": len(obs.mismatches)}
    undeclared_ops = [] if cand.stock else obs.undeclared_ops(cand.declared_ops)
    if undeclared_ops:
        return "undeclared_op", {"undeclared_ops": undeclared_ops}
    return None


def device_record(t: Tensor) -> dict[str, Any]:
    """Where a tensor lives, as evidence records it: read from the tensor, never assumed."""
    dev = t.device
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        return {"type": "cuda", "name": torch.cuda.get_device_name(dev), "capability": f"sm_{major}{minor}"}
    return {"type": dev.type, "name": dev.type, "capability": None}


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
    canonical_specs = [s for s in layout_specs if s.type == CANONICAL_TYPE]
    if len(canonical_specs) != 1:
        raise ValueError(f"manifest layouts: expected exactly one '{CANONICAL_TYPE}' layout")
    canon_spec = canonical_specs[0]
    train = differentiable and bool(adapter.grad_inputs or adapter.params)
    inputs = logical_inputs(adapter, fixture, case_id, pad_id, train, dev, param_case)
    keys = inputs.keys

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

    canon_layout = build_layout(fixture, canon_spec)
    reference = run_reference(cand.reference, adapter, canon_layout, inputs, train=train)
    canon = execute(canon_layout)
    ran_on = device_record(canon.output)
    fwd_obs, bwd_obs = Observation(), Observation()
    fwd_obs.merge(canon.forward_obs)
    bwd_obs.merge(canon.backward_obs)
    layout_info: dict[str, Any] = {canon.layout: {"kind": canon.kind, "calls": canon.n_calls}}

    judgments: dict[str, JudgmentResult] = {}
    # forward_accuracy: the candidate's canonical output vs the fp32 reference.
    if canon.output.dtype != adapter.output_dtype:
        judgments["forward_accuracy"] = JudgmentResult(
            "forward_accuracy",
            "red",
            "dtype_mismatch",
            {"expected": str(adapter.output_dtype), "found": str(canon.output.dtype)},
        )
    else:
        spec = contract.resolve("forward_accuracy", op_class, dtype)
        judgments["forward_accuracy"] = _verdict(
            "forward_accuracy",
            {"output": tolerance_check(canon.output, reference.output, spec, keys=keys)},
            {},
        )
    backward_errors: dict[str, str] = {}
    if train:
        if canon.backward_error:
            backward_errors[canon.layout] = canon.backward_error
        else:
            judgments["gradient_accuracy"] = _gradient_accuracy(
                canon, reference, contract, op_class, dtype, keys
            )
    del reference

    fwd_inv: dict[str, Comparison] = {}
    grad_inv: dict[str, Comparison] = {}
    for spec in layout_specs:
        if spec.name == canon_spec.name:
            continue
        run = execute(
            build_layout(fixture, spec), scratch
        )  # compared and dropped before the buffers are reused
        fwd_obs.merge(run.forward_obs)
        bwd_obs.merge(run.backward_obs)
        layout_info[run.layout] = {"kind": run.kind, "calls": run.n_calls}
        # forward_invariance: every other layout, raw bits, after restore.
        fwd_inv[run.layout] = bitwise_equal(run.output, canon.output, keys=keys)
        if train and run.kind == "training":
            if run.backward_error:
                backward_errors[run.layout] = run.backward_error
            elif not canon.backward_error:
                grad_inv.update(_gradient_invariance(run, canon, keys))
        del run
    judgments["forward_invariance"] = _verdict(
        "forward_invariance", fwd_inv, {"layouts": layout_info}, per_layout=True
    )

    problem = _observation_problem(fwd_obs, cand)
    if problem is not None:
        for j in ("forward_accuracy", "forward_invariance"):
            judgments[j] = JudgmentResult(
                j, "red", problem[0], {**problem[1], "observed_ops": sorted(fwd_obs.ops)}
            )

    if not train:
        for j in ("gradient_accuracy", "gradient_invariance"):
            judgments[j] = JudgmentResult(
                j, "na", "not_differentiable", {"why": "the manifest marks it non-differentiable"}
            )
    elif backward_errors:
        for j in ("gradient_accuracy", "gradient_invariance"):
            judgments[j] = JudgmentResult(j, "red", "missing_backward", {"layouts": backward_errors})
    else:
        judgments["gradient_invariance"] = _verdict("gradient_invariance", grad_inv, {}, per_layout=True)
        problem = _observation_problem(bwd_obs, cand)
        if problem is not None:
            for j in ("gradient_accuracy", "gradient_invariance"):
                judgments[j] = JudgmentResult(
                    j, "red", problem[0], {**problem[1], "observed_ops": sorted(bwd_obs.ops)}
                )

    peak = None
    if on_gpu:
        torch.cuda.synchronize(dev)  # the wall time covers the device work, not only its launches
        peak = int(torch.cuda.max_memory_allocated(dev))
    return UnitResult(
        operator=adapter.operator,
        judgments=judgments,
        observed_kernels=sorted(fwd_obs.kernels | bwd_obs.kernels | fwd_obs.launched | bwd_obs.launched),
        observed_ops=sorted(fwd_obs.ops | bwd_obs.ops),
        layouts=list(layout_info),
        wall_s=time.perf_counter() - start,
        device=ran_on,
        peak_device_bytes=peak,
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
    return _verdict("gradient_accuracy", acc, {})


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
