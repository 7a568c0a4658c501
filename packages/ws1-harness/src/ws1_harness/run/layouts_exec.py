"""Run one candidate on one physical layout: the forward and backward executions the judgments read.

The candidate executes on the layout itself: one call per physical call of the layout (one batched call for
B=N, one per micro-batch, one per chunk, the padded grid with its pad rows). Outputs and token gradients come
back in physical order and are restored to logical order by the workload's `restore`, which fails on any
missing, extra or duplicate key. Each layout runs once; the forward and gradient judgments read that one run
instead of running the candidate again for each judgment.
"""

from __future__ import annotations

import hashlib
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ws1_harness.run.adapters import OperatorAdapter
from ws1_harness.run.compare import Comparison, raw_bits_equal
from ws1_harness.run.observe import Observation, observe
from ws1_harness.verdict.status import ReasonCode
from ws1_kernels import LayoutContext
from ws1_kernels.reference import fp32_math
from ws1_workload import Layout, PhysicalCall, call_rows, restore

Tensor = torch.Tensor

PARAM_RULE_MAIN_GRAD = "sample_blocks_main_grad"
PARAM_RULE_AUTOGRAD = "autograd_accumulate"


class MissingBackwardError(RuntimeError):
    """The candidate's output cannot be differentiated: a categorised failure, not a crash."""


def crash_text(exc: BaseException) -> dict[str, str]:
    """One line saying what a candidate raised and where (the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
    return {"why": f"{type(exc).__name__}: {exc}".splitlines()[0], "at": where}


@dataclass
class LogicalInputs:
    """The logical tensors of one case: rows in logical order (samples ascending, positions ascending)."""

    tokens: dict[str, Tensor]
    params: dict[str, Tensor]
    upstream: Tensor | None
    offsets: dict[int, int]
    keys: list[tuple[int, int]]


@dataclass
class LayoutRun:
    """What one layout produced, restored to logical order."""

    layout: str
    kind: str
    n_calls: int
    output: Tensor
    token_grads: dict[str, Tensor] = field(default_factory=dict)
    param_grads: dict[str, Tensor] = field(default_factory=dict)
    forward_obs: Observation = field(default_factory=Observation)
    backward_obs: Observation = field(default_factory=Observation)
    backward_error: str | None = None
    # a backward that raised (not a missing backward): {"why", "at"}; the forward results stand
    backward_crash: dict[str, str] | None = None
    # the first call whose output had the wrong shape or dtype: a failed comparison (shape_mismatch or
    # dtype_mismatch); the layout stops there and `output` stays empty
    output_problem: Comparison | None = None
    # every input or parameter the candidate changed: {"tensor", "call", "pass"} (bit-for-bit check)
    modified: list[dict[str, Any]] = field(default_factory=list)


def _pad_noise(
    case_id: str, name: str, layout: str, call: int, shape: tuple[int, ...], device: torch.device
) -> Tensor:
    """Deterministic non-zero filler for the pad rows of one call: a row-mixing op must see garbage there.

    Only the pad rows are drawn (`shape[0]` of them), on the unit's device: a correct candidate never reads
    them, so their values need not match across devices, and drawing a whole [rows, vocabulary] call on the
    host once set a padded logprob unit's wall time.
    """
    digest = hashlib.sha256(f"ws1-pad|{case_id}|{name}|{layout}|{call}".encode()).digest()
    gen = torch.Generator(device=device).manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    noise = torch.randn(shape, generator=gen, device=device)
    return noise.masked_fill_(noise == 0, 1.0)


def gather_rows(logical: Tensor, index: Tensor, pad_rows: Tensor | None) -> Tensor:
    """Physical tensor on `logical`'s device: logical rows at `index`, `pad_rows` (or zeros) where index is -1.

    `pad_rows` holds one row per pad position, in physical order. `index` is a host tensor (the layout map
    is host data); the masks are derived on the host and moved once, so building a call's inputs never waits
    on the device.
    """
    real = index >= 0
    dev = logical.device
    out = torch.zeros((len(index), *logical.shape[1:]), dtype=logical.dtype, device=dev)
    real_rows = torch.nonzero(real).flatten()
    out[real_rows.to(dev)] = logical[index[real_rows].to(dev)]
    if pad_rows is not None and not bool(real.all()):
        pad_idx = torch.nonzero(~real).flatten()
        if len(pad_rows) != len(pad_idx):
            raise ValueError(f"gather_rows: {len(pad_rows)} pad rows given for {len(pad_idx)} pad positions")
        out[pad_idx.to(dev)] = pad_rows.to(device=dev, dtype=logical.dtype)
    return out


def _integer_pad(logical: Tensor, pad_id: int, n: int) -> Tensor:
    return torch.full((n, *logical.shape[1:]), pad_id, dtype=logical.dtype)  # host: gather_rows moves it


def _kv_prefix(call: PhysicalCall, inputs: LogicalInputs) -> dict[int, tuple[Tensor, Tensor]]:
    """Keys and values of the earlier tokens each sample of a chunked or decode call attends to."""
    if "k" not in inputs.tokens:
        return {}
    prefix: dict[int, tuple[Tensor, Tensor]] = {}
    for s, length in call.prefix_lengths.items():
        if length > 0:
            start = inputs.offsets[s]
            prefix[s] = (
                inputs.tokens["k"][start : start + length].clone(),
                inputs.tokens["v"][start : start + length].clone(),
            )
    return prefix


def _fresh_params(
    inputs: LogicalInputs, train: bool, rule: str | None, pool: dict[str, Tensor] | None = None
) -> dict[str, Tensor]:
    """New leaf parameters for one layout, with a zeroed fp32 main_grad when the rule carries one.

    `pool` lends main_grad buffers that are zeroed and reused from layout to layout (a fresh 2.5 GB
    allocation per layout cost 2-4 s of page faults at the full vocab), and the storage of the leaves: each layout
    still gets a new leaf tensor holding a fresh copy of the parameter's bits, written into the pooled storage (a
    fresh 1.2 GB clone per layout was the same page faults again). The caller must be done with the previous
    layout's gradients and outputs before the next layout runs.
    """
    params: dict[str, Tensor] = {}
    for name, value in inputs.params.items():
        if pool is None:
            leaf = value.detach().clone().requires_grad_(train)
        else:
            store = pool.get(f"leaf:{name}")
            if store is None:
                store = pool[f"leaf:{name}"] = torch.empty_like(value)  # the strides clone() would give
            store.copy_(value.detach())
            leaf = store.detach().requires_grad_(train)
        if train and rule == PARAM_RULE_MAIN_GRAD:
            buf = pool.get(name) if pool is not None else None
            if buf is None:
                buf = torch.zeros(value.shape, dtype=torch.float32, device=value.device)
                if pool is not None:
                    pool[name] = buf
            else:
                buf.zero_()
            leaf.main_grad = buf  # type: ignore[attr-defined]
        params[name] = leaf
    return params


def _read_param_grads(params: Mapping[str, Tensor], rule: str | None) -> dict[str, Tensor]:
    """The parameter gradients where the candidate's declared rule leaves them; never re-summed here."""
    grads: dict[str, Tensor] = {}
    for name, leaf in params.items():
        if rule == PARAM_RULE_MAIN_GRAD:
            grad = getattr(leaf, "main_grad", None)
        elif rule == PARAM_RULE_AUTOGRAD:
            grad = leaf.grad
        else:
            raise MissingBackwardError(f"parameter {name}: unknown gradient rule {rule!r}")
        if grad is None:
            raise MissingBackwardError(f"parameter {name}: no gradient under rule {rule!r}")
        grads[name] = grad.detach()  # fresh per layout: no copy needed
    return grads


def run_layout(
    fn: Callable[..., Tensor],
    adapter: OperatorAdapter,
    layout: Layout,
    inputs: LogicalInputs,
    *,
    case_id: str,
    pad_id: int,
    train: bool,
    param_rule: str | None,
    main_grad_pool: dict[str, Tensor] | None = None,
    watch_launches: bool = False,
    watch_ops: bool = True,
) -> LayoutRun:
    """Execute `fn` call by call on `layout`; backward too when `train` (training layouts only).

    Every tensor the candidate sees lives on the device of the logical inputs. The context carries the layout
    map as host tensors (its segments never sync with the device; `ctx.on(device)` copies the ids once).
    `watch_launches` (on a GPU) also checks each call's recorded Triton kernels against the launched ones.
    """
    params = _fresh_params(inputs, train, param_rule, main_grad_pool)
    outputs: list[Tensor] = []
    grads: dict[str, list[Tensor]] = {name: [] for name in adapter.grad_inputs}
    run = LayoutRun(layout.name, layout.kind, len(layout.calls), torch.empty(0))
    for call in layout.calls:
        index = call_rows(call, inputs.offsets)
        n = len(index)
        physical: dict[str, Tensor] = {}
        for spec in adapter.token_inputs:
            logical = inputs.tokens[spec.name]
            if spec.kind == "float":
                # filler only where the call has pad rows: a decode step (no pads) at the full vocabulary
                # once spent most of its time drawing noise for rows that were all real
                n_pads = int((index < 0).sum())
                pad = (
                    _pad_noise(
                        case_id, spec.name, layout.name, call.index, (n_pads, *spec.row_shape), logical.device
                    )
                    if n_pads
                    else None
                )
                x = gather_rows(logical, index, pad)
                physical[spec.name] = x.requires_grad_(train and spec.differentiable)
            else:
                physical[spec.name] = gather_rows(
                    logical, index, _integer_pad(logical, pad_id, int((index < 0).sum()))
                )
        # what the candidate got, kept to check bit for bit that it leaves its inputs as it got them
        given = {name: t.detach().clone() for name, t in physical.items()}
        ctx = LayoutContext(
            sample_ids=call.sample_ids.clone(),
            positions=call.positions.clone(),
            kv_prefix=_kv_prefix(call, inputs),
        )
        with observe(watch_launches, watch_ops) as fwd_obs:
            out = adapter.invoke(fn, physical, params, ctx)
        if not fwd_obs.saw_kernel:
            fwd_obs.silent_calls.append({"layout": layout.name, "call": call.index})
        run.forward_obs.merge(fwd_obs)
        _check_unchanged(run, physical, given, params, inputs, call.index, "forward")
        problem = _output_problem(out, n, adapter, layout.name, call.index)
        if problem is not None:
            run.output_problem = problem
            return run
        outputs.append(out.detach())
        if not train or run.backward_error is not None or run.backward_crash is not None:
            continue
        assert inputs.upstream is not None
        upstream = gather_rows(inputs.upstream, index, None).to(out.dtype)
        try:
            if not out.requires_grad:
                raise MissingBackwardError("output does not require grad: the candidate has no backward")
            with observe(watch_launches, watch_ops) as bwd_obs:
                torch.autograd.backward(out, upstream)
            if not bwd_obs.saw_kernel:
                bwd_obs.silent_calls.append({"layout": layout.name, "call": call.index})
            run.backward_obs.merge(bwd_obs)
        except (MissingBackwardError, NotImplementedError) as exc:
            run.backward_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            continue
        except (
            Exception
        ) as exc:  # a backward that crashes: the gradient judgments are errors, the forward stands
            run.backward_crash = {**crash_text(exc), "call": str(call.index)}
            continue
        _check_unchanged(run, physical, given, params, inputs, call.index, "backward")
        for name in adapter.grad_inputs:
            g = physical[name].grad
            if g is None:
                run.backward_error = f"input {name}: no gradient produced"
                break
            grads[name].append(g.detach())
    run.output = restore(layout, outputs)
    if train and run.backward_error is None and run.backward_crash is None:
        run.token_grads = {name: restore(layout, parts) for name, parts in grads.items()}
        try:
            run.param_grads = _read_param_grads(params, param_rule)
        except MissingBackwardError as exc:
            run.backward_error = str(exc)
    return run


def _output_problem(
    out: Any, rows: int, adapter: OperatorAdapter, layout: str, call: int
) -> Comparison | None:
    """A failed comparison when a call's output is not `[rows, *output_row_shape]` of the operator's dtype.

    Checked on every call, before its backward: a wrong shape is reported as such, not as the exception that a
    restore or a backward seeded with the wrong shape would raise later.
    """
    expected = [rows, *adapter.output_row_shape]
    if not isinstance(out, torch.Tensor) or list(out.shape) != expected:
        found = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return Comparison(
            False,
            ReasonCode.SHAPE_MISMATCH.value,
            {"layout": layout, "call": call, "actual_shape": found, "expected_shape": expected},
        )
    if out.dtype != adapter.output_dtype:
        return Comparison(
            False,
            ReasonCode.DTYPE_MISMATCH.value,
            {
                "layout": layout,
                "call": call,
                "actual_dtype": str(out.dtype),
                "expected_dtype": str(adapter.output_dtype),
            },
        )
    return None


def _check_unchanged(
    run: LayoutRun,
    physical: Mapping[str, Tensor],
    given: Mapping[str, Tensor],
    params: Mapping[str, Tensor],
    inputs: LogicalInputs,
    call: int,
    phase: str,
) -> None:
    """Record every input or parameter whose bits the candidate changed during one pass of one call.

    Bit for bit, not by `_version`: a write through `.data` (as a trainer's weight sync does) bumps no
    version counter. Inputs are compared with the copy taken before the call, parameters with the logical
    parameter they were cloned from; a tensor is reported once, at the first pass that changed it.
    """
    seen = {m["tensor"] for m in run.modified}
    for name, t in physical.items():
        if name not in seen and not raw_bits_equal(t, given[name]):
            run.modified.append({"tensor": name, "call": call, "pass": phase})
    for name, leaf in params.items():
        if name not in seen and not raw_bits_equal(leaf, inputs.params[name]):
            run.modified.append({"tensor": name, "call": call, "pass": phase})


def run_reference(
    ref_fn: Callable[..., Tensor],
    adapter: OperatorAdapter,
    canonical: Layout,
    inputs: LogicalInputs,
    *,
    train: bool,
) -> LayoutRun:
    """The fp32 gold on the canonical layout: bf16 inputs upcast, plain autograd, TF32 off.

    Forward and backward both run inside `fp32_math()` (no TF32 or bf16 inside fp32 matmuls, previous
    settings restored), on the device of the inputs.
    """
    with fp32_math():
        return _run_reference(ref_fn, adapter, canonical, inputs, train=train)


def _run_reference(
    ref_fn: Callable[..., Tensor],
    adapter: OperatorAdapter,
    canonical: Layout,
    inputs: LogicalInputs,
    *,
    train: bool,
) -> LayoutRun:
    (call,) = canonical.calls
    index = call_rows(call, inputs.offsets)
    physical: dict[str, Tensor] = {}
    for spec in adapter.token_inputs:
        logical = inputs.tokens[spec.name]
        x = gather_rows(logical, index, None)
        if spec.kind == "float":
            x = x.float().requires_grad_(train and spec.differentiable)
        physical[spec.name] = x
    params = {n: p.detach().float().requires_grad_(train) for n, p in inputs.params.items()}
    ctx = LayoutContext(sample_ids=call.sample_ids.clone(), positions=call.positions.clone(), kv_prefix={})
    out = adapter.invoke(ref_fn, physical, params, ctx)
    run = LayoutRun(canonical.name, canonical.kind, 1, restore(canonical, [out.detach()]))
    if train:
        assert inputs.upstream is not None
        upstream = gather_rows(inputs.upstream, index, None).to(adapter.output_dtype).float()
        torch.autograd.backward(out, upstream)
        run.token_grads = {
            n: restore(canonical, [physical[n].grad.detach()])  # type: ignore[union-attr]
            for n in adapter.grad_inputs
        }
        run.param_grads = {n: p.grad.detach() for n, p in params.items()}  # type: ignore[union-attr]
    return run
