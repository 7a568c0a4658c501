"""`ws1 bench --op train_step / --op decode_step`: the whole model, a profile's drop-in against the stock model.

The operator rows say how fast each candidate is alone; what a user pays is a whole step. These rows build the
manifest's model at its widths (the first `--layers` layers) twice in one process on one set of weights: once
swapped onto the profile's candidates (`ws1_kernels.integrations.qwen3`) and once onto `native_torch`, the stock
model (cuBLAS through `F.linear`, SDPA, eager norms and `log_softmax`), and time one step of each:

- `train_step`: one training forward and backward of `--tokens` packed tokens (several varlen samples in one
  call, their `(sample_id, position)` in the candidates' `LayoutContext`): `forward_call`, the selected-token
  logprob, and `backward` with a fixed upstream gradient per token; parameter gradients accumulate where each
  candidate's rule puts them (`main_grad` or `grad`), as in gradient accumulation over micro-batches.
- `decode_step`: one decode step of the rollout engine at batch B (`--batch`): B requests, one new token each,
  every request's `--cache` earlier keys in the engine's `SlotKVCache`; what `rollout.Engine` does in a step (build
  the call's context and token ids, `forward_call` with the cache, the `logp` candidate on the sampled rows)
  without the sampler, the same on both sides. Each timed call rewinds the cache to the same length first
  (`SlotKVCache.rewind_all`), so every call decodes the same position.

Weights are random bf16 drawn on the device from a torch generator seeded with `WEIGHT_SEED` (the pinned
synthetic weights take minutes to generate at full width on a host, and values do not change a step's work);
the KV cache is random bf16 too. The record says so.

What ran is observed, not declared: each side's first call runs under the harness's op watch
(`chain_watch.NodeWatch`) and the launch log, and the row records the kernel ids of both sides. A candidate
path that left a stock op between the candidates, recorded a stock kernel (one that a `stock` candidate of the
registry declares), ran exactly the peer's kernels, or missed an operator's kernel makes the row an `error` row
(`errors.candidate_path`), with both times still recorded but no target judged: such a row measures something
other than the profile. The peer is checked the same way (`errors.peer_path`): every node must run a `stock`
candidate and record its kernel.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ws1_harness.run.bench import records as R
from ws1_harness.run.bench import shapes as S
from ws1_harness.run.bench import targets as T
from ws1_harness.run.bench.cases import GBS, TFLOPS
from ws1_harness.run.bench.timing import Timer, one_line, synchronize

#: The bench ops of this module, in report order (named with --op; never part of the default operator list).
STEP_OPS: tuple[str, ...] = ("train_step", "decode_step")
#: The stock model every step is compared with.
STOCK_PROFILE = "native_torch"
DEFAULT_LAYERS = 4
DEFAULT_TOKENS = 8192
DEFAULT_BATCHES: tuple[int, ...] = S.DEFAULT_DECODE_M
# 2048 earlier tokens per request: the RL loop's decode target is set there, and at batch 256 over 36 layers
# a cache of 4096 (the attention_decode rows' length) would need 154 GB per side, more than an H200 holds
DEFAULT_CACHE = 2048
# Packed samples of a training call: about one per 512 tokens, 2 to 8 of them, of varied lengths (the pattern,
# times T / samples; the last sample takes the rest), so attention sees several causal blocks of unequal size.
MIN_SAMPLES, MAX_SAMPLES, TOKENS_PER_SAMPLE = 2, 8, 512
LENGTH_PATTERN: tuple[float, ...] = (1.5, 0.5, 1.25, 0.75)
# A whole step takes 10-1000 ms: the timer's rep window is widened to at least this many timed calls.
STEP_MIN_REPS = 10
WEIGHT_SEED = 0
WEIGHTS_NOTE = (
    f"random bf16 drawn on the device from torch.Generator(seed={WEIGHT_SEED}) (matrices N(0, 1/fan_in), "
    "embedding N(0, 1), norm weights 1 + 0.1 N(0, 1)); the pinned synthetic weights are not used: values do "
    "not change the work of a step"
)
STEP_METHOD = (
    "one process, one device, one set of weights shared by two models of the manifest's widths: the profile's "
    "drop-in (ws1_kernels.integrations.qwen3) and the stock model (the drop-in on native_torch). train_step: "
    "forward_call + logp + backward of one packed varlen call (fixed upstream gradient per token), parameter "
    "gradients accumulating where each candidate's rule puts them; decode_step: the rollout engine's step "
    "without the sampler (context and token ids built, forward_call against a SlotKVCache of the given length, logp "
    "on every row), each call from the same cache. The timer's window is widened to at least "
    f"{STEP_MIN_REPS} timed calls. peak_mem_bytes: torch.cuda.max_memory_allocated() after a reset, over one "
    "step (absolute: the shared weights, the side's gradient buffers and, for decode, the cache included; the "
    "other side's gradients freed first). What ran is observed: the op watch and the launch log of each side's "
    "first call"
)


def _fail(msg: str) -> R.BenchInputError:
    return R.BenchInputError(f"ws1 bench: {msg}")


# ---------------------------------------------------------------------------------------------- points


@dataclass(frozen=True)
class StepPoint:
    """One step row: `m` is the tokens of the training call or the decode batch."""

    op: str
    m: int
    layers: int
    lengths: tuple[int, ...] = ()  # train_step: the packed samples' lengths (sum = m)
    cache: int = 0  # decode_step: earlier tokens of every request

    @property
    def phase(self) -> str:
        return "fwd+bwd" if self.op == "train_step" else "fwd"


def sample_lengths(tokens: int) -> tuple[int, ...]:
    """The varlen samples of a `tokens`-token training call (see LENGTH_PATTERN); every length >= 1."""
    n = min(tokens, max(MIN_SAMPLES, min(MAX_SAMPLES, tokens // TOKENS_PER_SAMPLE)))
    base = tokens // n
    head = [max(1, int(LENGTH_PATTERN[i % len(LENGTH_PATTERN)] * base)) for i in range(n - 1)]
    out = (*head, tokens - sum(head))
    assert min(out) >= 1 and sum(out) == tokens, out
    return out


def plan_points(
    step_ops: Sequence[str],
    model: Any,
    *,
    layers: int | None,
    tokens: int | None,
    cache: int | None,
    batches: Sequence[int] | None,
) -> list[StepPoint]:
    """Validate the step options against the model config (BenchInputError, one line) and list the rows.

    An option of an op that was not asked for is bad input (it would be silently unused).
    """
    num_layers = int(model.num_layers)
    for flag, value, users in (
        ("--layers", layers, STEP_OPS),
        ("--tokens", tokens, ("train_step",)),
        ("--cache", cache, ("decode_step",)),
        ("--batch", batches, ("decode_step",)),
    ):
        if value is not None and not any(op in step_ops for op in users):
            raise _fail(f"{flag} applies to --op {' / --op '.join(users)} only")
    n_layers = min(DEFAULT_LAYERS, num_layers) if layers is None else layers
    if not 1 <= n_layers <= num_layers:
        raise _fail(f"--layers {n_layers}: model {model.name!r} has 1..{num_layers} layers")
    if tokens is not None and tokens < 1:
        raise _fail(f"--tokens must be >= 1, got {tokens}")
    if cache is not None and cache < 1:
        raise _fail(f"--cache must be >= 1, got {cache}")
    if batches and min(batches) < 1:
        raise _fail(f"--batch must be >= 1, got {min(batches)}")
    if batches and len(set(batches)) != len(batches):
        raise _fail("--batch given twice for the same value")
    out: list[StepPoint] = []
    for op in STEP_OPS:
        if op not in step_ops:
            continue
        if op == "train_step":
            t = DEFAULT_TOKENS if tokens is None else tokens
            out.append(StepPoint(op, t, n_layers, lengths=sample_lengths(t)))
        else:
            for b in batches or DEFAULT_BATCHES:
                out.append(StepPoint(op, b, n_layers, cache=DEFAULT_CACHE if cache is None else cache))
    return out


def check_runnable() -> None:
    """The step rows build transformers' Qwen3 (the drop-in's extra): bad input when it is not installed."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        raise _fail(
            "--op train_step / decode_step build transformers' Qwen3, which this install lacks "
            '(pip install "ws1-kernels[transformers]")'
        )


def resolve_reason(profile: str, device: str) -> str | None:
    """None when every chain node of `profile` has a candidate on `device`, else why not (one line)."""
    from ws1_kernels.errors import RegistryError
    from ws1_kernels.integrations import qwen3

    try:
        qwen3.Runtime.resolve(profile, device)
    except RegistryError as exc:
        return one_line(exc).split(": ", 1)[-1]
    return None


# ---------------------------------------------------------------------------------------------- work


def _dims(cfg: Any, p: StepPoint) -> dict[str, Any]:
    d: dict[str, Any] = {
        "layers": p.layers,
        "hidden": int(cfg.hidden),
        "intermediate": int(cfg.intermediate),
        "Hq": int(cfg.num_heads),
        "Hkv": int(cfg.num_kv_heads),
        "D": int(cfg.head_dim),
        "V": int(cfg.vocab),
    }
    if p.op == "train_step":
        d.update(tokens=p.m, samples=len(p.lengths))
    else:
        d.update(batch=p.m, cache=p.cache)
    return d


def _layer_params(cfg: Any) -> int:
    """Weights of one layer's GEMMs (q, k, v, o, gate, up, down)."""
    h, q, kv = (
        int(cfg.hidden),
        int(cfg.num_heads) * int(cfg.head_dim),
        int(cfg.num_kv_heads) * int(cfg.head_dim),
    )
    return h * q + 2 * h * kv + q * h + 3 * h * int(cfg.intermediate)


def step_work(cfg: Any, p: StepPoint) -> tuple[str, float]:
    """(metric, work) of one step, the same for both sides.

    train_step: FLOPs of the GEMMs (2 x tokens x weights forward, twice that backward: dx and dW) and of
    attention (4 x causal pairs x Hq x D forward per layer, 2.5x that backward), as the operator rows count them.
    decode_step: bytes every decode step must read at least: each GEMM weight once (bf16) and every request's
    cached keys and values (the cache copy of the engine's append is not counted: it is the engine's choice).
    """
    gemm = p.layers * _layer_params(cfg) + int(cfg.vocab) * int(cfg.hidden)
    hq_d = int(cfg.num_heads) * int(cfg.head_dim)
    if p.op == "train_step":
        pairs = sum(n * (n + 1) // 2 for n in p.lengths)
        fwd_gemm = 2.0 * p.m * gemm
        fwd_attn = 4.0 * pairs * hq_d * p.layers
        return TFLOPS, 3.0 * fwd_gemm + 3.5 * fwd_attn
    kv = 2.0 * p.layers * p.m * p.cache * int(cfg.num_kv_heads) * int(cfg.head_dim) * 2
    return GBS, 2.0 * gemm + kv


# ---------------------------------------------------------------------------------------------- models


def random_weights(cfg: Any, device: torch.device) -> dict[str, torch.Tensor]:
    """Every weight of the model (HF names), random bf16 on `device` from one seeded generator (WEIGHTS_NOTE)."""
    from ws1_workload import tensor_shapes

    gen = torch.Generator(device=device).manual_seed(WEIGHT_SEED)
    out: dict[str, torch.Tensor] = {}
    for name, shape in tensor_shapes(cfg).items():
        t = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
        if len(shape) == 1:
            t.mul_(0.1).add_(1.0)
        elif "embed_tokens" not in name:
            t.mul_(shape[1] ** -0.5)
        out[name] = t
    return out


@dataclass
class Models:
    """The profile's drop-in and the stock model on the same weight tensors (parameters share storage).

    ``stock()`` is transformers' own Qwen3 with SDPA on those tensors too, built on first use: the graph decode
    pair's peer (``decode_graph``)."""

    cfg: Any
    candidate: torch.nn.Module
    peer: torch.nn.Module
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    hf_config: Any = None
    device: str = "cpu"
    _stock: dict[str, torch.nn.Module] = field(default_factory=dict)

    def stock(self, attn: str = "sdpa") -> torch.nn.Module:
        """transformers' Qwen3 with attention ``attn`` (``bench.stock``) on the shared weights, built once."""
        from ws1_harness.run.bench import stock

        if attn not in self._stock:
            self._stock[attn] = stock.stock_model(self.hf_config, self.weights, self.device, attn=attn)
        return self._stock[attn]


def build_models(profile: str, model_cfg: Any, layers: int, device: str) -> Models:
    from ws1_kernels.integrations import qwen3

    cfg = dataclasses.replace(model_cfg, num_layers=layers)
    weights = random_weights(cfg, torch.device(device))
    hf = qwen3.qwen3_config(cfg)
    cand = qwen3.build_model(hf, weights, profile, device=device)
    peer = qwen3.build_model(hf, weights, STOCK_PROFILE, device=device)
    return Models(cfg, cand, peer, weights, hf, device)


def graph_decode(profile: str, device: str) -> bool:
    """Whether `decode_step` times the graph pair (`decode_graph`): on CUDA, for a profile with step ops. Else
    (a CPU profile) the drop-in against the drop-in on stock ops, the only decode path such a profile has."""
    from ws1_kernels.integrations.step import has_step_ops

    return torch.device(device).type == "cuda" and has_step_ops(profile) is None


def _drop_grads(model: torch.nn.Module) -> None:
    for p in model.parameters():
        p.grad = None
        if hasattr(p, "main_grad"):
            del p.main_grad


# ---------------------------------------------------------------------------------------------- one side

Enter = Callable[[], contextlib.AbstractContextManager[Any]]


@dataclass
class StepSide:
    ms: float | None = None
    peak: int | None = None  # max_memory_allocated over one step (CUDA)
    base: int | None = None  # memory_allocated before it
    kernels: tuple[str, ...] = ()
    watch: list[str] = field(default_factory=list)
    error: str | None = None


def _probe(device: str, fn: Callable[[], Any]) -> tuple[int | None, int | None, float]:
    """One call: (base bytes, peak bytes) on CUDA, and its wall time in ms (the timer's window estimate)."""
    synchronize(device)
    base = None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = int(torch.cuda.memory_allocated())
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    ms = (time.perf_counter() - t0) * 1e3
    peak = int(torch.cuda.max_memory_allocated()) if device == "cuda" else None
    return base, peak, ms


def widened(timer: Timer, est_ms: float) -> Timer:
    """`timer` with its rep window widened to at least STEP_MIN_REPS calls of `est_ms` (a test timer as is)."""
    rep = getattr(timer, "rep_ms", None)
    if rep is None:
        return timer
    out = copy.copy(timer)
    out.rep_ms = max(float(rep), STEP_MIN_REPS * est_ms)  # type: ignore[attr-defined]
    return out


def _watch_lines(problems: Sequence[Any]) -> list[str]:
    return [f"{p.node}: {p.what}" + (f" ({', '.join(p.items)})" if p.items else "") for p in problems]


def measure_side(
    device: str,
    timer: Timer,
    label: str,
    model: torch.nn.Module,
    call: Callable[[Enter], Any],
    prepare: Callable[[], None],
) -> StepSide:
    """A first call under the op watch, a second under the launch log and the peak-memory window (the kernels
    and the timer's estimate), then the timer; an exception is recorded."""
    from ws1_harness.run.chain_watch import NodeWatch, tapped
    from ws1_kernels import launches
    from ws1_kernels.integrations import qwen3

    side = StepSide()
    try:
        rt = qwen3.runtime_of(model)
        prepare()
        watch = NodeWatch(rt)
        with tapped(rt, watch):
            call(watch.watching)
        side.watch = _watch_lines(watch.problems())
        prepare()
        # the launch log is opened here, not around the watched call: the watch opens one per node, and
        # launches.observe() removes its log from the stack by equality, so two equal nested logs would clash
        with launches.observe() as log:
            side.base, side.peak, est = _probe(device, lambda: call(contextlib.nullcontext))
        side.kernels = tuple(dict.fromkeys(log.kernels))
        side.ms = widened(timer, est)(lambda: call(contextlib.nullcontext), label=label)
    except Exception as exc:  # noqa: BLE001 - recorded as an error row, never a crash
        side.error = one_line(exc)
    return side


def _conclude(row: R.Row, cand: StepSide, peer: StepSide, cand_path: list[str], peer_path: list[str]) -> None:
    """A step row's times, kernels, peak memory and errors from its two measured sides and path checks: any
    error (a side that failed, a path that is not what the row claims) makes it an error row."""
    row.candidate_ms, row.peer_ms = cand.ms, peer.ms
    row.kernels_observed = list(cand.kernels)
    if cand.peak is not None or peer.peak is not None:
        row.peak_mem_bytes = {"candidate": cand.peak, "peer": peer.peak}
    errors = {k: v for k, v in (("candidate", cand.error), ("peer", peer.error)) if v}
    if cand_path:
        errors["candidate_path"] = "; ".join(cand_path)
    if peer_path:
        errors["peer_path"] = "; ".join(peer_path)
    row.errors = errors
    if errors:
        row.status = "error"


def _new_row(profile: str, models: Models, p: StepPoint, cand_rt: Any, peer: str) -> R.Row:
    """A step row before anything is measured: its dims, work, target and peer."""
    dims = _dims(models.cfg, p)
    metric, work = step_work(models.cfg, p)
    return R.Row(
        op=p.op,
        shape="model",
        m=p.m,
        phase=p.phase,
        status="ok",
        dims=dims,
        candidate_id=f"{profile}.{p.op}",
        param_grad_rule=cand_rt.rules.get("det_gemm"),
        peer=peer,
        metric=metric,
        work=work,
        target=T.target_for(p.op, p.phase, p.m, dims, profile),
    )


def measure_graph_side(device: str, timer: Timer, label: str, side: Any, watch: Any | None) -> StepSide:
    """A graph side of the decode pair: the first call (its capture) under ``watch`` (the step path's op watch,
    for the ws1 side) or the launch log, then the peak-memory window and the timer on replays."""
    from ws1_kernels import launches

    out = StepSide()
    try:
        if watch is not None:
            with watch.watching():
                side.call()
            out.kernels = tuple(sorted(watch.kernels))
            out.watch = _watch_lines(watch.problems())
        else:
            with launches.observe() as log:
                side.call()
            out.kernels = tuple(dict.fromkeys(log.kernels))
        out.base, out.peak, est = _probe(device, side.call)
        out.ms = widened(timer, est)(side.call, label=label)
    except Exception as exc:  # noqa: BLE001 - recorded as an error row, never a crash
        out.error = one_line(exc)
    return out


def graph_candidate_problems(cand: StepSide, watch: Any, stock_ids: frozenset[str]) -> list[str]:
    """Why the ws1 graph side is not the profile's step path (empty: it is): the step watch's findings, a stock
    kernel recorded, or no op of the profile's step ops dispatched at all."""
    out = list(cand.watch)
    hit = sorted(set(cand.kernels) & stock_ids)
    if hit:
        out.append(f"stock kernels recorded: {', '.join(hit)}")
    ops = set().union(*watch.recorder.ops.values()) if watch.recorder.ops else set()
    if not any(watch.is_step_op(op) for op in ops):
        out.append(f"no step op of {'/'.join(watch.namespaces)} dispatched")
    return out


def graph_peer_problems(stock: torch.nn.Module, record: dict[str, Any]) -> list[str]:
    """Why the peer is not the stock model a user would run (empty: it is)."""
    out = []
    if hasattr(stock, "ws1_runtime"):
        out.append("the peer model is swapped onto ws1 candidates")
    impl = getattr(stock.config, "_attn_implementation", None)
    if impl != "sdpa":
        out.append(f"the peer's attention is {impl!r}, not sdpa")
    if record.get("cache") != "StaticCache":
        out.append(f"the peer's cache is {record.get('cache')!r}, not StaticCache")
    if not str(record.get("mode", "")).startswith("cuda_graph"):
        out.append(f"the peer ran {record.get('mode')!r}, not a CUDA graph")
    return out


def peer_variants() -> tuple[str, ...]:
    """The stock decode configurations timed: transformers' default; SDPA without cuDNN's backend
    (`decode_graph.sdpa_without_cudnn`); and SDPA's own grouped-query attention where this transformers has the
    switch (`decode_graph.FORCE_GQA_ENV`)."""
    from ws1_harness.run.bench import decode_graph as dg

    gqa = ("sdpa_gqa",) if dg.forced_gqa_supported() else ()
    return ("default", "sdpa_no_cudnn", *gqa)


def faster_peer(sides: dict[str, StepSide]) -> str:
    """The variant the row is judged against: the fastest that ran, else the default (its error is the row's).

    Why the fastest: the ratio must be against the stock a user would keep, never a slower configuration of it."""
    ran = {k: v.ms for k, v in sides.items() if not v.error and v.ms is not None}
    return min(ran, key=lambda k: ran[k]) if ran else "default"


def measure_graph_decode(
    profile: str, device: str, timer: Timer, models: Models, p: StepPoint, stock_ids: frozenset[str]
) -> R.Row:
    """A decode row on the graph pair (`decode_graph`): ws1's step path against stock transformers."""
    from ws1_harness.run.bench import decode_graph as dg
    from ws1_harness.run.chain_rollout import step_watch
    from ws1_kernels.integrations import qwen3

    cand_rt = qwen3.runtime_of(models.candidate)
    row = _new_row(profile, models, p, cand_rt, dg.PEER)
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(WEIGHT_SEED + 2)
    targets = torch.randint(0, int(models.cfg.vocab), (p.m,), generator=gen, device=dev)
    graphs = dev.type == "cuda"
    records: dict[str, Any] = {}
    sides: dict[str, StepSide] = {}
    watch = step_watch(cand_rt)
    try:
        cand_side = dg.ws1_side(models.candidate, p.m, p.cache, targets, graphs=graphs)
        records["candidate"] = cand_side.record
        sides["candidate"] = measure_graph_side(device, timer, "candidate", cand_side, watch)
        del cand_side  # its slab and graph pool go before the peer's are made
        synchronize(device)
        if graphs:
            torch.cuda.empty_cache()
        stock = models.stock()
        for variant in peer_variants():
            peer_side = dg.stock_side(
                stock,
                p.m,
                p.cache,
                targets,
                graphs=graphs,
                force_gqa=variant == "sdpa_gqa",
                no_cudnn=variant == "sdpa_no_cudnn",
            )
            records[f"peer.{variant}"] = peer_side.record
            sides[f"peer.{variant}"] = measure_graph_side(device, timer, f"peer.{variant}", peer_side, None)
            del peer_side
            synchronize(device)
            if graphs:
                torch.cuda.empty_cache()
    except Exception as exc:  # noqa: BLE001 - e.g. out of memory for a cache
        row.status, row.errors = "error", {"setup": one_line(exc)}
        row.step = _step_record(p, sides.get("candidate"), sides.get("peer.default"), [], [], graph=records)
        return row
    chosen = faster_peer({k.split(".", 1)[1]: v for k, v in sides.items() if k.startswith("peer.")})
    records["peer"] = {**records[f"peer.{chosen}"], "chosen": chosen, "variants_ms": {
        k.split(".", 1)[1]: (v.ms if not v.error else v.error) for k, v in sides.items() if k.startswith("peer.")
    }}  # fmt: skip
    cand, peer = sides["candidate"], sides[f"peer.{chosen}"]
    cand_path = graph_candidate_problems(cand, watch, stock_ids) if not cand.error else []
    peer_path = graph_peer_problems(models.stock(), records["peer"]) if not peer.error else []
    _conclude(row, cand, peer, cand_path, peer_path)
    row.step = _step_record(p, cand, peer, cand_path, peer_path, graph=records)
    return row


# ---------------------------------------------------------------------------------------------- path checks


def stock_kernel_ids() -> frozenset[str]:
    """Every kernel id a `stock` candidate of any registered profile declares."""
    from ws1_kernels import registry

    out: set[str] = set()
    for prof in registry.profiles():
        for c in registry.candidates(prof).values():
            if c.stock:
                out |= c.all_kernel_ids
    return frozenset(out)


def _missing_kernels(rt: Any, kernels: Sequence[str]) -> list[str]:
    seen = set(kernels)
    return sorted(op for op, c in rt.candidates.items() if not (c.all_kernel_ids & seen))


def candidate_path_problems(rt: Any, cand: StepSide, peer: StepSide, stock_ids: frozenset[str]) -> list[str]:
    """Why the candidate side is not the profile's own path (empty: it is), from what was observed."""
    out = list(cand.watch)
    stock = sorted(op for op, c in rt.candidates.items() if c.stock)
    if stock:
        out.append(f"stock candidates in the profile: {', '.join(stock)}")
    hit = sorted(set(cand.kernels) & stock_ids)
    if hit:
        out.append(f"stock kernels recorded: {', '.join(hit)}")
    missing = _missing_kernels(rt, cand.kernels)
    if missing:
        out.append(f"no kernel of the candidate recorded for: {', '.join(missing)}")
    if cand.kernels and set(cand.kernels) == set(peer.kernels):
        out.append("the candidate path recorded exactly the stock peer's kernels")
    return out


def peer_path_problems(rt: Any, peer: StepSide) -> list[str]:
    """Why the peer side is not the stock model (empty: it is). The op watch of a stock profile is recorded,
    not judged (its ops are torch's per-device choice)."""
    out = []
    not_stock = sorted(op for op, c in rt.candidates.items() if not c.stock)
    if not_stock:
        out.append(f"peer profile {rt.profile!r} is not stock for: {', '.join(not_stock)}")
    allowed = frozenset().union(*(c.all_kernel_ids for c in rt.candidates.values()))
    foreign = sorted(set(peer.kernels) - allowed)
    if foreign:
        out.append(f"kernels outside the peer's candidates: {', '.join(foreign)}")
    missing = _missing_kernels(rt, peer.kernels)
    if missing:
        out.append(f"no kernel recorded for: {', '.join(missing)}")
    return out


# ---------------------------------------------------------------------------------------------- one row


def _train_calls(
    models: Models, p: StepPoint, device: torch.device
) -> Iterator[tuple[str, torch.nn.Module, Callable[[Enter], Any], Callable[[], None]]]:
    from ws1_kernels import LayoutContext
    from ws1_kernels.integrations import qwen3

    gen = torch.Generator(device=device).manual_seed(WEIGHT_SEED + 1)
    vocab = int(models.cfg.vocab)
    ids = torch.randint(0, vocab, (p.m,), generator=gen, device=device)
    targets = torch.randint(0, vocab, (p.m,), generator=gen, device=device)
    upstream = torch.randn(p.m, generator=gen, device=device, dtype=torch.float32)
    lengths = torch.tensor(p.lengths, dtype=torch.int64)
    sample_ids = torch.repeat_interleave(torch.arange(len(p.lengths)), lengths)
    starts = torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
    ctx = LayoutContext(sample_ids, torch.arange(p.m) - starts)

    for label, model in (("candidate", models.candidate), ("peer", models.peer)):

        def call(enter: Enter, model: torch.nn.Module = model) -> None:
            with enter():
                logits, hctx = qwen3.forward_call(model, ids, ctx)
                lp = qwen3.logprobs(model, logits, targets, hctx)
                torch.autograd.backward(lp, upstream)

        def prepare(model: torch.nn.Module = model) -> None:
            _drop_grads(models.candidate)
            _drop_grads(models.peer)
            qwen3.zero_param_grads(model)

        yield label, model, call, prepare


def _decode_calls(
    models: Models, p: StepPoint, device: torch.device
) -> Iterator[tuple[str, torch.nn.Module, Callable[[Enter], Any], Callable[[], None]]]:
    from ws1_kernels import LayoutContext
    from ws1_kernels.integrations import qwen3
    from ws1_kernels.integrations.kv_slots import SlotKVCache

    cfg = models.cfg
    gen = torch.Generator(device=device).manual_seed(WEIGHT_SEED + 2)
    b, c, hkv, d = p.m, p.cache, int(cfg.num_kv_heads), int(cfg.head_dim)
    # the engine's cache (kv_slots.SlotKVCache): a slot per request holding c earlier tokens, filled once; each
    # timed call appends one token in place and is rewound after, so every call decodes the same position
    cache = SlotKVCache(p.layers, b, c + 1)
    fill = LayoutContext(torch.arange(b).repeat_interleave(c), torch.arange(c).repeat(b))
    for layer in range(p.layers):
        k = torch.randn((b * c, hkv, d), generator=gen, device=device, dtype=torch.bfloat16)
        v = torch.randn((b * c, hkv, d), generator=gen, device=device, dtype=torch.bfloat16)
        cache.append(layer, fill, k, v)
    vocab = int(cfg.vocab)
    ids = torch.randint(0, vocab, (b,), generator=torch.Generator().manual_seed(WEIGHT_SEED + 3)).tolist()
    targets = torch.randint(0, vocab, (b,), generator=gen, device=device)
    sids, pos, head = list(range(b)), [c] * b, list(range(b))

    for label, model in (("candidate", models.candidate), ("peer", models.peer)):

        def call(enter: Enter, model: torch.nn.Module = model) -> torch.Tensor:
            cache.rewind_all(c)
            ctx = LayoutContext(torch.tensor(sids, dtype=torch.int64), torch.tensor(pos, dtype=torch.int64))
            token_ids = torch.tensor(ids, dtype=torch.int64, device=device)
            head_rows = torch.tensor(head, dtype=torch.int64)
            with torch.no_grad(), enter():
                logits, hctx = qwen3.forward_call(model, token_ids, ctx, cache=cache, head_rows=head_rows)
                return qwen3.logprobs(model, logits, targets, hctx)

        def prepare() -> None:
            _drop_grads(models.candidate)
            _drop_grads(models.peer)

        yield label, model, call, prepare


#: the attention of the train_step peer on a GPU (`bench.stock.VARLEN`)
STOCK_TRAIN_ATTN = "ws1_stock_varlen"
#: the train_step peer on a GPU (`bench.stock`): transformers' Qwen3 on one packed row, torch's varlen flash
TRAIN_PEER = (
    "stock transformers Qwen3ForCausalLM on one packed row (every sample in it), attention by torch's varlen "
    "flash attention (torch.nn.attention.varlen) over each sample's bounds, log_softmax and gather, backward"
)


def _stock_train_call(
    models: Models, p: StepPoint, device: torch.device, attn: str
) -> tuple[torch.nn.Module, Callable[[], Any], Callable[[], None]]:
    """The stock packed training call on the same ids, targets and upstream gradient as the candidate's."""
    from ws1_harness.run.bench import stock

    model = models.stock(attn)
    gen = torch.Generator(device=device).manual_seed(WEIGHT_SEED + 1)
    vocab = int(models.cfg.vocab)
    ids = torch.randint(0, vocab, (p.m,), generator=gen, device=device)
    targets = torch.randint(0, vocab, (p.m,), generator=gen, device=device)
    upstream = torch.randn(p.m, generator=gen, device=device, dtype=torch.float32)
    kw = stock.packed_kwargs(p.lengths, device)

    def call() -> None:
        logits = model(input_ids=ids[None], **kw).logits[0]
        lp = torch.log_softmax(logits.float(), -1).gather(1, targets[:, None])[:, 0]
        torch.autograd.backward(lp, upstream)

    def prepare() -> None:
        _drop_grads(models.candidate)
        _drop_grads(models.peer)
        _drop_grads(model)

    return model, call, prepare


def measure_plain_side(
    device: str, timer: Timer, label: str, call: Callable[[], Any], prepare: Callable[[], None]
) -> tuple[StepSide, list[str]]:
    """A side with no ws1 runtime (the stock transformers model): the attention kernels of one call on the
    CUDA profiler (which backend ran), then the peak-memory window and the timer."""
    from ws1_harness.run.bench.stock import observed_cuda_kernels

    side, seen = StepSide(), []
    try:
        prepare()
        if device == "cuda":
            seen = observed_cuda_kernels(call, grad=True)
        prepare()
        side.base, side.peak, est = _probe(device, call)
        side.ms = widened(timer, est)(call, label=label)
    except Exception as exc:  # noqa: BLE001 - recorded as an error row, never a crash
        side.error = one_line(exc)
    return side, seen


def stock_train_problems(model: torch.nn.Module, attn: str, seen: list[str], device: str) -> list[str]:
    """Why the train_step peer is not the stock packed call a user would run (empty: it is)."""
    from ws1_harness.run.bench import stock

    out = []
    if hasattr(model, "ws1_runtime"):
        out.append("the peer model is swapped onto ws1 candidates")
    if attn != stock.VARLEN:
        out.append(f"the peer's attention is {attn!r}, not torch's varlen flash attention")
    if device == "cuda" and not any("flash" in k.lower() for k in seen):
        out.append("no flash attention kernel observed in the peer's call")
    return out


def measure_point(
    profile: str, device: str, timer: Timer, models: Models, p: StepPoint, stock_ids: frozenset[str],
    *, stock_train: str | None = None,
) -> R.Row:  # fmt: skip
    """One step row: both sides timed, their peak memory, what ran on each, the path checks. ``stock_train``
    (a `train_step` on a GPU): the peer is transformers' Qwen3 on the packed row with that attention
    implementation (``bench.stock``), not the drop-in on stock ops."""
    from ws1_kernels.integrations import qwen3

    cand_rt, peer_rt = qwen3.runtime_of(models.candidate), qwen3.runtime_of(models.peer)
    plain = stock_train is not None and p.op == "train_step"
    peer = (
        TRAIN_PEER
        if plain
        else f"the same model on {STOCK_PROFILE} (stock torch ops: F.linear, SDPA, F.rms_norm, log_softmax)"
    )
    row = _new_row(profile, models, p, cand_rt, peer)
    dev = torch.device(device)
    sides: dict[str, StepSide] = {}
    seen: list[str] = []
    try:
        calls = list((_train_calls if p.op == "train_step" else _decode_calls)(models, p, dev))
        stock_call = _stock_train_call(models, p, dev, stock_train) if plain and stock_train else None
    except Exception as exc:  # noqa: BLE001 - e.g. out of memory for the cache
        row.status, row.errors = "error", {"setup": one_line(exc)}
        row.step = _step_record(p, None, None, [], [])
        return row
    for label, model, call, prepare in calls:
        if label == "peer" and stock_call is not None:
            smodel, scall, sprepare = stock_call
            sides[label], seen = measure_plain_side(device, timer, label, scall, sprepare)
            _drop_grads(smodel)
            continue
        sides[label] = measure_side(device, timer, label, model, call, prepare)
        _drop_grads(model)
    del calls
    cand, peer = sides["candidate"], sides["peer"]
    cand_path = candidate_path_problems(cand_rt, cand, peer, stock_ids) if not cand.error else []
    if stock_call is not None and stock_train is not None:
        peer_path = stock_train_problems(stock_call[0], stock_train, seen, device) if not peer.error else []
    else:
        peer_path = peer_path_problems(peer_rt, peer) if not peer.error else []
    _conclude(row, cand, peer, cand_path, peer_path)
    row.step = _step_record(p, cand, peer, cand_path, peer_path)
    if stock_call is not None:
        row.step["peer_profile"] = "transformers (stock)"
        row.step["peer_attention"] = {"implementation": stock_train, "kernels": seen}
    return row


def _step_record(
    p: StepPoint,
    cand: StepSide | None,
    peer: StepSide | None,
    cand_path: list[str],
    peer_path: list[str],
    graph: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The step-only fields of a row (`row["step"]`); ``graph``: each side's record on the graph decode pair."""
    out: dict[str, Any] = {
        "layers": p.layers,
        "weights": WEIGHTS_NOTE,
        "peer_profile": "transformers (stock)" if graph is not None else STOCK_PROFILE,
        "min_reps": STEP_MIN_REPS,
    }
    if graph is not None:
        out["graph_decode"] = graph
    if p.op == "train_step":
        out["sample_lengths"] = list(p.lengths)
    else:
        out["cache"] = p.cache
    out["peer_kernels_observed"] = list(peer.kernels) if peer else []
    out["base_mem_bytes"] = {"candidate": cand.base if cand else None, "peer": peer.base if peer else None}
    out["op_watch"] = {"candidate": cand.watch if cand else [], "peer": peer.watch if peer else []}
    out["path_problems"] = {"candidate": cand_path, "peer": peer_path}
    return out


# ---------------------------------------------------------------------------------------------- the rows


def run_steps(
    opts: Any,
    timer: Timer,
    points: Sequence[StepPoint],
    model_cfg: Any,
    note: Callable[[str], None] | None = None,
) -> Iterator[R.Row]:
    """The step rows of a run, one per point (an `unavailable` row per step op when the profile cannot run)."""
    if not points:
        return
    why = resolve_reason(opts.profile, opts.device)
    if why is not None:
        for op in dict.fromkeys(p.op for p in points):
            yield R.Row(
                op, "model", None, "-", "unavailable", candidate_id=f"{opts.profile}.{op}", reason=why
            )
        return
    layers = points[0].layers
    if note is not None:
        note(
            f"ws1 bench: building {model_cfg.name} at {layers} layers twice ({opts.profile}, {STOCK_PROFILE}) "
            f"on one set of random bf16 weights on {opts.device}"
        )
    try:
        models = build_models(opts.profile, model_cfg, layers, opts.device)
    except Exception as exc:  # noqa: BLE001 - every row becomes an error row with the message
        for p in points:
            row = R.Row(p.op, "model", p.m, p.phase, "error", candidate_id=f"{opts.profile}.{p.op}")
            row.errors = {"setup": one_line(exc)}
            yield row
        return
    stock_ids = stock_kernel_ids()
    for p in points:
        if note is not None:
            what = f"{p.m} tokens" if p.op == "train_step" else f"batch {p.m}, cache {p.cache}"
            note(f"ws1 bench: {p.op} ({what}, {layers} layers): timing both sides")
        if p.op == "decode_step" and graph_decode(opts.profile, opts.device):
            yield measure_graph_decode(opts.profile, opts.device, timer, models, p, stock_ids)
        else:
            yield measure_point(
                opts.profile, opts.device, timer, models, p, stock_ids,
                stock_train=STOCK_TRAIN_ATTN if opts.device == "cuda" else None,
            )  # fmt: skip
        if opts.device == "cuda":
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
