"""The training step of `ws1 chain`: teacher forcing on the produced tokens under one layout.

A forward and a backward per physical call with an upstream gradient per logical token, the gradients left
where the candidates' rule puts them; and the helpers that keep the device's memory for the next step.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ws1_harness.run.compare import raw_bits_equal
from ws1_kernels import LayoutContext
from ws1_kernels.integrations import qwen3
from ws1_workload import Fixture, LayoutSpec, build_layout, logical_tensor, next_token_targets, restore

#: the upstream gradient of the trainer: d loss / d logp per logical token (an advantage), scored tokens only
UPSTREAM_NAME = "chain.dlogp"


@dataclass
class TrainRun:
    """One training layout: logical fp32 logprobs and every parameter gradient where its rule leaves it (on the
    model's device while layouts are compared bit for bit; the packed layout's move to the host, ``on_host``,
    before the fp32 reference drop-in needs the room)."""

    layout: str
    logprobs: torch.Tensor
    grads: dict[str, torch.Tensor | None]


def upstream(fx: Fixture, case: str | None = None) -> torch.Tensor:
    """d loss / d logp per logical token: a deterministic value per (case, token) on scored tokens, else 0
    (``case`` defaults to the fixture's case id; calibration draws one per seed)."""
    g = logical_tensor(case or fx.case_id, UPSTREAM_NAME, fx.logical_keys, (), torch.float32)
    return torch.where(fx.scored, g, torch.zeros_like(g))


@contextmanager
def _nothing() -> Iterator[None]:
    yield


class HostGrads:
    """Each autograd ``.grad`` moved to the host as soon as it is accumulated (a post-accumulate hook), summed there
    across physical calls in call order, and the device copy dropped.

    Why: the fp32 reference drop-in at 36 layers holds 33 GB of fp32 weights; its 33 GB of fp32 gradients beside
    them, and the candidate's 16 GB of bf16 weights, do not fit an 80 GB card. With the hooks only the gradients
    of the layers the backward is in are on the device at once. Summing fp32 values elementwise in the same order
    gives the same bits on the host as on the device. Parameters whose rule is ``main_grad`` are left alone (the
    candidate's kernel accumulates into them)."""

    def __init__(self, model: nn.Module) -> None:
        rules = qwen3.runtime_of(model).rules
        self.grads: dict[str, torch.Tensor | None] = {}
        self._handles = []
        for name, op in qwen3.param_operators(model).items():
            if rules[op] == "sample_blocks_main_grad":
                continue
            self.grads[name] = None
            param = model.get_parameter(name)
            self._handles.append(param.register_post_accumulate_grad_hook(self._hook(name)))

    def _hook(self, name: str) -> Callable[[torch.Tensor], None]:
        def take(param: torch.Tensor) -> None:
            g = param.grad
            if g is None:
                return
            host = g.detach().to("cpu", copy=True)
            have = self.grads[name]
            self.grads[name] = host if have is None else have.add_(host)
            param.grad = None

        return take

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def train(
    model: nn.Module,
    fx: Fixture,
    spec: LayoutSpec,
    grad: torch.Tensor,
    *,
    device: str,
    watch: Callable[[], Any] | None = None,
    grads_on_host: bool = False,
) -> TrainRun:
    """Teacher forcing under one layout: a forward and a backward per physical call, gradients accumulated
    where the candidates' rule puts them. ``grad`` is the upstream gradient per logical token.

    ``grads_on_host``: the autograd gradients go to the host as they arrive (`HostGrads`; the fp32 reference), and
    the run's ``main_grad`` buffers follow at its end (`on_host`)."""
    lay = build_layout(fx, spec)
    qwen3.zero_param_grads(model)
    enter = watch or _nothing
    host = HostGrads(model) if grads_on_host else None
    try:
        outs = _calls(model, fx, lay, grad, device, enter)
    finally:
        if host is not None:
            host.remove()
    # the next zero_param_grads gives every parameter fresh gradient tensors, so these stay as they are
    grads = dict(qwen3.param_grads(model))
    if host is not None:
        grads = {k: host.grads.get(k, g) for k, g in grads.items()}
    run = TrainRun(spec.name, restore(lay, outs), grads)
    return on_host(run) if grads_on_host else run


def _calls(
    model: nn.Module, fx: Fixture, lay: Any, grad: torch.Tensor, device: str, enter: Callable[[], Any]
) -> list[torch.Tensor]:
    """Every physical call of the layout, forward and backward: the logical logprobs of each, on the host."""
    outs = []
    for call in lay.calls:
        ctx = LayoutContext(call.sample_ids, call.positions)
        targets = next_token_targets(fx, call.sample_ids, call.positions)
        rows = torch.tensor(
            [
                fx.offsets[s] + p if s >= 0 else -1
                for s, p in zip(call.sample_ids.tolist(), call.positions.tolist(), strict=True)
            ],
            dtype=torch.int64,
        )
        g = torch.where(rows >= 0, grad[rows.clamp(min=0)], torch.zeros(()))
        with enter():
            logits, hctx = qwen3.forward_call(model, call.token_ids.to(device), ctx)
            lp = qwen3.logprobs(model, logits, targets, hctx)
            lp.backward(g.to(lp.device, lp.dtype))
        outs.append(lp.detach().to("cpu"))
    return outs


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Raw bits equal (same dtype and shape), compared on ``a``'s device (``b`` is brought there when it lives
    elsewhere: the packed layout's gradients wait on the host, one parameter at a time comes back)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return raw_bits_equal(a, b.to(a.device))


def grad_invariance(packed: TrainRun, run: TrainRun) -> dict[str, bool]:
    """Per parameter: does this layout's gradient have the packed layout's raw bits? (Both absent: equal; one
    absent: not.) Recorded flag by flag, so the gate can re-derive the judgment from them."""
    flags: dict[str, bool] = {}
    for name, ref in packed.grads.items():
        got = run.grads.get(name)
        if ref is None or got is None:
            flags[name] = ref is None and got is None
        else:
            flags[name] = same_bits(got, ref)
    return flags


def release_device_memory() -> None:
    """Collect the dropped reference model now (its modules hold reference cycles, so its 33 GB of fp32 weights
    would otherwise wait for the cyclic collector) and return the cached blocks to the device."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def on_host(run: TrainRun) -> TrainRun:
    """The run with its gradients moved to host memory, freeing the device.

    At full widths and 36 layers the bf16 weights (16 GB), the packed layout's fp32 gradients (33 GB) and the
    layout being compared with them (33 GB) do not fit an 80 GB card together, nor the reference's fp32 weights and
    gradients (33 GB each) beside the candidate. The packed layout's gradients wait on the host from the start;
    comparisons and figures bring one parameter at a time back to the device."""
    grads = {k: (None if g is None else g.detach().to("cpu")) for k, g in run.grads.items()}
    return dataclasses.replace(run, grads=grads)
