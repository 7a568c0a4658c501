"""`ws1 bench`: time each candidate of a profile against its stock peer, in one process, one device.

Flow: validate the arguments (bad input exits 2 before anything runs, including an output that exists or sits
in the checkout), measure the two ceilings, then per operator resolve the candidate (an unresolvable one is
one `unavailable` row) and per point time the forward and, for differentiable operators, the backward of both
sides. A side that raises becomes an `error` row with its one-line message; the run always finishes and writes
its JSON and Markdown.

Forward: plain inputs (no grad), one call per timed iteration. Backward: the forward runs once outside the
timing on leaves that require grad; each timed call is `torch.autograd.backward(out, grad_out,
retain_graph=True)`, with the leaves' `.grad` set to None before it (outside the timed region). Before the
timing each side makes one untimed probe call under `launches.observe()` (the kernels it really launched are
recorded) and, on CUDA, inside a `max_memory_allocated` window (its peak memory above what was allocated).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from ws1_harness.run.bench import cases as C
from ws1_harness.run.bench import host as H
from ws1_harness.run.bench import records as R
from ws1_harness.run.bench import roofline as RL
from ws1_harness.run.bench import shapes as S
from ws1_harness.run.bench import steps as ST
from ws1_harness.run.bench import targets as T
from ws1_harness.run.bench.stock import observed_cuda_kernels
from ws1_harness.run.bench.timing import Timer, l2_policy, make_timer, measure_ceilings, one_line, synchronize
from ws1_harness.verdict.provenance import portable_path

# Ceiling sizes: 2 GiB copy and 8192^3 mm on CUDA (large enough to reach the plateau on an H200); on the CPU
# small enough to finish in a second, since CPU figures only exercise the machinery.
CUDA_COPY_MIB, CPU_COPY_MIB = 2048, 64
CUDA_MM_N, CPU_MM_N = 8192, 512
SEED = 0

METHOD = {
    "fwd": "forward only: inputs do not require grad; one candidate call per timed iteration",
    "bwd": (
        "backward only: forward once outside the timing on grad-requiring leaves, each timed call is "
        "torch.autograd.backward(out, grad_out, retain_graph=True) with leaf .grad set to None before it; the "
        "peer writes dx and a fresh bf16 weight.grad (stock autograd), a sample_blocks_main_grad candidate "
        "writes dx and accumulates dW into its fp32 weight.main_grad (read + write, allocated outside the timing); "
        "for such a candidate's GEMM rows a second peer, timed the same way, does the same: dx, and dW "
        "accumulated into an fp32 main_grad by one cuBLAS GEMM with beta = 1 (peer_main_grad; the verdict stays "
        "against the first peer)"
    ),
    "ratio": "peer_ms / candidate_ms (> 1: the candidate is faster than stock)",
    "context": (
        "one LayoutContext per point, built on the host and reused across calls (its device copy is cached), "
        "as one micro-batch reuses it across layers: one sample of M rows; attention: M/S samples of S rows"
    ),
    "step": ST.STEP_METHOD,
    "host": (
        f"forward rows at M in {list(H.HOST_MS)}: median of {H.REPEATS} bursts of {H.CALLS} back-to-back calls; "
        "issue_us = the burst's wall time before any sync per call (the host's own cost, judged against "
        f"{H.HOST_TARGET_US:g} us), eager_us = up to a device sync, graph_us = one CUDA graph of the same calls "
        "replayed (the device's time); a call that cannot be captured records the capture's error"
    ),
    "peak_mem": (
        "CUDA only: torch.cuda.max_memory_allocated() minus memory_allocated() before one probe call (fwd: the "
        "call; bwd: a fresh forward with grad + backward); the candidate's main_grad buffer is allocated before"
    ),
}


@dataclass(frozen=True)
class Options:
    profile: str
    device: str
    model: str
    out: Path
    ops: tuple[str, ...] | None = None
    shapes: tuple[str, ...] | None = None
    ms: tuple[int, ...] | None = None
    force: bool = False
    allow_in_checkout: bool = False
    candidates: str | None = None
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    copy_mib: float | None = None
    mm_n: int | None = None
    attn_seq: int = S.DEFAULT_ATTN_SEQ
    # train_step / decode_step (bench/steps.py); None: the default, and bad input when the op is not asked for
    layers: int | None = None
    tokens: int | None = None
    cache: int | None = None
    batches: tuple[int, ...] | None = None


def _fail(msg: str) -> R.BenchInputError:
    return R.BenchInputError(f"ws1 bench: {msg}")


def options_from_args(args: argparse.Namespace) -> Options:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise _fail("--device cuda: no CUDA device here")
    for flag, values in (
        ("--op", args.op),
        ("--shape", args.shape),
        ("--m", args.m),
        ("--batch", args.batch),
    ):
        if values and len(set(values)) != len(values):
            raise _fail(f"{flag} given twice for the same value")
    return Options(
        profile=args.profile,
        device=device,
        model=args.model,
        out=Path(args.out) if args.out.strip() else Path(""),
        ops=tuple(args.op) if args.op else None,
        shapes=tuple(args.shape) if args.shape else None,
        ms=tuple(args.m) if args.m else None,
        force=args.force,
        allow_in_checkout=args.allow_in_checkout,
        candidates=args.candidates,
        warmup_ms=args.warmup_ms,
        rep_ms=args.rep_ms,
        copy_mib=args.copy_mib,
        mm_n=args.mm_n,
        attn_seq=args.attn_seq,
        layers=args.layers,
        tokens=args.tokens,
        cache=args.cache,
        batches=tuple(args.batch) if args.batch else None,
    )


def output_paths(opts: Options) -> tuple[Path, Path]:
    stem = f"bench-{opts.profile}-{opts.device}"
    return opts.out / f"{stem}.json", opts.out / f"{stem}.md"


def check_outputs(opts: Options) -> tuple[Path, Path]:
    """Refuse an existing file (unless --force) or a path in the git checkout (unless --allow-in-checkout)."""
    from ws1_harness.verdict.evidence import EvidenceError, check_outside_checkout

    paths = output_paths(opts)
    if not str(opts.out).strip() or str(opts.out) == ".":  # `--out ""` once wrote into the current folder
        raise _fail("--out is empty: name a directory outside the checkout")
    if opts.out.exists() and not opts.out.is_dir():
        raise _fail(f"--out {opts.out} is not a directory")
    for p in paths:
        if p.exists() and not opts.force:
            raise _fail(f"{p} exists; pass --force to overwrite it")
        if not opts.allow_in_checkout:
            try:
                check_outside_checkout(p)
            except EvidenceError as exc:
                raise _fail(str(exc).replace("evidence: ", "", 1) + " (--allow-in-checkout)") from None
    return paths


@dataclass(frozen=True)
class Plan:
    ops: tuple[str, ...]
    points: dict[str, list[S.Point]]
    differentiable: dict[str, bool]
    total_rows: int
    steps: tuple[ST.StepPoint, ...] = ()


def make_plan(opts: Options) -> Plan:
    """Validate profile, operators, shapes, M and model against the registry and manifest; list the points."""
    from ws1_harness.run.tasks import load_plugin
    from ws1_kernels import registry
    from ws1_workload import load_manifest

    if opts.candidates:
        try:
            load_plugin(opts.candidates)
        except Exception as exc:  # noqa: BLE001 - a bad plug-in is bad input
            raise _fail(f"--candidates {opts.candidates}: {one_line(exc)}") from None
    if opts.profile not in registry.profiles():
        raise _fail(f"unknown profile {opts.profile!r} (known: {', '.join(registry.profiles())})")
    manifest = load_manifest(None)
    try:
        model = manifest.model(opts.model)
    except Exception:  # noqa: BLE001
        raise _fail(f"unknown model {opts.model!r}") from None
    if opts.attn_seq < 1:
        raise _fail(f"--attn-seq must be >= 1, got {opts.attn_seq}")
    if opts.ms and min(opts.ms) < 1:
        raise _fail(f"--m must be >= 1, got {min(opts.ms)}")
    table = S.op_shapes(model, opts.attn_seq)
    # an operator is benched when the spec gives it shapes and cases.py its stock peer and work formula
    benched = tuple(op for op in S.bench_ops() if op in C.CASES)
    no_case = [op for op in (opts.ops or ()) if op in S.bench_ops() and op not in C.CASES]
    if no_case:
        raise _fail(
            f"operator {no_case[0]!r} has bench shapes but no bench case (its peer, in run/bench/cases.py)"
        )
    unknown = [op for op in (opts.ops or ()) if op not in benched + ST.STEP_OPS]
    if unknown:
        raise _fail(f"unknown operator {unknown[0]!r} (known: {', '.join(benched + ST.STEP_OPS)})")
    names = S.all_shape_names(table)
    bad_shape = [s for s in (opts.shapes or ()) if s not in names]
    if bad_shape:
        raise _fail(f"unknown shape {bad_shape[0]!r} (known: {', '.join(names)})")
    # the whole-model steps run only when named; --shape and --m set operator rows, the steps have their own
    step_ops = tuple(op for op in (opts.ops or ()) if op in ST.STEP_OPS)
    step_points = ST.plan_points(
        step_ops, model, layers=opts.layers, tokens=opts.tokens, cache=opts.cache, batches=opts.batches
    )
    if step_ops:
        ST.check_runnable()
    ops = tuple(op for op in opts.ops if op not in ST.STEP_OPS) if opts.ops else benched
    if step_ops and not ops and (opts.shapes or opts.ms):
        flag = "--shape" if opts.shapes else "--m"
        raise _fail(
            f"{flag} sets operator rows; --op {step_ops[0]} takes --layers, --tokens, --batch, --cache"
        )
    if opts.shapes:
        # --shape narrows the default operator list; an operator named by --op must have one of the shapes
        lacking = [op for op in ops if not any(s in table[op] for s in opts.shapes)]
        if opts.ops and lacking:
            raise _fail(f"--op {lacking[0]} has none of --shape {', '.join(opts.shapes)}")
        ops = tuple(op for op in ops if op not in lacking)
        if not ops:
            raise _fail(f"no operator has shape {', '.join(opts.shapes)}")
    points = {op: S.points(op, table, opts.ms, opts.shapes) for op in ops}
    for p in points.get("attention", []):
        why = S.attention_m_error(p.m, opts.attn_seq)
        if why:
            raise _fail(why)
    # decode is inference: forward only, whatever the operator's training mode
    diff = {
        op: manifest.operators[S.operator_of(op)].differentiable and op not in S.OPERATOR_OF for op in ops
    }
    total = 0
    for op in ops:
        if _resolve(opts, op)[0] is None:
            total += 1
        else:
            total += len(points[op]) * (2 if diff[op] else 1)
    if step_points:
        runnable = ST.resolve_reason(opts.profile, opts.device) is None
        total += len(step_points) if runnable else len(step_ops)
    return Plan(tuple(ops), points, diff, total, tuple(step_points))


def _resolve(opts: Options, op: str) -> tuple[Any, str | None]:
    from ws1_kernels import registry
    from ws1_kernels.errors import RegistryError

    try:
        return registry.resolve(opts.profile, S.operator_of(op), device=opts.device), None
    except RegistryError as exc:
        return None, one_line(exc).split(": ", 1)[-1]


# ---------------------------------------------------------------------------------------------- one side


def _peak_call(device: str, fn: Callable[[], Any]) -> int | None:
    """Run `fn` once; on CUDA return the allocator's peak above what was allocated before it."""
    if device != "cuda":
        fn()
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del result
    return int(peak)


@dataclass
class Side:
    ms: float | None = None
    peak: int | None = None
    kernels: tuple[str, ...] = ()
    error: str | None = None
    no_backward: bool = False


def _time_forward(timer: Timer, device: str, label: str, call: Callable[[], Any]) -> Side:
    from ws1_kernels import launches

    side = Side()
    try:
        with launches.observe() as log:
            side.peak = _peak_call(device, call)
        side.kernels = tuple(dict.fromkeys(log.kernels))
        side.ms = timer(call, label=label)
    except Exception as exc:  # noqa: BLE001 - recorded as an error row, never a crash
        side.error = one_line(exc)
    return side


def _leaves(inputs: C.Inputs, case: C.OpCase, main_grad: bool) -> tuple[C.Inputs, list[torch.Tensor]]:
    t = dict(inputs)
    leaves = []
    for name in case.grads:
        leaf = inputs[name].detach().requires_grad_(True)
        t[name] = leaf
        leaves.append(leaf)
    if main_grad and case.param is not None:
        w = t[case.param]
        w.main_grad = torch.zeros(w.shape, dtype=torch.float32, device=w.device)  # type: ignore[attr-defined]
    return t, leaves


def _time_backward(
    timer: Timer,
    device: str,
    label: str,
    forward: Callable[[C.Inputs], torch.Tensor],
    inputs: C.Inputs,
    case: C.OpCase,
    main_grad: bool,
    gen: torch.Generator,
) -> Side:
    from ws1_kernels import launches

    side = Side()
    try:
        t, leaves = _leaves(inputs, case, main_grad)

        def step() -> None:
            out = forward(t)
            if not out.requires_grad:
                side.no_backward = True
                return
            torch.autograd.backward(out, torch.ones_like(out))

        with launches.observe() as log:
            side.peak = _peak_call(device, step)
        side.kernels = tuple(dict.fromkeys(log.kernels))
        if side.no_backward:
            return side
        for leaf in leaves:
            leaf.grad = None
        out = forward(t)
        grad_out = torch.randn(out.shape, generator=gen, device=out.device, dtype=out.dtype)
        side.ms = timer(
            lambda: torch.autograd.backward(out, grad_out, retain_graph=True),
            grad_to_none=leaves,
            label=label,
        )
    except Exception as exc:  # noqa: BLE001
        side.error = one_line(exc)
    return side


# ---------------------------------------------------------------------------------------------- one point


def _row(p: S.Point, phase: str, cand: Any, case: C.OpCase, peer: str, profile: str) -> R.Row:
    traffic = None
    if case.traffic is not None:
        rule = phase == "bwd" and cand.param_grad_rule == "sample_blocks_main_grad"
        traffic = {"candidate": case.traffic(p, phase, rule), "peer": case.traffic(p, phase, False)}
        if rule and case.stock_main_grad is not None:
            traffic["peer_main_grad"] = case.traffic(p, phase, True)
    return R.Row(
        traffic_bytes=traffic,
        op=p.op,
        shape=p.shape,
        m=p.m,
        phase=phase,
        status="ok",
        dims=dict(p.dims),
        candidate_id=cand.candidate_id,
        param_grad_rule=cand.param_grad_rule,
        peer=peer,
        metric=case.metric,
        work=case.work(p, phase),
        fp32_logits_bytes=C.fp32_logits_bytes(p),
        target=T.target_for(p.op, phase, p.m, p.dims, profile),
    )


def _fill(row: R.Row, cand: Side, peer: Side) -> R.Row:
    row.candidate_ms, row.peer_ms = cand.ms, peer.ms
    row.kernels_observed = list(cand.kernels)
    row.peak_mem_bytes = (
        {"candidate": cand.peak, "peer": peer.peak}
        if (cand.peak is not None or peer.peak is not None)
        else None
    )
    row.errors = {k: v for k, v in (("candidate", cand.error), ("peer", peer.error)) if v}
    if row.errors:
        row.status = "error"
    elif cand.no_backward:
        row.status, row.reason = "skipped", "the candidate's output has no grad_fn (no backward)"
        row.candidate_ms = None
    return row


def bench_point(opts: Options, timer: Timer, cand: Any, p: S.Point, differentiable: bool) -> list[R.Row]:
    """The rows of one point (fwd, and bwd when differentiable); the point's tensors are freed on return."""
    rows = _measure_point(opts, timer, cand, p, differentiable)
    if opts.device == "cuda":
        try:
            synchronize(opts.device)
            torch.cuda.empty_cache()  # the next point may need the memory this one's caching pool holds
        except Exception:  # noqa: BLE001, S110 - a poisoned CUDA context shows as error rows that follow
            pass
    return rows


def step_path_ops(case: C.OpCase, profile: str) -> Any:
    """The profile's ``StepOps`` when the row has a step-path call (``OpCase.step``) and the profile has step ops,
    else None (the row times the candidate's call).

    Why: the decode row once timed the layout path, which hands the candidate every sample's key prefix and
    concatenates it on every call (about 1 GB at 256 samples of 4096 keys): not the kernel a rollout runs, and
    not what the step path's decode pays. A profile with step ops is timed on them."""
    if case.step is None:
        return None
    from ws1_kernels.integrations.step import has_step_ops, step_ops

    return step_ops(profile) if has_step_ops(profile) is None else None


def _measure_point(opts: Options, timer: Timer, cand: Any, p: S.Point, differentiable: bool) -> list[R.Row]:
    case = C.CASES[p.op]
    dev = torch.device(opts.device)
    phases = ("fwd", "bwd") if differentiable else ("fwd",)
    try:
        peer = C.peer_name(case, p, dev)
        gen = torch.Generator(device=dev).manual_seed(SEED)
        inputs = case.make(p, dev, gen)
    except Exception as exc:  # noqa: BLE001
        rows = [_row(p, ph, cand, case, case.peer, opts.profile) for ph in phases]
        for r in rows:
            r.status, r.errors = "error", {"setup": one_line(exc)}
        return rows
    ctx = case.context(p, inputs) if case.context is not None else C.context(p)
    ops = step_path_ops(case, opts.profile)

    # chosen once, so the timed call holds no branch of the bench's own
    if ops is not None:
        step = case.step
        assert step is not None  # step_path_ops returns ops only for a case with a step call

        def cand_fwd() -> torch.Tensor:
            return step(ops, inputs, p)

    else:

        def cand_fwd() -> torch.Tensor:
            return case.candidate(cand.fn, inputs, ctx, p)

    def peer_fwd() -> torch.Tensor:
        return case.stock(inputs, p)

    if case.op in C.SDPA_OPS and dev.type == "cuda":  # which backend the default selection ran, observed
        try:
            seen = observed_cuda_kernels(peer_fwd)
            peer = f"{peer}; kernels seen: {', '.join(seen) if seen else 'none matched'}"
        except Exception as exc:  # noqa: BLE001 - the row still times; the record says why nothing was seen
            peer = f"{peer}; kernels not observed ({one_line(exc)})"

    cand_side = _time_forward(timer, opts.device, "candidate", cand_fwd)
    if ops is not None and dev.type == "cuda" and cand_side.error is None:
        # the step ops record no launch in ws1's log (they are the rollout's raw ops): observe the kernels
        try:
            cand_side.kernels = tuple(observed_cuda_kernels(cand_fwd))
        except Exception as exc:  # noqa: BLE001 - the row still times; the error says why no kernel is named
            cand_side.error = f"kernels not observed: {one_line(exc)}"
    rows = [
        _fill(
            _row(p, "fwd", cand, case, peer, opts.profile),
            cand_side,
            _time_forward(timer, opts.device, "peer", peer_fwd),
        )
    ]
    rows[0].path = "step" if ops is not None else "candidate"
    if p.m in H.HOST_MS and rows[0].status == "ok":
        rows[0].host = {
            "candidate": H.measure(opts.device, cand_fwd),
            "peer": H.measure(opts.device, peer_fwd),
        }
    if differentiable:
        main_grad = cand.param_grad_rule == "sample_blocks_main_grad"
        bwd_cand = _time_backward(
            timer,
            opts.device,
            "candidate",
            lambda t: case.candidate(cand.fn, t, ctx, p),
            inputs,
            case,
            main_grad,
            gen,
        )
        bwd_peer = _time_backward(
            timer, opts.device, "peer", lambda t: case.stock(t, p), inputs, case, False, gen
        )
        bwd = _fill(_row(p, "bwd", cand, case, peer, opts.profile), bwd_cand, bwd_peer)
        if main_grad and case.stock_main_grad is not None:
            stock_mg = case.stock_main_grad
            side = _time_backward(
                timer, opts.device, "peer_main_grad", lambda t: stock_mg(t, p), inputs, case, True, gen
            )
            # its own record: an error here leaves the row's verdict (against the plain peer) standing
            bwd.peer_main_grad = R.SecondPeer(peer=C.MAIN_GRAD_PEER, ms=side.ms, error=side.error)
        rows.append(bwd)
    return rows


# ---------------------------------------------------------------------------------------------- the run


def _num(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _progress(out: TextIO | None, i: int, n: int, row: dict[str, Any]) -> None:
    if out is None:
        return
    head = f"ws1 bench [{i}/{n}] {row['op']} {row['shape']}"
    if row["m"] is not None:
        head += f" M={row['m']} {row['phase']}"
    pm = row.get("peak_mem_bytes") if row.get("step") else None
    mem = f"; peak cand {_gib(pm.get('candidate'))}, peer {_gib(pm.get('peer'))}" if pm else ""
    if row["status"] in ("unavailable", "skipped"):
        line = f"{head}: {row['status']}: {row['reason']}"
    elif row["status"] == "error":
        line = f"{head}: error: " + "; ".join(f"{k}: {v}" for k, v in row["errors"].items())
        if row["candidate_ms"] is not None and row["peer_ms"] is not None:  # a step row failing a path check
            line += f" (cand {_num(row['candidate_ms'], 4)} ms, peer {_num(row['peer_ms'], 4)} ms{mem})"
    else:
        verdict = {True: "met", False: "MISSED", None: "-"}[row["target_met"]]
        tgt = f" [{row['target']['text']}: {verdict}]" if row["target"] else ""
        line = (
            f"{head}: cand {_num(row['candidate_ms'], 4)} ms, peer {_num(row['peer_ms'], 4)} ms, "
            f"ratio {_num(row['ratio'], 3)}{tgt}{mem}"
        )
    print(line, file=out, flush=True)


def _gib(x: int | None) -> str:
    return "-" if x is None else f"{x / 2**30:.2f} GiB"


def _device_info(device: str, prov: Any) -> dict[str, Any]:
    import platform

    if device == prov.device:
        return {
            "type": device,
            "name": prov.device_name,
            "capability": prov.capability,
            "driver": prov.driver,
        }
    return {
        "type": device,
        "name": platform.processor() or platform.machine(),
        "capability": None,
        "driver": None,
    }


def collect(
    opts: Options,
    argv: Sequence[str],
    *,
    timer: Timer | None = None,
    progress: TextIO | None = None,
    plan: Plan | None = None,
) -> dict[str, Any]:
    """Run the bench and return the document (nothing written). `timer` replaces the device timer (tests)."""
    from ws1_harness.verdict.provenance import collect_provenance

    plan = plan or make_plan(opts)
    timer = timer or make_timer(opts.device, opts.warmup_ms, opts.rep_ms)
    prov = collect_provenance(["ws1", *argv])
    copy_mib = opts.copy_mib or (CUDA_COPY_MIB if opts.device == "cuda" else CPU_COPY_MIB)
    mm_n = opts.mm_n or (CUDA_MM_N if opts.device == "cuda" else CPU_MM_N)
    ceilings = measure_ceilings(opts.device, timer, int(copy_mib * 2**20), mm_n)
    if progress is not None:
        copy, mm = ceilings["copy"], ceilings["mm"]
        print(
            f"ws1 bench: ceilings copy {copy.get('GB_s') or copy.get('error')} GB/s, "
            f"mm {mm.get('TFLOP_s') or mm.get('error')} TFLOP/s ({timer.name})",
            file=progress,
            flush=True,
        )
    copy_gbs = ceilings["copy"].get("GB_s")
    rows: list[dict[str, Any]] = []
    for op in plan.ops:
        try:
            cand, why = _resolve(opts, op)
        except Exception as exc:  # noqa: BLE001 - e.g. a device query on a poisoned CUDA context
            cand, why = None, None
            row = R.Row(op, "-", None, "-", "error", candidate_id=f"{opts.profile}.{op}")
            row.errors = {"resolve": one_line(exc)}
            rows.append(row.to_json(copy_gbs))
            _progress(progress, len(rows), plan.total_rows, rows[-1])
            continue
        if cand is None:
            row = R.Row(op, "-", None, "-", "unavailable", candidate_id=f"{opts.profile}.{op}", reason=why)
            rows.append(row.to_json(copy_gbs))
            _progress(progress, len(rows), plan.total_rows, rows[-1])
            continue
        for p in plan.points[op]:
            for row in bench_point(opts, timer, cand, p, plan.differentiable[op]):
                rows.append(row.to_json(copy_gbs))
                _progress(progress, len(rows), plan.total_rows, rows[-1])
    if plan.steps:
        from ws1_workload import load_manifest

        def note(line: str) -> None:
            if progress is not None:
                print(line, file=progress, flush=True)

        model_cfg = load_manifest(None).model(opts.model)
        for step_row in ST.run_steps(opts, timer, plan.steps, model_cfg, note):
            rows.append(step_row.to_json(copy_gbs))
            _progress(progress, len(rows), plan.total_rows, rows[-1])
    RL.annotate(rows, ceilings)
    for r in T.link_references(rows):
        if progress is not None:
            ref = r["reference"]
            against = (
                "no ok reference row in this run"
                if ref is None
                else f"{ref['op']} {ref['candidate_ms']:.4f} ms"
            )
            verdict = {True: "met", False: "MISSED", None: "-"}[r["target_met"]]
            print(f"ws1 bench: {r['op']} {r['phase']} M={r['m']} against {against}: {verdict}", file=progress)
    return {
        "kind": R.KIND,
        "schema_version": R.SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "ws1 " + " ".join(shlex.quote(portable_path(a)) for a in argv),
        "profile": opts.profile,
        "model": opts.model,
        "device": _device_info(opts.device, prov),
        "timer": {
            "name": timer.name,
            "statistic": "median",
            "warmup_ms": opts.warmup_ms,
            "rep_ms": opts.rep_ms,
            "l2": l2_policy(timer),
        },
        "method": METHOD,
        "options": {
            "ops": list(plan.ops),
            "shapes": list(opts.shapes) if opts.shapes else None,
            "m": list(opts.ms) if opts.ms else None,
            "attn_seq": opts.attn_seq,
            "candidates": opts.candidates,
            "steps": (
                {
                    "ops": list(dict.fromkeys(p.op for p in plan.steps)),
                    "layers": plan.steps[0].layers,
                    "tokens": next((p.m for p in plan.steps if p.op == "train_step"), None),
                    "batches": [p.m for p in plan.steps if p.op == "decode_step"] or None,
                    "cache": next((p.cache for p in plan.steps if p.op == "decode_step"), None),
                    "stock_profile": ST.STOCK_PROFILE,
                }
                if plan.steps
                else None
            ),
        },
        "provenance": prov.to_json(),
        "ceilings": ceilings,
        "targets": T.table(opts.profile),
        "rows": rows,
        "counts": R.counts(rows),
    }


def run_cli(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """`ws1 bench`: validate, run, write `<out>/bench-<profile>-<device>.{json,md}`; exit 0 once written."""
    import json

    opts = options_from_args(args)
    plan = make_plan(opts)  # bad input exits 2 before anything is measured
    json_path, md_path = check_outputs(opts)
    doc = collect(opts, argv, plan=plan, progress=sys.stderr)
    R.validate(doc, str(json_path))
    R.write_atomic(json_path, json.dumps(doc, allow_nan=False, indent=1) + "\n")
    R.write_atomic(md_path, R.render_markdown(doc, json_path.name))
    c = doc["counts"]
    print(
        f"ws1 bench: {c['total']} rows ({c['ok']} ok, {c['error']} error, {c['unavailable']} unavailable, "
        f"{c['skipped']} skipped; targets {c['target_met']} met, {c['target_missed']} missed) -> {json_path} {md_path}"
    )
    return 0
