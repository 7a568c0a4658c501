"""The rollout engine's step path: a request's rows through ``integrations.step`` instead of ``forward_call``.

Why: ``forward_call`` is the judged path, and a decode step on it pays every candidate's per-call validation,
host tables and autograd bookkeeping, some 500 calls a step at 36 layers. ``StepRunner`` runs the same kernels
through the profile's raw step ops on a ``SlabCache`` allocated once, with one plan per step that every layer
reads, and replays a CUDA graph per bucket of rows where a step's rows all sample (decode). The engine then
samples and scores exactly as on the call path, so ``ws1 chain``'s parity judges the code a server runs.

Which steps replay a graph: a step whose every row samples a token (each request brings one row: a decode token,
or the last token of its prompt) and whose rows fit a bucket. The graph holds the bucket's rows; the rest are
pad rows in the slab's scratch slot, which the row-local kernels keep away from every real row. Prefill chunks
and mixed steps run the step eagerly, with only their sampling rows through the lm_head.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..errors import KernelInputError
from .qwen3 import runtime_of
from .step import GraphStep, SlabCache, StepPlan, StepWeights, plan_rows, step_forward, step_ops


class StepRunner:
    """One rollout's step path: the slab, the profile's step ops, and the graphs captured so far."""

    def __init__(
        self, model: nn.Module, *, slots: int, max_len: int, graph_buckets: Sequence[int] = ()
    ) -> None:
        rt = runtime_of(model)
        if rt.overrides:  # a planted candidate runs only on forward_call: the step path would bypass it
            raise KernelInputError(
                f"rollout step path: operators {sorted(rt.overrides)} were replaced after the swap; only the "
                "call path runs replaced candidates"
            )
        self.ops = step_ops(rt.profile)
        self.weights = StepWeights.of(model)
        w = self.weights
        self.device = w.embed.device
        buckets = sorted({int(b) for b in graph_buckets})
        if buckets and (self.device.type != "cuda" or buckets[0] < 1):
            raise KernelInputError(
                f"rollout step path: graph buckets {buckets} need positive sizes and a CUDA model "
                f"(the model is on {self.device})"
            )
        self.buckets = buckets
        self.cache = SlabCache.allocate(
            len(w.layers), slots, max_len, w.kv_heads, w.head_dim, device=self.device, dtype=w.embed.dtype
        )
        self.graphs: dict[int, GraphStep] = {}
        self.replays = 0  # steps served from a graph (a test and the chain's record read it)
        self.eager_steps = 0

    def join(self, request_id: int) -> None:
        self.cache.join(request_id)

    def leave(self, request_id: int) -> None:
        self.cache.leave(request_id)

    def _bucket(self, rows: int, head: Sequence[int]) -> int | None:
        if len(head) != rows or list(head) != list(range(rows)):
            return None  # a row that does not sample (a prefill chunk's inner rows): eager, lm_head on heads
        return next((b for b in self.buckets if b >= rows), None)

    def logits(
        self, token_ids: torch.Tensor, request_ids: Sequence[int], counts: Sequence[int], head: Sequence[int]
    ) -> torch.Tensor:
        """The logits ``[len(head), V]`` of the step's sampling rows (``head``: row indices, ascending).

        Request ``request_ids[i]`` brings ``counts[i]`` rows, in order; ``token_ids`` (int64, on the model's
        device) holds them all. The slab lengths advance (``plan_rows`` validates the step)."""
        rows = int(token_ids.shape[0])
        if sum(counts) != rows:
            raise KernelInputError(f"rollout step path: {rows} token ids for {sum(counts)} rows")
        bucket = self._bucket(rows, head)
        if bucket is not None:
            slots, positions = plan_rows(self.cache, list(request_ids), list(counts), pad_to=bucket)
            graph = self.graphs.get(bucket)
            if graph is None:
                graph = self.graphs[bucket] = GraphStep(self.ops, self.weights, self.cache, bucket)
            ids = torch.zeros(bucket, dtype=torch.int64, device=self.device)
            ids[:rows] = token_ids
            self.replays += 1
            return graph(ids, slots.to(self.device), positions.to(self.device))[:rows]
        slots, positions = plan_rows(self.cache, list(request_ids), list(counts))
        plan = StepPlan.from_device(slots.to(self.device), positions.to(self.device), self.cache.max_len)
        head_rows = None
        if list(head) != list(range(rows)):
            head_rows = torch.tensor(list(head), dtype=torch.int64).to(self.device)
        self.eager_steps += 1
        return step_forward(
            self.ops, self.weights, token_ids, plan, self.cache.k, self.cache.v, head_rows=head_rows
        )

    def logp(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The fp32 logprob of each row's token: the profile's logp kernel, as the call path's candidate."""
        return self.ops.logp(logits, tokens)
