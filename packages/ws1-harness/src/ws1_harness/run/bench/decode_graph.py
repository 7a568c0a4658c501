"""`ws1 bench --op decode_step` on a GPU: ws1's graph decode against the stock model's graph decode.

Why this pair: a user who decodes at speed runs a CUDA graph of one step over a KV cache allocated once. On the
ws1 side that is the step path (`integrations.step`: the profile's step ops on a `SlabCache`, `GraphStep`, the
rollout engine's own decode); on the stock side it is transformers' `Qwen3ForCausalLM` with SDPA (torch's
default backend selection) and a `StaticCache`, one decode step captured in a CUDA graph by hand. Comparing the
ws1 graph with the stock model run eagerly, or with the drop-in on stock ops, would compare against a weakened
stock.

Both sides decode the same position of every request each call (`cache` earlier tokens, random bf16 keys and
values, the same weights), the step's logits then the selected token's fp32 logprob (`ops.logp` on the ws1
side, `log_softmax` and a gather on the stock side), inside the graph. What ran is observed: the ws1 side's
ops and kernel ids at capture under the step path's op watch, and the stock side's SDPA kernels by the CUDA
profiler around one eager call before its capture (`peer_kernels`: the names say which backend torch chose).

Off CUDA (the CPU tests) both sides run the same calls eagerly (`graphs=False`).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from ws1_harness.run.bench.stock import step_kernels, stock_model
from ws1_kernels.integrations.step import capture, replay

__all__ = [
    "PEER",
    "GraphSide",
    "fill_static_cache",
    "forced_gqa_supported",
    "stock_model",
    "stock_side",
    "ws1_side",
]

#: what the record says the peer is
PEER = (
    "stock transformers Qwen3ForCausalLM (attn_implementation='sdpa', torch's default SDPA backend), StaticCache, "
    "one decode step captured in a CUDA graph by hand"
)


#: transformers' own switch (integrations/sdpa_attention.py, `use_gqa_in_sdpa`) for SDPA's grouped-query attention
#: on a masked call. By default, on CUDA, a call with a mask (a StaticCache decode always has one) first repeats each
#: layer's cached K and V to every query head (`repeat_kv`): at 32 query and 8 KV heads that writes and reads four
#: copies of the cache per layer, so the stock step grows with batch x cache far faster than its bytes (on the H100
#: at batch 64 and 2048 cached tokens, 79.9 of the stock step's 113 ms were those copies). The bench times the peer
#: both ways and judges against the faster: the stock a user tuning transformers would keep.
FORCE_GQA_ENV = "TRANSFORMERS_SDPA_FORCE_GQA"
#: the function transformers asks before it repeats K and V (a release without FORCE_GQA_ENV has it too)
GQA_DECIDER = "use_gqa_in_sdpa"


def _sdpa_module() -> ModuleType | None:
    try:
        from transformers.integrations import sdpa_attention
    except ImportError:
        return None
    return sdpa_attention


def forced_gqa_supported() -> bool:
    """Whether the grouped-query variant can be forced here: this transformers reads `FORCE_GQA_ENV`, or it asks
    `GQA_DECIDER`, which the variant then answers (a release without the switch, such as 5.17 on the device)."""
    module = _sdpa_module()
    if module is None:
        return False
    return FORCE_GQA_ENV in inspect.getsource(module) or callable(getattr(module, GQA_DECIDER, None))


def _always_gqa(*_args: object, **_kwargs: object) -> bool:
    """`GQA_DECIDER` while the variant runs: SDPA gets the grouped K and V with `enable_gqa`, never repeated."""
    return True


@contextlib.contextmanager
def sdpa_gqa(forced: bool) -> Iterator[None]:
    """While the block runs, when `forced`: `FORCE_GQA_ENV` set to 1 and transformers' `GQA_DECIDER` answering yes
    (the release's own switch where it has one, the same decision where it has not); else the variable unset and
    the decider left alone. Both restored after either way."""
    before = os.environ.get(FORCE_GQA_ENV)
    module = _sdpa_module() if forced else None
    decider = getattr(module, GQA_DECIDER, None) if module is not None else None
    if forced:
        os.environ[FORCE_GQA_ENV] = "1"
    else:
        os.environ.pop(FORCE_GQA_ENV, None)
    if decider is not None:
        setattr(module, GQA_DECIDER, _always_gqa)
    try:
        yield
    finally:
        if decider is not None:
            setattr(module, GQA_DECIDER, decider)
        if before is None:
            os.environ.pop(FORCE_GQA_ENV, None)
        else:
            os.environ[FORCE_GQA_ENV] = before


#: SDPA's backends for the stock variant without cuDNN: torch's own kernels, chosen among in its usual order
NO_CUDNN_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


@contextlib.contextmanager
def sdpa_without_cudnn(on: bool) -> Iterator[None]:
    """While the block runs, when ``on``: SDPA may pick any backend but cuDNN's (`NO_CUDNN_BACKENDS`).

    Why a stock variant: the default picks cuDNN's SDPA on Hopper, and a user may leave it out; the row is judged
    against the faster (`steps.faster_peer`), never against a configuration the user would not keep. (On the H100
    the stock step's growth with the batch turned out to be the repeated cache, `FORCE_GQA_ENV`'s case: at batch
    64 cuDNN's attention took 25.5 ms against 36.3 ms for torch's own kernels, of a 113 ms step.)"""
    if not on:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([getattr(SDPBackend, name) for name in NO_CUDNN_BACKENDS]):
        yield


@dataclass
class GraphSide:
    """One side of the pair: ``call()`` runs one decode step (a replay once captured); ``record`` what it is."""

    call: Callable[[], torch.Tensor]
    record: dict[str, Any] = field(default_factory=dict)


#: ``kv(layer) -> (k, v)``, each ``[batch, cache, Hkv, D]``: the cached keys and values both sides start from
KV = Callable[[int], tuple[torch.Tensor, torch.Tensor]]


def ws1_side(
    model: torch.nn.Module, batch: int, cache: int, targets: torch.Tensor, *, graphs: bool,
    ids: torch.Tensor | None = None, kv: KV | None = None,
) -> GraphSide:  # fmt: skip
    """The ws1 step path at ``batch`` rows: request i in slot i at position ``cache``, over random cached keys
    (``ids`` ``[batch]`` and ``kv``: the tests give both sides the same)."""
    from ws1_kernels.integrations.qwen3 import runtime_of
    from ws1_kernels.integrations.step import SlabCache, StepPlan, StepWeights, step_forward, step_ops

    ops = step_ops(runtime_of(model).profile)
    w = StepWeights.of(model)
    dev = w.embed.device
    slab = SlabCache.allocate(
        len(w.layers), batch, cache + 1, w.kv_heads, w.head_dim, device=dev, dtype=w.embed.dtype
    )
    gen = torch.Generator(device=dev).manual_seed(5)
    for i, (k, v) in enumerate(zip(slab.k, slab.v, strict=True)):
        if kv is None:
            k.normal_(generator=gen)
            v.normal_(generator=gen)
            continue
        kk, vv = kv(i)
        for r in range(batch):
            k[r * slab.max_len : r * slab.max_len + cache].copy_(kk[r])
            v[r * slab.max_len : r * slab.max_len + cache].copy_(vv[r])
    for r in range(batch):
        slab.join(r)
    if ids is None:
        ids = torch.randint(0, w.embed.shape[0], (batch,), generator=gen, device=dev)
    slots = torch.arange(batch, dtype=torch.int64, device=dev)
    positions = torch.full((batch,), cache, dtype=torch.int64, device=dev)
    record = {
        "path": f"ws1 step path (integrations.step), the {'/'.join(ops.namespaces)} step ops on a SlabCache"
    }

    def step() -> torch.Tensor:
        plan = StepPlan.from_device(slots, positions, slab.max_len)
        return ops.logp(step_forward(ops, w, ids, plan, slab.k, slab.v), targets)

    if not graphs:

        def eager() -> torch.Tensor:
            with torch.no_grad():
                return step()

        return GraphSide(eager, {**record, "mode": "eager"})
    state: dict[str, Any] = {}
    try:  # one eager step before the capture: where its device time goes (recorded, never judged)
        record["top_kernels"] = step_kernels(step)[1]
    except Exception as exc:  # noqa: BLE001 - a profiler failure costs the figure, not the row
        record["top_kernels"] = f"not profiled: {type(exc).__name__}: {exc}".splitlines()[0]

    def call() -> torch.Tensor:
        if "graph" not in state:  # captured on the first call, inside the caller's op watch
            state["graph"], state["out"] = capture(step)
        replay(state["graph"])
        return state["out"]

    return GraphSide(
        call, {**record, "mode": "cuda_graph (the plan, the step and the logp kernel in one graph)"}
    )


def fill_static_cache(model: Any, batch: int, max_len: int, fill: Callable[[int], tuple]) -> Any:
    """A ``StaticCache`` of ``max_len`` positions for ``batch`` rows, its layers' keys and values set by
    ``fill(layer) -> (k, v)`` (``[batch, Hkv, n, D]``, written at positions ``0..n-1``)."""
    from transformers import StaticCache

    dev = next(model.parameters()).device
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    # one call at position 0 initialises every layer's tensors (lazily allocated on their first update)
    with torch.no_grad():
        model(
            input_ids=torch.zeros((batch, 1), dtype=torch.int64, device=dev),
            position_ids=torch.zeros((batch, 1), dtype=torch.int64, device=dev),
            cache_position=torch.zeros(1, dtype=torch.int64, device=dev),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
    layers: list[Any] = list(cache.layers)
    for i, layer in enumerate(layers):
        k, v = fill(i)
        layer.keys[:, :, : k.shape[2]].copy_(k)
        layer.values[:, :, : v.shape[2]].copy_(v)
    set_static_length(cache, k.shape[2])
    return cache


def set_static_length(cache: Any, length: int) -> None:
    """Where the next token goes. Some transformers releases write a static layer at its own running length
    (``cumulative_length``, advanced by every update) rather than at ``cache_position``: it is set here, and
    again inside every decode call, so that each call (each graph replay) decodes the same position."""
    for layer in cache.layers:
        n = getattr(layer, "cumulative_length", None)
        if isinstance(n, torch.Tensor):
            n.fill_(length)


def stock_side(
    model: Any, batch: int, cache: int, targets: torch.Tensor, *, graphs: bool,
    ids: torch.Tensor | None = None, kv: KV | None = None, force_gqa: bool = False, no_cudnn: bool = False,
) -> GraphSide:  # fmt: skip
    """The stock decode at ``batch`` rows, position ``cache``, over random cached keys (``ids``, ``kv``: as
    ``ws1_side``); ``force_gqa``: SDPA's own grouped-query attention on the masked call (`FORCE_GQA_ENV`), not
    transformers' repeated K and V; ``no_cudnn``: SDPA without cuDNN's backend (`sdpa_without_cudnn`)."""
    cfg = model.config
    dev = next(model.parameters()).device
    hkv = int(cfg.num_key_value_heads)
    d = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    gen = torch.Generator(device=dev).manual_seed(6)

    def random_fill(_layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (batch, hkv, cache, d)
        return (
            torch.randn(shape, generator=gen, device=dev, dtype=model.dtype),
            torch.randn(shape, generator=gen, device=dev, dtype=model.dtype),
        )

    def given(layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        assert kv is not None
        k, v = kv(layer)
        return k.transpose(1, 2), v.transpose(
            1, 2
        )  # [batch, cache, Hkv, D] -> transformers' [batch, Hkv, n, D]

    static = fill_static_cache(model, batch, cache + 1, random_fill if kv is None else given)
    if ids is None:
        ids = torch.randint(0, int(cfg.vocab_size), (batch,), generator=gen, device=dev)
    ids = ids[:, None]
    position_ids = torch.full((batch, 1), cache, dtype=torch.int64, device=dev)
    cache_position = torch.tensor([cache], dtype=torch.int64, device=dev)

    def step() -> torch.Tensor:
        set_static_length(static, cache)
        # read while the call runs (once, at a graph's capture, which fixes the kernels its replays launch)
        with sdpa_gqa(force_gqa), sdpa_without_cudnn(no_cudnn):
            out = model(
                input_ids=ids,
                position_ids=position_ids,
                cache_position=cache_position,
                past_key_values=static,
                use_cache=True,
                logits_to_keep=1,
            )
        logits = out.logits[:, -1]
        return torch.log_softmax(logits.float(), -1).gather(1, targets[:, None])[:, 0]

    record: dict[str, Any] = {
        "path": PEER,
        "cache": type(static).__name__,
        "gqa": (
            f"SDPA's grouped-query attention ({FORCE_GQA_ENV}=1, transformers' {GQA_DECIDER} answering yes)"
            if force_gqa
            else "transformers' default"
        ),
        "sdpa_backends": ", ".join(NO_CUDNN_BACKENDS) if no_cudnn else "torch's default selection",
    }
    if not graphs:

        def eager() -> torch.Tensor:
            with torch.no_grad():
                return step()

        return GraphSide(eager, {**record, "mode": "eager"})
    # one profiled eager step: which attention backend ran, and where the step's device time goes
    record["peer_kernels"], record["top_kernels"] = step_kernels(step)
    state: dict[str, Any] = {}

    def call() -> torch.Tensor:
        if "graph" not in state:
            state["graph"], state["out"] = capture(step)
        replay(state["graph"])
        return state["out"]

    return GraphSide(call, {**record, "mode": "cuda_graph"})
