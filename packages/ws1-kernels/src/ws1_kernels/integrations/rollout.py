"""A minimal rollout engine on a swapped model's candidates: what an inference server does, small enough to read.

- **Continuous batching**: requests wait until their ``arrival_step`` and a free slot (``max_running``), join
  between steps, and leave as soon as they have their tokens; every step is one physical call holding the
  running requests' rows.
- **Chunked prefill**: a prompt goes in chunks of at most ``chunk_size`` tokens, in the same call as other
  requests' decode tokens.
- **Decode** against a ``SlotKVCache`` (``kv_slots``, over the step path's ``SlabCache``): one slab per layer
  allocated once, a slot per running request (the lowest free one; given back when the request leaves), each
  call's rows written in place; each layer's attention reads a request's earlier keys as the candidate's
  ``kv_prefix``, a view of its slot.
- **Sampling** keyed by (request id, position): ``GumbelSampler`` draws the Gumbel noise of a row from a generator
  seeded by a hash of (seed, request id, position of the sampled token), so which other requests share the batch,
  and in which order, never changes a sampled token. ``device_sampler.DeviceGumbelSampler`` does the same on the
  logits' device, all rows at once (a counter-based hash of the key, no host loop).
- The selected-token logprob of every sampled token comes from the profile's ``logp`` candidate on the same
  logits, fp32 (what an RL trainer compares its own logprobs with).
- **Two paths** (``path``): ``"call"`` runs every step through ``forward_call`` and the candidates (any profile);
  ``"step"`` runs it through the profile's raw step ops on a slab (``step_runner.StepRunner``), replaying a CUDA
  graph per bucket of ``graph_buckets`` rows for the steps whose rows all sample. Same kernels, same bits: the
  chain's parity judges whichever path ran.

The request id is the ``sample_id`` of its rows. Only rows that sample a token go through the lm_head.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn

from ..context import LayoutContext
from ..errors import KernelInputError
from .kv_slots import SlotKVCache
from .qwen3 import KVCache, forward_call, logprobs, runtime_of
from .step_runner import StepRunner

PATHS = ("call", "step")


@dataclass(frozen=True)
class Request:
    """A prompt (int64 ``[P]``, ``P >= 1``) and how many tokens to generate, joining at ``arrival_step``."""

    request_id: int
    prompt: torch.Tensor
    max_new_tokens: int
    arrival_step: int = 0


@dataclass
class Completion:
    """``tokens`` = prompt then generated tokens; ``logprobs[i]`` is the fp32 logprob of generated token i."""

    request_id: int
    prompt_len: int
    tokens: list[int]
    logprobs: list[torch.Tensor] = field(default_factory=list)

    @property
    def logprob_tensor(self) -> torch.Tensor:
        return torch.stack(self.logprobs) if self.logprobs else torch.zeros(0)


@dataclass(frozen=True)
class StepRecord:
    """One engine step: ``(request id, first position, rows)`` per request in the call, in row order."""

    step: int
    rows: tuple[tuple[int, int, int], ...]
    joined: tuple[int, ...]
    left: tuple[int, ...]


class Sampler(Protocol):
    def sample(
        self, logits: torch.Tensor, request_ids: Sequence[int], positions: Sequence[int]
    ) -> torch.Tensor:
        """One token per row of ``logits [R, V]``; ``positions[r]`` is the position the sampled token takes."""
        ...


def _noise_seed(*parts: object) -> int:
    digest = hashlib.sha256("\x00".join(("ws1.sampler", *map(str, parts))).encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


class GumbelSampler:
    """Gumbel-max sampling, ``argmax(logits / temperature + g)``, ``g`` keyed by (seed, request id, position).

    Equivalent in distribution to softmax sampling; the noise of a row is a pure function of its key, so a
    token never depends on the batch around it (the logits must not either: that is what the gate judges).
    ``temperature == 0`` is greedy.
    """

    def __init__(self, seed: int, temperature: float = 1.0) -> None:
        if not temperature >= 0:
            raise KernelInputError(f"GumbelSampler: temperature must be >= 0, got {temperature!r}")
        self.seed = int(seed)
        self.temperature = float(temperature)

    def key(self, row: int, request_id: int, position: int) -> tuple[object, ...]:
        """What the noise of a row is keyed by (a test overrides it with the batch index to show the damage)."""
        return (self.seed, request_id, position)

    def noise(self, key: tuple[object, ...], vocab: int) -> torch.Tensor:
        gen = torch.Generator(device="cpu").manual_seed(_noise_seed(*key))
        u = torch.rand(vocab, generator=gen, dtype=torch.float64).clamp_(min=1e-300)
        return -torch.log(-torch.log(u))

    def sample(
        self, logits: torch.Tensor, request_ids: Sequence[int], positions: Sequence[int]
    ) -> torch.Tensor:
        x = logits.detach().to("cpu", torch.float64)
        out = torch.empty(x.shape[0], dtype=torch.int64)
        for r, (rid, pos) in enumerate(zip(request_ids, positions, strict=True)):
            if self.temperature == 0:
                out[r] = int(torch.argmax(x[r]))
            else:
                g = self.noise(self.key(r, rid, pos), x.shape[1])
                out[r] = int(torch.argmax(x[r] / self.temperature + g))
        return out


@dataclass
class _Running:
    req: Request
    fed: int = 0  # tokens of this request already through the model (its cache length)
    tokens: list[int] = field(default_factory=list)
    done: Completion | None = None


class Engine:
    """Continuous batching with chunked prefill and decode on a swapped model (inference only, no autograd)."""

    def __init__(
        self,
        model: nn.Module,
        sampler: Sampler,
        *,
        chunk_size: int,
        max_running: int | None = None,
        max_step_tokens: int | None = None,
        watch: Callable[[], contextlib.AbstractContextManager[object]] | None = None,
        path: str = "call",
        graph_buckets: Sequence[int] = (),
    ) -> None:
        """``watch`` (the harness's op watch) is entered around every model call, never around the sampler.
        ``path``: ``"call"`` or ``"step"`` (module doc); ``graph_buckets`` only with ``"step"`` on CUDA."""
        runtime_of(model)
        if path not in PATHS:
            raise KernelInputError(f"rollout.Engine: path must be one of {PATHS}, got {path!r}")
        if graph_buckets and path != "step":
            raise KernelInputError("rollout.Engine: graph_buckets need path='step'")
        if chunk_size < 1 or (max_running is not None and max_running < 1):
            raise KernelInputError("rollout.Engine: chunk_size and max_running must be >= 1")
        if max_step_tokens is not None and max_step_tokens < 1:
            raise KernelInputError("rollout.Engine: max_step_tokens must be >= 1")
        self.model = model
        self.sampler = sampler
        self.chunk_size = chunk_size
        self.max_running = max_running
        self.max_step_tokens = max_step_tokens
        self.watch = watch or contextlib.nullcontext
        self.path = path
        self.graph_buckets = tuple(graph_buckets)
        self.trace: list[StepRecord] = []
        self.cache: SlotKVCache | KVCache | None = None
        self.runner: StepRunner | None = None  # the last run's step path (path "step")
        #: called after every step with (step, running requests, finished requests): a caller's progress line
        self.on_step: Callable[[int, int, int], None] | None = None

    def _check(self, requests: Sequence[Request], vocab: int) -> None:
        seen: set[int] = set()
        for r in requests:
            where = f"rollout.Engine: request {r.request_id}"
            if r.request_id < 0 or r.request_id in seen:
                raise KernelInputError(f"{where}: request ids must be distinct and >= 0")
            seen.add(r.request_id)
            if r.prompt.dim() != 1 or r.prompt.dtype != torch.int64 or r.prompt.numel() < 1:
                raise KernelInputError(f"{where}: prompt must be 1-D int64 with at least one token")
            if int(r.prompt.min()) < 0 or int(r.prompt.max()) >= vocab:
                raise KernelInputError(f"{where}: prompt holds ids outside [0, {vocab})")
            if r.max_new_tokens < 1 or r.arrival_step < 0:
                raise KernelInputError(f"{where}: max_new_tokens must be >= 1 and arrival_step >= 0")

    def _sizes(self, requests: Sequence[Request]) -> tuple[int, int]:
        """(slots, max_len) of one ``run``'s cache: a slot per request that can run at once, each as long as the
        longest request (its prompt and every generated token but the last, which is never fed back)."""
        slots = min(len(requests), self.max_running or len(requests))
        longest = max(r.prompt.numel() + r.max_new_tokens - 1 for r in requests)
        return max(1, slots), max(1, longest)

    def make_cache(self, requests: Sequence[Request]) -> SlotKVCache | KVCache:
        """The call path's cache of one ``run`` (``_sizes``)."""
        slots, longest = self._sizes(requests)
        return SlotKVCache(len(self.model.model.layers), slots, longest)

    def run(self, requests: Sequence[Request]) -> dict[int, Completion]:
        """Serve every request to completion; returns the completions by request id."""
        vocab = int(self.model.lm_head.weight.shape[0])
        self._check(requests, vocab)
        device = self.model.lm_head.weight.device
        if not requests:
            return {}
        runner: StepRunner | None = None
        cache: SlotKVCache | KVCache | None = None
        if self.path == "step":
            slots, longest = self._sizes(requests)
            runner = StepRunner(self.model, slots=slots, max_len=longest, graph_buckets=self.graph_buckets)
        else:
            cache = self.make_cache(requests)
        self.cache, self.runner = cache, runner  # the last run's (slots and slabs), for a caller or a test
        waiting = sorted(requests, key=lambda r: (r.arrival_step, r.request_id))
        running: list[_Running] = []
        finished: dict[int, Completion] = {}
        step = 0
        self.trace = []
        with torch.no_grad():
            while waiting or running:
                joined = []
                while (
                    waiting
                    and waiting[0].arrival_step <= step
                    and (self.max_running is None or len(running) < self.max_running)
                ):
                    req = waiting.pop(0)
                    running.append(_Running(req, tokens=[int(t) for t in req.prompt.tolist()]))
                    joined.append(req.request_id)
                    if runner is not None:
                        runner.join(req.request_id)
                if not running:
                    step += 1
                    continue
                left = self._step(running, cache, runner, device, step, joined)
                for rid in left:
                    run = next(r for r in running if r.req.request_id == rid)
                    assert run.done is not None
                    finished[rid] = run.done
                    if runner is not None:
                        runner.leave(rid)
                    elif cache is not None:
                        cache.drop(rid)
                running = [r for r in running if r.req.request_id not in left]
                if self.on_step is not None:
                    self.on_step(step, len(running), len(finished))
                step += 1
        return finished

    def _step(
        self,
        running: list[_Running],
        cache: SlotKVCache | KVCache | None,
        runner: StepRunner | None,
        device: torch.device,
        step: int,
        joined: list[int],
    ) -> tuple[int, ...]:
        ids: list[int] = []
        sids: list[int] = []
        pos: list[int] = []
        head: list[int] = []
        heads_of: list[_Running] = []
        rows: list[tuple[int, int, int]] = []
        counts: list[int] = []
        budget = self.max_step_tokens
        for run in running:
            prompt_len = run.req.prompt.numel()
            # prefill: the next chunk of the prompt; decode: the last sampled token
            n = min(self.chunk_size, prompt_len - run.fed) if run.fed < prompt_len else 1
            if budget is not None:
                n = min(n, budget)
                if n == 0:
                    break
                budget -= n
            first = run.fed
            ids += run.tokens[first : first + n]
            sids += [run.req.request_id] * n
            pos += list(range(first, first + n))
            rows.append((run.req.request_id, first, n))
            counts.append(n)
            run.fed += n
            if run.fed >= prompt_len:  # the call's last row of this request samples the next token
                head.append(len(ids) - 1)
                heads_of.append(run)
        token_ids = torch.tensor(ids, dtype=torch.int64, device=device)
        left: list[int] = []
        hctx: LayoutContext | None = None
        with self.watch():
            if runner is not None:
                logits = runner.logits(token_ids, [r[0] for r in rows], counts, head)
            else:
                ctx = LayoutContext(
                    torch.tensor(sids, dtype=torch.int64), torch.tensor(pos, dtype=torch.int64)
                )
                head_rows = torch.tensor(head, dtype=torch.int64)
                logits, hctx = forward_call(self.model, token_ids, ctx, cache=cache, head_rows=head_rows)
        if head:
            new_pos = [pos[r] + 1 for r in head]
            tokens = self.sampler.sample(logits, [sids[r] for r in head], new_pos)
            chosen = tokens.tolist()  # one copy to the host, whatever device the sampler ran on
            with self.watch():
                if runner is not None:
                    lp = runner.logp(logits, tokens.to(logits.device))
                else:
                    assert hctx is not None
                    lp = logprobs(self.model, logits, tokens, hctx)
            lp = lp.detach().to("cpu")
            for i, run in enumerate(heads_of):
                run.tokens.append(int(chosen[i]))
                if run.done is None:
                    run.done = Completion(run.req.request_id, run.req.prompt.numel(), run.tokens)
                run.done.logprobs.append(lp[i])
                if len(run.tokens) - run.req.prompt.numel() >= run.req.max_new_tokens:
                    left.append(run.req.request_id)
        self.trace.append(StepRecord(step, tuple(rows), tuple(joined), tuple(left)))
        return tuple(left)
