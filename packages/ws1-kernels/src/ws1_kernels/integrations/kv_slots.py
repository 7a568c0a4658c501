"""The rollout engine's KV cache: ``qwen3.KVCache``'s interface over the slab of ``integrations.step.SlabCache``.

Why: ``qwen3.KVCache`` keeps one tensor per (layer, request) and concatenates every call's rows onto it, so a
decode step copies every running request's whole prefix in every layer (at 64 requests and 512 cached tokens on
the 36-layer model, a large part of a 163 ms step). The step path's ``SlabCache`` already holds each layer's keys
and values in one slab allocated once, a slot of ``max_len`` rows per request (the lowest free slot on joining,
given back on leaving). This class puts ``forward_call``'s interface (``prefix``, ``append``, ``drop``,
``length``) on it, so the engine, and every profile, decodes against the slab: a call's rows are written in place
at the request's length, and the attention candidate's ``kv_prefix`` is a view of the slot's first ``length``
rows (no copy). The views hold the values the concatenated tensors held, so no output bit changes.

A request's length advances once its call has written every layer, so every layer of a call sees the same prefix;
rows past the length (a call cut short, or a request that left) are never exposed.
"""

from __future__ import annotations

import torch

from ..context import LayoutContext
from ..errors import KernelInputError
from .step import SlabCache


class SlotKVCache:
    """``forward_call``'s cache over a ``SlabCache`` whose slabs are allocated on the first append (their row shape,
    dtype and device are the keys')."""

    def __init__(self, num_layers: int, slots: int, max_len: int) -> None:
        if num_layers < 1 or slots < 1 or max_len < 1:
            raise KernelInputError(
                f"SlotKVCache: num_layers, slots and max_len must be >= 1, got {num_layers}, {slots}, {max_len}"
            )
        self.num_layers = num_layers
        self.slab = SlabCache([], [], slots, max_len)
        self.allocations = 0  # how many times the slabs were allocated (once per cache)

    @property
    def slot_of(self) -> dict[int, int]:
        return self.slab.slot_of

    def length(self, sample_id: int) -> int:
        return self.slab.length.get(sample_id, 0)

    def drop(self, sample_id: int) -> None:
        """Give a finished request's slot back (its rows are never exposed again)."""
        if sample_id in self.slab.slot_of:
            self.slab.leave(sample_id)

    def rewind(self, sample_id: int, length: int) -> None:
        """Forget a request's rows past ``length`` (a benchmark decodes the same position again; a rejected
        speculative token is taken back). The rows stay in the slab but are never exposed again."""
        have = self.length(sample_id)
        if sample_id not in self.slab.slot_of or not 0 <= length <= have:
            raise KernelInputError(
                f"SlotKVCache: cannot rewind request {sample_id} to {length} keys: it holds {have}"
            )
        self.slab.length[sample_id] = length

    def rewind_all(self, length: int) -> None:
        """Every running request back to ``length`` keys (a benchmark's timed decode step)."""
        short = {r: n for r, n in self.slab.length.items() if n < length}
        if length < 0 or short:
            raise KernelInputError(
                f"SlotKVCache: cannot rewind every request to {length} keys: {short} hold fewer"
            )
        for rid in self.slab.length:
            self.slab.length[rid] = length

    def prefix(self, layer: int, ctx: LayoutContext) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Views of each sample's cached rows (the candidate's ``kv_prefix``); the call must continue them."""
        out = {}
        for seg in ctx.segments:
            n = self.length(seg.sample_id)
            if n != seg.first_position:
                raise KernelInputError(
                    f"SlotKVCache: layer {layer}: sample {seg.sample_id} starts at position {seg.first_position} "
                    f"but the cache holds {n} keys"
                )
            if n:
                base = self.slab.slot_of[seg.sample_id] * self.slab.max_len
                out[seg.sample_id] = (
                    self.slab.k[layer][base : base + n],
                    self.slab.v[layer][base : base + n],
                )
        return out

    def append(self, layer: int, ctx: LayoutContext, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write a call's rows of each sample into its slot, in place, after its cached rows; the last layer's
        append advances the lengths."""
        if not self.slab.k:
            self._allocate(k)
        for seg in ctx.segments:
            if seg.sample_id not in self.slab.slot_of:
                self.slab.join(seg.sample_id)
            n0 = self.length(seg.sample_id)
            n1 = n0 + seg.length
            if n1 > self.slab.max_len:
                raise KernelInputError(
                    f"SlotKVCache: layer {layer}: sample {seg.sample_id} would hold {n1} keys, past the cache's "
                    f"max_len {self.slab.max_len}"
                )
            base = self.slab.slot_of[seg.sample_id] * self.slab.max_len
            self.slab.k[layer][base + n0 : base + n1].copy_(k[seg.start : seg.end].detach())
            self.slab.v[layer][base + n0 : base + n1].copy_(v[seg.start : seg.end].detach())
            if layer == self.num_layers - 1:
                self.slab.length[seg.sample_id] = n1

    def _allocate(self, k: torch.Tensor) -> None:
        # the step path's layout, scratch slot included; empty, not zeros: rows past a length are never exposed,
        # and a fill would be one more op per layer
        shape = ((self.slab.slots + 1) * self.slab.max_len, *k.shape[1:])
        self.slab.k = [torch.empty(shape, dtype=k.dtype, device=k.device) for _ in range(self.num_layers)]
        self.slab.v = [torch.empty(shape, dtype=k.dtype, device=k.device) for _ in range(self.num_layers)]
        self.allocations += 1
