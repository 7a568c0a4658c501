"""`ws1 chain`: the whole model, rollout against trainer (docs/chain.md).

The matrix judges one operator at a time. What an RL user needs is the whole model: the selected-token logprobs a
rollout engine records (requests batched with others, prompts prefilled in chunks, completions decoded token by
token against a KV cache) must equal, bit for bit, the logprobs the trainer computes for the same tokens (packed
varlen teacher forcing, any micro-batch split, autograd on), and the trainer's gradients must be right and must
not depend on the layout. For each tier of the manifest this module

1. rolls the fixture's prompts out on a Qwen3 drop-in (ws1_kernels.integrations.qwen3) running the profile's
   candidates, sampling the completions (ws1_kernels.integrations.rollout);
2. trains on the produced tokens under every training layout of the manifest (teacher forcing, one backward per
   physical call, an upstream gradient per logical token);
3. judges parity (trainer vs rollout logprobs over the scored tokens: raw bits, with the contract's chain
   aggregates reported), gradient invariance (raw bits of every parameter gradient across layouts), the
   trainer's logprob accuracy and gradient accuracy against the one fp32 reference chain: the same drop-in on
   ws1_kernels.reference's operators with fp32 weights and TF32 off, run once forward and backward on the packed
   layout (the contract's chain aggregates of the logprob difference; its chain gradient thresholds, normwise per
   parameter; stock transformers' Qwen3 is the reference chain's own check, tests/ws1_kernels), and the op watch
   (every op on the path belongs to a candidate that declares it, or to the drop-in's glue);
4. when parity or gradient invariance fails, reruns the two sides with a per-node dump and names the first node,
   layer, phase and logical token where they part.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ws1_contract import load_contract
from ws1_harness.errors import HarnessError
from ws1_harness.run import chain_judge, chain_rollout, chain_train
from ws1_harness.run.chain_judge import gradient_figures, gradient_within
from ws1_harness.run.chain_rollout import RolloutRun
from ws1_harness.run.chain_train import TrainRun, on_host, release_device_memory
from ws1_harness.run.chain_watch import NodeDump, NodeWatch, StepWatch, first_difference, tapped
from ws1_harness.run.compare import tolerance_check
from ws1_harness.run.matrix import run_arch_label
from ws1_harness.verdict.chain_record import (
    ChainCell,
    ChainJudgment,
    ChainResult,
    gradient_thresholds_record,
    thresholds_record,
)
from ws1_harness.verdict.evidence import (
    Axes,
    EvidenceHeader,
    EvidenceWriter,
    WorkloadRef,
    check_outside_checkout,
)
from ws1_harness.verdict.gate import gate
from ws1_harness.verdict.provenance import portable_path
from ws1_kernels import registry
from ws1_kernels.integrations import qwen3, rollout
from ws1_workload import (
    Fixture,
    LayoutSpec,
    Manifest,
    ModelConfig,
    build_fixture,
    load_manifest,
    synthetic_weights,
    tensor_shapes,
)

DTYPE = "bf16"
#: what the chain's accuracy judgments compare with, for the record
REFERENCE_CHAIN = "the Qwen3 drop-in on ws1_kernels.reference (fp32 weights, TF32 off), forward and backward"
EXIT_PASS, EXIT_FAIL = 0, 1
UPSTREAM_NAME = chain_train.UPSTREAM_NAME


class ChainError(HarnessError):
    """Bad input to `ws1 chain` (unknown model or tier, layers out of range, an output that exists)."""


@dataclass(frozen=True)
class ChainSettings:
    """What one `ws1 chain` run judges. ``layers`` None: every layer of the model; ``tiers`` None: every tier."""

    profile: str
    model: str = "tiny"
    layers: int | None = None
    tiers: tuple[str, ...] | None = None
    seed: int = 0
    device: str | None = None
    manifest: str | None = None
    contract: str | None = None
    #: progress lines on stderr (phase, tier, layout, elapsed seconds), so a long full-width run is never silent
    progress: bool = True
    #: the rollout engine's path: "call" (forward_call), "step" (the step path, CUDA graphs on a GPU) or
    #: "auto" (step where the profile has step ops and runs on CUDA, else call)
    rollout_path: str = "auto"


def resolve_path(asked: str, profile: str, device_type: str, *, stock: bool) -> str:
    """The rollout path of a run: ``call`` or ``step``. ``auto`` takes the step path where a server would: on a
    GPU, for a profile with step ops (``ChainError`` for a ``step`` that cannot run)."""
    from ws1_kernels.integrations.step import has_step_ops

    if asked not in chain_rollout.ROLLOUT_PATHS:
        raise ChainError(
            f"ws1 chain: --rollout-path must be one of {chain_rollout.ROLLOUT_PATHS}, got {asked!r}"
        )
    if asked == "call":
        return "call"
    why = has_step_ops(profile) or ("a stock profile runs the call path only" if stock else None)
    if asked == "auto":
        return "step" if why is None and device_type == "cuda" else "call"
    if why is not None:
        raise ChainError(f"ws1 chain: --rollout-path step: {why}")
    return "step"


class Progress:
    """``ws1 chain [  12.3s] <what>`` lines on stderr; ``tick`` prints at most one line every ``every`` seconds
    (the rollout's steps), ``line`` always."""

    def __init__(self, enabled: bool = True, every: float = 10.0, prefix: str = "ws1 chain") -> None:
        self.enabled = enabled
        self.every = every
        self.prefix = prefix
        self.start = time.perf_counter()
        self._last = -math.inf

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def line(self, what: str) -> None:
        if self.enabled:
            print(f"{self.prefix} [{self.elapsed():7.1f}s] {what}", file=sys.stderr, flush=True)
            self._last = time.perf_counter()

    def tick(self, what: Callable[[], str]) -> None:
        if self.enabled and time.perf_counter() - self._last >= self.every:
            self.line(what())


def _transformers_needed() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ChainError("ws1 chain: needs transformers (pip install 'ws1-kernels[transformers]')") from None


class Chain:
    """The model, weights, thresholds and fixtures of one run; builds the swapped models and judges tiers."""

    def __init__(self, settings: ChainSettings, *, weights: dict[str, torch.Tensor] | None = None) -> None:
        """``weights``: the synthetic weights of this model and layer count, already generated (another run of
        the same process, e.g. calibration over several profiles), instead of generating them again."""
        _transformers_needed()
        self.settings = settings
        self.manifest: Manifest = load_manifest(settings.manifest)
        self.contract = load_contract(settings.contract)
        full = self.manifest.model(settings.model)
        layers = full.num_layers if settings.layers is None else settings.layers
        if not 1 <= layers <= full.num_layers:
            raise ChainError(
                f"ws1 chain: --layers {layers}: model {full.name!r} has 1..{full.num_layers} layers"
            )
        self.cfg: ModelConfig = dataclasses.replace(full, num_layers=layers)
        self.tiers = settings.tiers or self.manifest.tiers
        for tier in self.tiers:
            self.manifest.samples(tier)  # an unknown tier is bad input before any work
        registry.candidates(settings.profile)  # an unknown profile likewise
        self.device = settings.device or registry.preferred_device(settings.profile, "attention")
        if torch.device(self.device).type == "cuda" and not torch.cuda.is_available():
            # say who asked for CUDA: `--device cuda` on a CPU profile once read "the profile runs on CUDA"
            who = "--device cuda:" if settings.device else f"profile {settings.profile!r} runs on CUDA, and"
            raise ChainError(f"ws1 chain: {who} no CUDA device is visible")
        qwen3.Runtime.resolve(
            settings.profile, self.device
        )  # every chain node has a candidate here, or exit 2
        self.stock = any(c.stock for c in registry.candidates(settings.profile).values())
        # the evidence's profile label: `<profile>@<arch>` on a GPU, as `ws1 matrix` labels it, so a chain shard
        # and the same profile's matrix shards merge under one label
        arch = run_arch_label(settings.profile, ("attention",), torch.device(self.device).type)
        self.profile_label = settings.profile if arch is None else f"{settings.profile}@{arch}"
        self.thresholds = self.contract.aggregates(DTYPE)
        self.training = tuple(s for s in self.manifest.layouts if s.kind == "training")
        if not self.training or self.training[0].type != "packed":
            raise ChainError("ws1 chain: the manifest's first training layout must be the packed one")
        self.rollout_path = resolve_path(
            settings.rollout_path, settings.profile, torch.device(self.device).type, stock=self.stock
        )
        chunked = [s for s in self.manifest.layouts if s.type == "chunked"]
        self.chunk_size = int(chunked[0].params["chunk_size"]) if chunked else 8
        self.progress = Progress(settings.progress)
        self.progress.line(
            f"{self.profile_label} {settings.model} L{layers} on {self.device}: generating the synthetic weights"
        )
        names = tensor_shapes(self.cfg)
        if weights is not None and sorted(weights) != sorted(names):
            raise ChainError("ws1 chain: the weights given are not those of the model and layers asked for")
        self.weights = (
            weights if weights is not None else synthetic_weights(self.manifest, settings.model, names=names)
        )
        # one copy on the device, shared by every cell's model and the fp32 reference chain (the weights are
        # never written: a build only wraps them in parameters)
        self.device_weights = {k: v.to(self.device) for k, v in self.weights.items()}
        self.hf_config = qwen3.qwen3_config(self.cfg)
        n = sum(v.numel() for v in self.weights.values())
        self.progress.line(f"weights ready ({n / 1e9:.2f} G parameters)")

    def device_record(self) -> dict[str, Any]:
        """Where the model ran, as a matrix cell records it (the gate checks it against the provenance)."""
        dev = torch.device(self.device)
        if dev.type == "cuda":
            major, minor = torch.cuda.get_device_capability(dev)
            return {
                "type": "cuda",
                "name": torch.cuda.get_device_name(dev),
                "capability": f"sm_{major}{minor}",
            }
        return {"type": dev.type, "name": dev.type, "capability": None}

    def settings_json(self) -> dict[str, Any]:
        return {
            "seed": self.settings.seed,
            "tiers": list(self.tiers),
            "training_layouts": [s.name for s in self.training],
            "chunk_size": self.chunk_size,
            "rollout_path": self.rollout_path,
            "sampler": "gumbel-max, noise keyed by (seed, request id, position)",
            "upstream_gradient": f"logical_tensor(case_id, {UPSTREAM_NAME!r}) on scored tokens",
        }

    # ------------------------------------------------------------------------------------------ models

    def model(self) -> nn.Module:
        """A fresh swapped bf16 model of the profile (one per cell: a test may plant a candidate in it)."""
        return qwen3.build_model(
            self.hf_config, self.device_weights, self.settings.profile, device=self.device
        )

    def reference_model(self) -> nn.Module:
        """The same drop-in on ws1_kernels.reference, fp32 weights, TF32 off: the gold side of the gradients.

        Built afresh on each call and not kept: at 36 layers its fp32 weights are 33 GB, as large as a layout's
        gradients, and holding it across tiers would not leave room for two layouts' gradients beside it."""
        return qwen3.build_model(
            self.hf_config, self.device_weights, qwen3.REFERENCE_PROFILE, device=self.device
        )

    def op_class(self, operator: str) -> str:
        oc = self.manifest.operators[operator].op_class
        if oc is None:
            raise ChainError(f"ws1 chain: operator {operator!r} has no op class in the manifest")
        return oc

    # ------------------------------------------------------------------------------------------ running

    # ------------------------------------------------------------------------------------------ the steps

    def run_rollout(
        self,
        model: nn.Module,
        fx: Fixture,
        *,
        sampler: rollout.Sampler | None = None,
        watch: Callable[[], Any] | None = None,
        path: str | None = None,
    ) -> RolloutRun:
        """The rollout step (chain_rollout) with this run's seed, chunk size, progress and (unless ``path``
        says otherwise) rollout path."""
        return chain_rollout.run_rollout(
            model,
            fx,
            seed=self.settings.seed,
            chunk_size=self.chunk_size,
            tick=self.progress.tick,
            sampler=sampler,
            watch=watch,
            path=path or self.rollout_path,
        )

    def upstream(self, fx: Fixture, case: str | None = None) -> torch.Tensor:
        return chain_train.upstream(fx, case)

    def train(
        self,
        model: nn.Module,
        fx: Fixture,
        spec: LayoutSpec,
        upstream: torch.Tensor,
        *,
        watch: Callable[[], Any] | None = None,
        grads_on_host: bool = False,
    ) -> TrainRun:
        """The training step (chain_train) on this run's device."""
        return chain_train.train(
            model, fx, spec, upstream, device=self.device, watch=watch, grads_on_host=grads_on_host
        )

    def aggregates(
        self, left: torch.Tensor, right: torch.Tensor, fx: Fixture, *, bitwise: bool = True
    ) -> dict[str, Any]:
        """The judging step (chain_judge.aggregates) under this run's thresholds."""
        return chain_judge.aggregates(left, right, fx, self.thresholds, bitwise=bitwise)

    def thresholds_json(self) -> dict[str, Any]:
        return thresholds_record(self.thresholds)

    def cell(
        self,
        tier: str,
        *,
        model: nn.Module | None = None,
        sampler: rollout.Sampler | None = None,
    ) -> ChainCell:
        """Roll out, train under every layout, judge, and localise the first failure of one tier."""
        say = self.progress.line
        fx0 = build_fixture(self.manifest, tier, self.settings.model)
        model = model or self.model()
        rt = qwen3.runtime_of(model)
        watch = NodeWatch(rt)
        step_watch: StepWatch | None = None
        # a replaced candidate (a planted fault) runs on the call path only: the step path would bypass it
        path = "call" if rt.overrides else self.rollout_path
        say(f"{tier}: rollout of {fx0.num_samples} requests on the {path} path (op watch on)")
        if path == "step":  # no candidate call to attribute ops to: the step's own watch
            step_watch = chain_rollout.step_watch(rt)
            ro = self.run_rollout(model, fx0, sampler=sampler, watch=step_watch.watching, path=path)
        else:
            with tapped(rt, watch):
                ro = self.run_rollout(model, fx0, sampler=sampler, watch=watch.watching, path=path)
        say(f"{tier}: rollout done, {len(ro.trace)} steps")
        fx = ro.fixture
        upstream = self.upstream(fx)
        judgments: list[ChainJudgment] = []

        say(f"{tier}: training layout {self.training[0].name} (op watch on)")
        with tapped(rt, watch):
            packed = self.train(model, fx, self.training[0], upstream, watch=watch.watching)
        # the packed layout's gradients wait on the host: each layout below is compared with them one parameter at
        # a time, so one layout's gradients (36 layers: 33 GB of fp32) are on the device at once, not two
        packed = on_host(packed)
        parity_rows = {packed.layout: self.aggregates(packed.logprobs, ro.logprobs, fx)}
        invariance: dict[str, Any] = {}
        inv_failed: list[str] = []
        for spec in self.training[1:]:
            say(f"{tier}: training layout {spec.name}")
            run = self.train(model, fx, spec, upstream)
            parity_rows[spec.name] = self.aggregates(run.logprobs, ro.logprobs, fx)
            bits = chain_train.grad_invariance(packed, run)
            del run  # a layout's gradients are as large as the model: keep the packed layout's only
            invariance[spec.name] = {"bits_equal": bits}
            if not bits or not all(bits.values()):
                inv_failed.append(spec.name)
        parity_ok = all(r["passed"] for r in parity_rows.values())
        judgments.append(
            ChainJudgment(
                "parity",
                parity_ok,
                detail={"mode": "bitwise", "thresholds": self.thresholds_json(), "layouts": parity_rows},
            )
        )

        say(f"{tier}: fp32 reference chain (the drop-in on ws1_kernels.reference), forward and backward")
        qwen3.drop_param_grads(model)  # room for the fp32 model (36 layers: 33 GB)
        release_device_memory()
        # its gradients go to the host as the backward produces them (chain_train.HostGrads)
        ref_run = self.train(self.reference_model(), fx, self.training[0], upstream, grads_on_host=True)
        release_device_memory()  # the reference model is dropped: its fp32 weights go before the figures
        grad_detail, grad_failed = chain_judge.grad_accuracy(
            qwen3.param_operators(model), packed, ref_run, self.thresholds, device=self.device
        )
        ref_lp = ref_run.logprobs.float().to("cpu")
        del ref_run
        release_device_memory()

        acc = self.aggregates(packed.logprobs, ref_lp, fx, bitwise=False)
        op_spec = self.contract.resolve("forward_accuracy", self.op_class("logp"), DTYPE)
        keys = [k for k, m in zip(fx.logical_keys, fx.scored.tolist(), strict=True) if m]
        op_rule = tolerance_check(packed.logprobs[fx.scored], ref_lp[fx.scored], op_spec, keys)
        judgments.append(
            ChainJudgment(
                "logprob_accuracy",
                acc["passed"],
                detail={
                    "reference": REFERENCE_CHAIN,
                    "rule": "contract chain aggregates of d = trainer(packed) - fp32 reference",
                    "thresholds": self.thresholds_json(),
                    **acc,
                    "logprob_op_class_rule": {
                        "judged": False,
                        "why": "bounds the logp operator alone on identical bf16 logits; a chain adds every "
                        "node's rounding",
                        **op_rule.to_json(),
                    },
                },
            )
        )
        judgments.append(
            ChainJudgment(
                "gradient_invariance", not inv_failed, detail={"mode": "bitwise", "layouts": invariance}
            )
        )
        judgments.append(
            ChainJudgment(
                "gradient_accuracy",
                not grad_failed,
                detail={
                    "reference": REFERENCE_CHAIN,
                    "rule": "per parameter gradient g of the packed layout against g_ref: "
                    "norm2(g - g_ref) / norm2(g_ref) <= grad_rel_l2 and "
                    "max(abs(g - g_ref)) / max(abs(g_ref)) <= grad_rel_max_abs",
                    "thresholds": self.gradient_thresholds_json(),
                    "failed": grad_failed[:8],
                    "n_failed": len(grad_failed),
                    "parameters": grad_detail,
                },
            )
        )

        problems = watch.problems() + (step_watch.problems() if step_watch is not None else [])
        judgments.append(
            ChainJudgment(
                "op_watch",
                not problems,
                judged=not self.stock,
                detail={
                    "rollout_path": ro.path,
                    "step_kernels_seen": sorted(step_watch.kernels) if step_watch is not None else None,
                    "nodes_watched": len(watch.sites),
                    "problems": [p.to_json() for p in problems],
                    "overrides": dict(rt.overrides),
                },
            )
        )

        cell = ChainCell(
            profile=self.profile_label,
            model=self.settings.model,
            layers=self.cfg.num_layers,
            tier=tier,
            case_id=fx.case_id,
            active_tokens=int(fx.scored.sum()),
            judgments=tuple(judgments),
            rollout=chain_rollout.rollout_summary(ro, self.chunk_size, chain_rollout.max_running(fx)),
            dtype=DTYPE,
            device=self.device_record(),
            stock=self.stock,
            settings=self.settings_json(),
        )
        if cell.failed:
            say(f"{tier}: {', '.join(cell.failed)} failed; localising the first divergence")
            divergence = self.localise(cell.failed[0], model, fx0, ro, inv_failed, upstream, sampler)
            cell = dataclasses.replace(cell, first_divergence=divergence)
        say(f"{tier}: {cell.status}")
        return cell

    def gradient_thresholds_json(self) -> dict[str, Any]:
        return gradient_thresholds_record(self.thresholds)

    # ------------------------------------------------------------------------------------------ localising

    def localise(
        self,
        failed: str,
        model: nn.Module,
        fx0: Fixture,
        ro: RolloutRun,
        inv_failed: Sequence[str],
        upstream: torch.Tensor,
        sampler: rollout.Sampler | None,
    ) -> dict[str, Any]:
        """Rerun the two sides of the first failed judgment with a per-node dump; the first node that parts."""
        fx = ro.fixture
        rt = qwen3.runtime_of(model)
        packed_spec = self.training[0]

        def dump_train(m: nn.Module, spec: LayoutSpec) -> tuple[NodeDump, TrainRun]:
            d = NodeDump()
            with tapped(qwen3.runtime_of(m), d):
                run = self.train(m, fx, spec, upstream)
            return d, run

        out: dict[str, Any] = {"judgment": failed}
        if failed == "parity":
            left = NodeDump()
            with tapped(rt, left):  # the node dump needs candidate calls: the call path
                again = self.run_rollout(model, fx0, sampler=sampler, path="call")
            right, _ = dump_train(model, packed_spec)
            out.update(left="rollout", right=f"trainer:{packed_spec.name}")
            if not torch.equal(again.fixture.token_ids, fx.token_ids):
                out["note"] = (
                    "the rollout is not deterministic: a rerun sampled other tokens"
                    if ro.path == "call"
                    else "the rollout ran on the step path and was localised on the call path, which sampled "
                    "other tokens: the step path gives other bits than the call path"
                )
            diff = first_difference(left, right)
        elif failed == "gradient_invariance":
            spec = next(s for s in self.training if s.name == inv_failed[0])
            left, _ = dump_train(model, spec)
            right, _ = dump_train(model, packed_spec)
            out.update(left=f"trainer:{spec.name}", right=f"trainer:{packed_spec.name}")
            diff = first_difference(left, right, phases=("forward", "backward"))
        elif failed in ("logprob_accuracy", "gradient_accuracy"):
            # Every bf16 node carries the rounding of all nodes before it, so comparing node outputs with the
            # fp32 reference would blame the first node where the accumulated error crosses an op-class bound,
            # not the node that is wrong. Each operator's own accuracy is the matrix's forward_accuracy cell.
            return {
                **out,
                "node": None,
                "note": "accuracy is judged on the whole chain; `ws1 matrix` judges each operator's own accuracy",
            }
        else:  # op_watch: the watch itself names the node
            return {**out, "node": None, "note": "the op_watch judgment names each node and its ops"}
        if diff is None:
            out.update(
                node=None, note="every node output and output gradient agrees; see the judgment detail"
            )
        else:
            out.update(diff.to_json())
        return out


def run_chain(
    settings: ChainSettings | Chain, on_cell: Callable[[ChainCell], None] | None = None
) -> ChainResult:
    """Every tier of one run (the evidence writer adds the provenance when the cells are written).

    `on_cell` sees each tier's cell as soon as it is judged: `run_cli` writes it to the partial file at once,
    so an interrupted run keeps the tiers it finished (it once lost them all)."""
    chain = settings if isinstance(settings, Chain) else Chain(settings)
    settings = chain.settings
    cells = []
    for tier in chain.tiers:
        cell = chain.cell(tier)
        cells.append(cell)
        if on_cell is not None:
            on_cell(cell)
    m = chain.manifest
    return ChainResult(
        profile=chain.profile_label,
        model=settings.model,
        layers=chain.cfg.num_layers,
        dtype=DTYPE,
        device=chain.device,
        stock=chain.stock,
        settings=chain.settings_json(),
        workload={"workload_id": m.workload_id, "revision": m.revision, "fingerprint": m.fingerprint},
        contract={"contract_id": chain.contract.contract_id, "fingerprint": chain.contract.fingerprint},
        cells=cells,
    )


def output_path(out: Path, profile_label: str, model: str, layers: int) -> Path:
    """`chain-<profile>[.<arch>]-<model>-L<layers>.json` (file names stay within letters, digits, '.', '_', '-')."""
    return out / f"chain-{profile_label.replace('@', '.')}-{model}-L{layers}.json"


def write_result(
    result: ChainResult,
    path: Path,
    *,
    force: bool = False,
    allow_in_checkout: bool = False,
    argv: Sequence[str] | None = None,
) -> Path:
    """Write the cells into a ws1 evidence file (docs/evidence.md: `chain_cells`, provenance collected by the
    writer, cells digests), the format `ws1 merge` and `ws1 gate` read; never over an existing file unless
    ``force``. The matrix axes stay empty: a chain file adds no matrix cell to any merge it joins."""
    if not allow_in_checkout:
        check_outside_checkout(path)
    if path.exists() and not force:
        raise ChainError(f"ws1 chain: {path} exists (pass --force to replace it)")
    header = _chain_header(result.workload, result.contract, argv)
    with EvidenceWriter(path, header, allow_in_checkout=allow_in_checkout, argv=argv, force=force) as writer:
        for cell in result.cells:
            writer.write_chain_cell(cell.to_json())
        return writer.finalise()


def _chain_header(
    workload: dict[str, Any], contract: dict[str, Any], argv: Sequence[str] | None
) -> EvidenceHeader:
    """The evidence header of a chain file: no matrix axes (a chain file adds no matrix cell to a merge)."""
    return EvidenceHeader(
        workload=WorkloadRef(workload["workload_id"], workload["fingerprint"], workload["revision"]),
        contract_fingerprint=contract["fingerprint"],
        command=" ".join(shlex.quote(portable_path(a)) for a in (argv or ["ws1", "chain"])),
        axes=Axes.build([], [], [], [], {}),
    )


def summary_lines(result: ChainResult, path: Path) -> list[str]:
    lines = []
    for c in result.cells:
        parity = next(j for j in c.judgments if j.name == "parity")
        worst = max((r.get("max_abs_dlogp") or 0.0 for r in parity.detail["layouts"].values()), default=0.0)
        line = f"ws1 chain: {c.profile} {c.model} L{c.layers} {c.tier}: {c.status} (max |dlogp| {worst:.3g})"
        if c.failed:
            line += f"; failed: {', '.join(c.failed)}"
        if c.first_divergence and c.first_divergence.get("node"):
            d = c.first_divergence
            line += f"; first divergence: {d['node']} ({d['phase']}) at token {tuple(d['token'])}"
        lines.append(line)
    lines.append(f"ws1 chain: {result.verdict} -> {path}")
    return lines


def run_cli(args: Any, argv: Sequence[str]) -> int:
    """`ws1 chain` after argument parsing: run, write, print one line per cell; 0 pass, 1 fail."""
    from ws1_harness.console import emit

    out = Path(args.out)
    settings = ChainSettings(
        profile=args.profile,
        model=args.model,
        layers=args.layers,
        tiers=tuple(args.tier) if args.tier else None,
        seed=args.seed,
        device=args.device,
        manifest=args.manifest,
        contract=args.contract,
        rollout_path=args.rollout_path,
    )
    chain = Chain(settings)  # validates model, layers, tiers and profile before any work
    path = output_path(out, chain.profile_label, settings.model, chain.cfg.num_layers)
    if path.exists() and not args.force:
        raise ChainError(f"ws1 chain: {path} exists (pass --force to replace it)")
    if not args.allow_in_checkout:
        check_outside_checkout(path)
    m = chain.manifest
    header = _chain_header(
        {"workload_id": m.workload_id, "revision": m.revision, "fingerprint": m.fingerprint},
        {"fingerprint": chain.contract.fingerprint},
        ["ws1", *argv],
    )
    # each tier's cell goes to the partial file as soon as it is judged (an interrupt keeps them there)
    writer = EvidenceWriter(
        path, header, allow_in_checkout=args.allow_in_checkout, argv=["ws1", *argv], force=args.force
    )
    try:
        result = run_chain(chain, on_cell=lambda cell: writer.write_chain_cell(cell.to_json()))
        path = writer.finalise()
    except KeyboardInterrupt:
        print(
            f"ws1 chain: interrupted; the tiers judged so far are kept in {writer.partial_path}",
            file=sys.stderr,
        )
        raise
    finally:
        writer.close()
    verdict = gate(path)  # the judgment `ws1 gate FILE` makes, re-derived from what was written
    q = shlex.quote(str(path))
    emit("\n".join([*summary_lines(result, path), verdict.lines[0], f"next: ws1 gate {q}; ws1 report {q}"]))
    return EXIT_PASS if result.verdict == "pass" and verdict.passed else EXIT_FAIL


__all__ = [
    "Chain",
    "ChainError",
    "ChainSettings",
    "RolloutRun",
    "TrainRun",
    "gradient_figures",
    "gradient_within",
    "on_host",
    "output_path",
    "release_device_memory",
    "run_chain",
    "run_cli",
    "write_result",
]
