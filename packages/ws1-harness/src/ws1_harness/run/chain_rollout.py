"""The rollout step of `ws1 chain`: the fixture's prompts through the rollout engine on a swapped model.

Requests join one step apart and one slot fewer than samples is open, so prefill chunks and decode steps of
different requests share steps, as a serving engine mixes them. The produced tokens and the logprobs the engine
recorded come back in the fixture's logical order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ws1_kernels.integrations import rollout
from ws1_kernels.integrations.device_sampler import DeviceGumbelSampler
from ws1_workload import Fixture, Sample


@dataclass
class RolloutRun:
    fixture: Fixture
    logprobs: torch.Tensor  # logical fp32: at (s, p) the logprob the engine recorded for token p + 1
    trace: list[rollout.StepRecord] = field(default_factory=list)
    path: str = "call"
    graph_buckets: tuple[int, ...] = ()
    graph_replays: int = 0  # steps replayed from a CUDA graph (step path)
    eager_steps: int = 0  # steps run eagerly on the step path


ROLLOUT_PATHS = ("auto", "call", "step")


def graph_buckets(fx: Fixture, device_type: str) -> tuple[int, ...]:
    """Powers of two up to the rollout's running requests (a decode step holds at most that many rows); none
    off CUDA, where no graph is captured."""
    if device_type != "cuda":
        return ()
    top, b, out = max_running(fx), 1, []
    while True:
        out.append(b)
        if b >= top:
            return tuple(out)
        b *= 2


def step_watch(rt: Any) -> Any:
    """The op watch of a rollout on the step path: the profile's step ops and glue, its declared kernels."""
    from ws1_harness.run.chain_watch import StepWatch
    from ws1_kernels.integrations.step import step_ops

    ops = step_ops(rt.profile)
    declared = frozenset().union(*(c.all_kernel_ids for c in rt.candidates.values()))
    return StepWatch(ops.namespaces, declared | ops.kernels)


def requests(fx: Fixture) -> list[rollout.Request]:
    """The fixture's prompts, one request per sample, joining one step apart (sample id = request id)."""
    return [
        rollout.Request(
            s.sample_id, s.token_ids[: s.prompt_len].clone(), s.length - s.prompt_len, s.sample_id
        )
        for s in fx.samples
    ]


def max_running(fx: Fixture) -> int:
    """One slot fewer than samples (at least one): the last request waits until another one leaves."""
    return max(1, fx.num_samples - 1)


def run_rollout(
    model: nn.Module,
    fx: Fixture,
    *,
    seed: int,
    chunk_size: int,
    tick: Callable[[Callable[[], str]], None],
    sampler: rollout.Sampler | None = None,
    watch: Callable[[], Any] | None = None,
    path: str = "call",
) -> RolloutRun:
    """Roll the fixture's prompts out; the produced fixture holds the sampled completions."""
    device_type = next(model.parameters()).device.type
    buckets = graph_buckets(fx, device_type) if path == "step" else ()
    engine = rollout.Engine(
        model,
        sampler or DeviceGumbelSampler(seed),  # on the logits' device, all rows at once, as a server samples
        chunk_size=chunk_size,
        max_running=max_running(fx),
        watch=watch,
        path=path,
        graph_buckets=buckets,
    )
    tier = fx.tier
    engine.on_step = lambda step, running, done: tick(
        lambda: f"{tier}: rollout step {step} ({running} running, {done}/{fx.num_samples} finished)"
    )
    done = engine.run(requests(fx))
    samples = []
    lps = torch.zeros(fx.total_tokens, dtype=torch.float32)
    for s in fx.samples:
        comp = done[s.sample_id]
        tokens = torch.tensor(comp.tokens, dtype=torch.int64)
        samples.append(Sample(s.sample_id, s.length, s.prompt_len, tokens, s.active.clone()))
        off = fx.offsets[s.sample_id]
        lps[off + s.prompt_len - 1 : off + s.length - 1] = comp.logprob_tensor
    produced = dataclasses.replace(fx, samples=tuple(samples))
    runner = engine.runner
    return RolloutRun(
        produced,
        lps,
        list(engine.trace),
        path,
        buckets,
        runner.replays if runner is not None else 0,
        runner.eager_steps if runner is not None else 0,
    )


def rollout_summary(ro: RolloutRun, chunk_size: int, max_running: int) -> dict[str, Any]:
    """What the evidence records of a rollout: its steps, who joined late, the mixed steps, the whole trace."""
    joined_late = sorted({rid for st in ro.trace for rid in st.joined if st.step > 0})
    return {
        "steps": len(ro.trace),
        "path": ro.path,
        "graph_buckets": list(ro.graph_buckets),
        "graph_replays": ro.graph_replays,
        "eager_steps": ro.eager_steps,
        "chunk_size": chunk_size,
        "max_running": max_running,
        "requests_joined_after_step_0": joined_late,
        "mixed_prefill_and_decode_steps": sum(
            1 for st in ro.trace if len({n > 1 for _rid, _p, n in st.rows}) > 1
        ),
        "trace": [
            {
                "step": st.step,
                "rows": [list(r) for r in st.rows],
                "joined": list(st.joined),
                "left": list(st.left),
            }
            for st in ro.trace
        ],
    }
