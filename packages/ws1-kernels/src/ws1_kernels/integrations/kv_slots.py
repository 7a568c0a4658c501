"""A KV cache allocated once, one slot per running request: what the rollout engine decodes against.

Why: ``qwen3.KVCache`` keeps one tensor per (layer, request) and concatenates every call's rows onto it, so a
decode step copies every running request's whole prefix in every layer (at 64 requests and 512 cached tokens on
the 36-layer model, the concatenations alone were a large part of a 163 ms step). Here every layer's keys and
values live in one slab ``[slots, max_len, kv_heads, head_dim]`` allocated on the first call; a request takes the
lowest free slot when it joins and gives it back when it leaves; a call's rows are written in place at the
request's length, and the attention candidate's ``kv_prefix`` is a view of the slot's first ``length`` rows (no
copy). The views hold the same values as the concatenated tensors did, so no output bit changes.

The interface is ``KVCache``'s (``prefix``, ``append``, ``drop``, ``length``), so ``qwen3.forward_call`` takes
either. Rows beyond a slot's length (left by an earlier request) are never exposed: a view stops at the length, and
``drop`` resets it.
"""

from __future__ import annotations

import torch

from ..context import LayoutContext
from ..errors import KernelInputError


class SlotKVCache:
    """Per layer, one ``[slots, max_len, kv_heads, head_dim]`` slab of keys and one of values, allocated once."""

    def __init__(self, num_layers: int, slots: int, max_len: int) -> None:
        if num_layers < 1 or slots < 1 or max_len < 1:
            raise KernelInputError(
                f"SlotKVCache: num_layers, slots and max_len must be >= 1, got {num_layers}, {slots}, {max_len}"
            )
        self.num_layers = num_layers
        self.slots = slots
        self.max_len = max_len
        self.k: list[
            torch.Tensor
        ] = []  # per layer, allocated on the first append (shape, dtype, device of k)
        self.v: list[torch.Tensor] = []
        self.slot_of: dict[int, int] = {}
        self._free = list(range(slots))  # ascending: a joining request takes the lowest free slot
        self._len = [[0] * slots for _ in range(num_layers)]
        self.allocations = 0  # how many times the slabs were allocated (once per cache)

    # ---- slots

    def admit(self, sample_id: int) -> int:
        """The slot of ``sample_id``, taking the lowest free one when it has none yet."""
        slot = self.slot_of.get(sample_id)
        if slot is not None:
            return slot
        if not self._free:
            raise KernelInputError(
                f"SlotKVCache: no free slot for request {sample_id}: all {self.slots} slots hold running requests "
                f"({sorted(self.slot_of)})"
            )
        slot = self._free.pop(0)
        self.slot_of[sample_id] = slot
        return slot

    def drop(self, sample_id: int) -> None:
        """Give a finished request's slot back (its rows are never exposed again: the length goes to 0)."""
        slot = self.slot_of.pop(sample_id, None)
        if slot is None:
            return
        for lens in self._len:
            lens[slot] = 0
        self._free.append(slot)
        self._free.sort()

    def rewind(self, sample_id: int, length: int) -> None:
        """Forget a request's rows past ``length`` in every layer (a benchmark decodes the same position again; a
        rejected speculative token is taken back). The rows stay in the slab but are never exposed again."""
        slot = self.slot_of.get(sample_id)
        have = 0 if slot is None else min(lens[slot] for lens in self._len)
        if slot is None or not 0 <= length <= have:
            raise KernelInputError(
                f"SlotKVCache: cannot rewind request {sample_id} to {length} keys: it holds {have}"
            )
        for lens in self._len:
            lens[slot] = length

    def rewind_all(self, length: int) -> None:
        """Every running request back to ``length`` keys, between calls (a benchmark's timed decode step): one pass
        over the slots and a list copy per layer, so the rewind costs little beside the step it precedes."""
        first = self._len[0]
        if any(lens != first for lens in self._len):
            raise KernelInputError(
                "SlotKVCache: rewind_all between the layers of a call (lengths differ by layer)"
            )
        occupied = self.slot_of.values()
        if any(not 0 <= length <= first[slot] for slot in occupied):
            raise KernelInputError(
                f"SlotKVCache: cannot rewind every request to {length} keys: they hold {sorted(first[s] for s in occupied)}"
            )
        new = list(first)
        for slot in occupied:
            new[slot] = length
        self._len = [list(new) for _ in self._len]

    def length(self, sample_id: int) -> int:
        slot = self.slot_of.get(sample_id)
        return 0 if slot is None else self._len[0][slot]

    # ---- the KVCache interface

    def prefix(self, layer: int, ctx: LayoutContext) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Views of each sample's cached rows (the candidate's ``kv_prefix``); the call must continue them."""
        out = {}
        for seg in ctx.segments:
            slot = self.slot_of.get(seg.sample_id)
            n = 0 if slot is None else self._len[layer][slot]
            if n != seg.first_position:
                raise KernelInputError(
                    f"SlotKVCache: layer {layer}: sample {seg.sample_id} starts at position {seg.first_position} "
                    f"but the cache holds {n} keys"
                )
            if n:
                assert slot is not None
                out[seg.sample_id] = (self.k[layer][slot, :n], self.v[layer][slot, :n])
        return out

    def append(self, layer: int, ctx: LayoutContext, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write a call's rows of each sample into its slot, in place, at the sample's length."""
        if not self.k:
            self._allocate(k)
        for seg in ctx.segments:
            slot = self.admit(seg.sample_id)
            n0 = self._len[layer][slot]
            n1 = n0 + seg.length
            if n1 > self.max_len:
                raise KernelInputError(
                    f"SlotKVCache: layer {layer}: sample {seg.sample_id} would hold {n1} keys, past the cache's "
                    f"max_len {self.max_len}"
                )
            self.k[layer][slot, n0:n1].copy_(k[seg.start : seg.end].detach())
            self.v[layer][slot, n0:n1].copy_(v[seg.start : seg.end].detach())
            self._len[layer][slot] = n1

    def _allocate(self, k: torch.Tensor) -> None:
        shape = (self.slots, self.max_len, *k.shape[1:])
        # empty, not zeros: rows past a slot's length are never exposed, and a fill would be one more op per layer
        self.k = [torch.empty(shape, dtype=k.dtype, device=k.device) for _ in range(self.num_layers)]
        self.v = [torch.empty(shape, dtype=k.dtype, device=k.device) for _ in range(self.num_layers)]
        self.allocations += 1
