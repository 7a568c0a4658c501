"""The inference step of a swapped Qwen3 model on a slab KV cache: a forward that `torch.compile(fullgraph=True)`
traces and a CUDA graph captures.

Why a second forward beside ``qwen3.forward_call``: that one is the training and judging path. Each candidate
call validates its inputs, records its kernel and builds its row tables on the host, once per call; a decode
step of 36 layers pays that some 500 times, and a host-built table cannot be captured in a CUDA graph. Here all
of it is done once per step, in a ``StepPlan`` of device tensors that every layer reads, and each layer calls
the profile's raw ops (``StepOps``: for ``cuda_bf16`` the extension's ``torch.ops.ws1.*``, no autograd).

Why the bits are the judged path's bits: the step calls the same kernels on the same operands, in the same
order, as the candidates behind ``forward_call``. The attention kernel walks a row's keys one by one from its
sample's position 0; here those keys are read in place from the request's slab (``SlabCache``) instead of a
per-call concatenation, so the values and the order are the same. The GPU tests compare the two paths bit for
bit (a prefill then decode steps, eager, compiled and graph-replayed, against one packed ``forward_call``).

Rows of a step: every row writes its key and value at ``slot * max_len + position`` of each layer's slab and
attends to keys ``[slot * max_len, slot * max_len + position]``. A prefill chunk and a decode token are the
same kind of row, so chunked prefill and decode share one path. Pad rows (a graph bucket larger than the batch)
use the scratch slot ``slots`` at position 0: row-local kernels keep them from touching any real row.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import KernelInputError
from ..step_ops import StepOps
from .qwen3 import runtime_of

#: Ops the step path dispatches besides its profile's raw ops (``StepOps.namespace``), and why. The op watch of
#: a rollout on the step path allows these alone: a stock module on the path would dispatch something else.
#: ``aten.add`` and ``aten.mul`` also build the plan's integer tables (``StepPlan.from_device``).
STEP_GLUE_OPS: Mapping[str, str] = types.MappingProxyType(
    {
        "aten.add": "the residual add; the plan's slab rows and key counts",
        "aten.mul": "the plan's slab base of each row (slot * max_len)",
        "aten._to_copy": "the step's host tables to the device; the plan's int32 columns",
        "aten.lift_fresh": "the step's host tables (torch.tensor)",
        "aten.view": "q, k, v and the attention output between [T, H*D] and [T, H, D]",
        "aten.index_copy_": "a row's key and value written into its layer's slab",
        "aten.index_select": "the rows that sample go through the lm_head",
        "aten.new_zeros": "the empty logits of a step in which no row samples",
        "aten.zeros": "a graph's static inputs and a bucket's token ids",
        "aten.full": "a graph's static slot column (the scratch slot)",
        "aten.copy_": "the step's ids, slots and positions copied into a graph's static inputs",
        "aten.slice": "a bucket's real rows",
    }
)


def step_ops(profile: str) -> StepOps:
    """The profile's ``StepOps`` (``KernelInputError`` for a profile that has none)."""
    if profile == "cuda_bf16":
        from ..cuda.step_ops import STEP_OPS

        return STEP_OPS
    if profile == "cuda_bf16_sm90":
        from ..cuda_sm90.step_ops import STEP_OPS as HOPPER_STEP_OPS

        return HOPPER_STEP_OPS
    if profile == "triton_cuda_bf16":
        from ..triton_ops.step_ops import STEP_OPS as TRITON_STEP_OPS

        return TRITON_STEP_OPS
    raise KernelInputError(
        f"step: profile {profile!r} has no inference step ops (cuda_bf16, cuda_bf16_sm90 and triton_cuda_bf16 "
        "have)"
    )


@dataclass
class SlabCache:
    """Each layer's keys and values in one tensor ``[(slots + 1) * max_len, Hkv, D]``: one slab of ``max_len``
    positions per request slot, plus a scratch slot for pad rows. Allocated once; a request keeps its slot
    from joining to leaving, and a freed slot is reused by the next request that joins."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    slots: int
    max_len: int
    slot_of: dict[int, int] = field(default_factory=dict)
    length: dict[int, int] = field(default_factory=dict)

    @classmethod
    def allocate(
        cls, layers: int, slots: int, max_len: int, kv_heads: int, head_dim: int, *, device: Any, dtype: Any
    ) -> SlabCache:
        if slots < 1 or max_len < 1:
            raise KernelInputError(f"SlabCache: slots and max_len must be >= 1, got {slots}, {max_len}")
        shape = ((slots + 1) * max_len, kv_heads, head_dim)
        k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        return cls(k, v, slots, max_len)

    @property
    def scratch(self) -> int:
        return self.slots

    def join(self, request_id: int) -> int:
        """Give ``request_id`` the lowest free slot (``KernelInputError`` when none is free or it has one)."""
        if request_id in self.slot_of:
            raise KernelInputError(
                f"SlabCache: request {request_id} already holds slot {self.slot_of[request_id]}"
            )
        used = set(self.slot_of.values())
        free = next((s for s in range(self.slots) if s not in used), None)
        if free is None:
            raise KernelInputError(f"SlabCache: all {self.slots} slots are taken")
        self.slot_of[request_id] = free
        self.length[request_id] = 0
        return free

    def leave(self, request_id: int) -> None:
        """Free the request's slot (its stale keys stay until overwritten: a new row reads only positions it
        wrote itself, from 0 up)."""
        if request_id not in self.slot_of:
            raise KernelInputError(f"SlabCache: request {request_id} holds no slot")
        del self.slot_of[request_id]
        del self.length[request_id]


@dataclass(frozen=True)
class StepPlan:
    """The device tables of one step, built once and read by every layer."""

    positions: torch.Tensor  # int64 [T]: each row's position in its request
    rows: torch.Tensor  # int64 [T]: where the row's key goes in each layer's slab
    key_base: torch.Tensor  # int32 [T]: the slab row of the request's position 0
    n_keys: torch.Tensor  # int32 [T]: position + 1

    @classmethod
    def from_device(cls, slots: torch.Tensor, positions: torch.Tensor, max_len: int) -> StepPlan:
        """From device ``slots`` and ``positions`` (int64 [T]), with device ops only: capturable in a graph."""
        base = slots * max_len
        return cls(positions, base + positions, base.to(torch.int32), (positions + 1).to(torch.int32))


def plan_rows(
    cache: SlabCache, request_ids: list[int], counts: list[int], *, pad_to: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Host ``(slots, positions)`` for a step where request ``request_ids[i]`` brings its next ``counts[i]``
    tokens (a prefill chunk or one decode token), advancing each request's length; pad rows to ``pad_to``.

    Validation lives here, once per step: a request with no slot, a count below 1, a request past its slab."""
    slots: list[int] = []
    positions: list[int] = []
    for rid, n in zip(request_ids, counts, strict=True):
        if rid not in cache.slot_of:
            raise KernelInputError(f"step: request {rid} holds no slot (SlabCache.join first)")
        if n < 1:
            raise KernelInputError(f"step: request {rid} brings {n} tokens (at least 1)")
        start = cache.length[rid]
        if start + n > cache.max_len:
            raise KernelInputError(
                f"step: request {rid} would reach position {start + n - 1}, past its slab of {cache.max_len}"
            )
        slots += [cache.slot_of[rid]] * n
        positions += range(start, start + n)
        cache.length[rid] = start + n
    if pad_to is not None:
        if pad_to < len(slots):
            raise KernelInputError(f"step: {len(slots)} rows do not fit a bucket of {pad_to}")
        pad = pad_to - len(slots)
        slots += [cache.scratch] * pad
        positions += [0] * pad
    return torch.tensor(slots, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64)


@dataclass(frozen=True)
class StepWeights:
    """A swapped model's weights and widths, gathered once (the step reads them every layer)."""

    embed: torch.Tensor
    layers: tuple[dict[str, torch.Tensor], ...]
    norm: torch.Tensor
    lm_head: torch.Tensor
    eps: float
    theta: float
    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, model: nn.Module) -> StepWeights:
        runtime_of(model)
        inner = model.model
        layers = []
        for layer in inner.layers:
            att, mlp = layer.self_attn, layer.mlp
            layers.append(
                {
                    "ln1": layer.input_layernorm.weight,
                    "q": att.q_proj.weight,
                    "k": att.k_proj.weight,
                    "v": att.v_proj.weight,
                    "qn": att.q_norm.weight,
                    "kn": att.k_norm.weight,
                    "o": att.o_proj.weight,
                    "ln2": layer.post_attention_layernorm.weight,
                    "gate": mlp.gate_proj.weight,
                    "up": mlp.up_proj.weight,
                    "down": mlp.down_proj.weight,
                }
            )
        att0 = inner.layers[0].self_attn
        return cls(
            inner.embed_tokens.weight,
            tuple(layers),
            inner.norm.weight,
            model.lm_head.weight,
            inner.norm.variance_epsilon,
            att0.rope_theta,
            att0.num_heads,
            att0.num_kv_heads,
            att0.head_dim,
        )


def step_forward(
    ops: StepOps, w: StepWeights, token_ids: torch.Tensor, plan: StepPlan, k_slabs: list[torch.Tensor],
    v_slabs: list[torch.Tensor], head_rows: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Logits ``[T, V]`` of one step; each layer's keys and values are written into its slabs first.

    ``head_rows`` (device int64, ascending): only those rows go through the lm_head (a prefill chunk samples
    from its last row alone), as ``forward_call``'s ``head_rows`` does."""
    t = token_ids.shape[0]
    scale = w.head_dim**-0.5
    x = ops.embedding(token_ids, w.embed)
    # the angles once per step, where the profile splits rope
    rope = ops.rope_of(plan.positions, w.theta, w.head_dim)
    for i, lw in enumerate(w.layers):
        h = ops.norm(x, lw["ln1"], w.eps)
        q = ops.linear(h, lw["q"]).reshape(t, w.heads, w.head_dim)
        k = ops.linear(h, lw["k"]).reshape(t, w.kv_heads, w.head_dim)
        v = ops.linear(h, lw["v"]).reshape(t, w.kv_heads, w.head_dim)
        q = rope(ops.norm(q, lw["qn"], w.eps))
        k = rope(ops.norm(k, lw["kn"], w.eps))
        k_slabs[i].index_copy_(0, plan.rows, k)
        v_slabs[i].index_copy_(0, plan.rows, v)
        a = ops.attention(q, k_slabs[i], v_slabs[i], plan.key_base, plan.n_keys, scale)
        x = x + ops.linear(a.reshape(t, w.heads * w.head_dim), lw["o"])
        h = ops.norm(x, lw["ln2"], w.eps)
        x = x + ops.linear(ops.swiglu(ops.linear(h, lw["gate"]), ops.linear(h, lw["up"])), lw["down"])
    h = ops.norm(x, w.norm, w.eps)
    if head_rows is not None:
        if head_rows.shape[0] == 0:  # a step of prefill chunks alone: nothing samples
            return h.new_zeros((0, w.lm_head.shape[0]))
        h = h.index_select(0, head_rows)
    return ops.linear(h, w.lm_head)


def capture(fn: Any) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Warm ``fn`` up once on a side stream (Triton compiles, tables are cached, outside the capture), then
    capture one call in a CUDA graph: ``(graph, the call's static output)``.

    The capture's own start and end run outside any Python dispatch mode (`outside_dispatch_modes`); ``fn``
    itself, warm-up and captured call, runs inside them, so an op watch sees every op of the step."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    capturing = torch.cuda.graph(graph)
    with outside_dispatch_modes():
        capturing.__enter__()
    try:
        with torch.no_grad():
            out = fn()
    finally:  # the capture ends, with the exception in flight if any
        with outside_dispatch_modes():
            capturing.__exit__(*sys.exc_info())
    return graph, out


def outside_dispatch_modes() -> Any:
    """A context with every Python dispatch mode set aside (an op watch among them), for torch's own graph
    bookkeeping: a capture's start and every replay re-seed the CUDA generator's graph-safe state with
    ``aten.fill_`` on its seed and offset tensors. That is no op of the step, yet an op watch around a replay took
    it for one (the decode bench's ws1 rows were red for ``aten.fill_``)."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


def replay(graph: Any) -> None:
    """Replay a captured step: its kernels only, no op dispatched (see `outside_dispatch_modes`)."""
    with outside_dispatch_modes():
        graph.replay()


def has_step_ops(profile: str) -> str | None:
    """None when ``profile`` has step ops, else why not (one line): the chain and the bench ask it."""
    try:
        step_ops(profile)
    except KernelInputError as exc:
        return str(exc)
    return None


class GraphStep:
    """One CUDA graph of ``step_forward`` for a bucket of ``rows`` rows: static inputs are copied in, the graph
    replays, the static logits are read out. Capture once per bucket; replay every step of that size."""

    def __init__(self, ops: StepOps, w: StepWeights, cache: SlabCache, rows: int) -> None:
        dev = cache.k[0].device
        self.rows = rows
        self.token_ids = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.slots = torch.full((rows,), cache.scratch, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=dev)

        def run() -> torch.Tensor:
            plan = StepPlan.from_device(self.slots, self.positions, cache.max_len)
            return step_forward(ops, w, self.token_ids, plan, cache.k, cache.v)

        # the warm-up writes only the scratch slot: every row is a pad
        self.graph, self.logits = capture(run)

    def __call__(self, token_ids: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if (
            token_ids.shape[0] != self.rows
            or slots.shape != token_ids.shape
            or positions.shape != slots.shape
        ):
            raise KernelInputError(f"GraphStep: expected {self.rows} rows of ids, slots and positions")
        self.token_ids.copy_(token_ids)
        self.slots.copy_(slots)
        self.positions.copy_(positions)
        replay(self.graph)
        return self.logits
