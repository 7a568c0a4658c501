"""The compiled-training scenario shared by the interpreter test and the GPU test: one packed call of three
samples and a pad row through the judged path (``forward_call`` + ``logprobs`` + backward) and through
``train_compiled.train_logprobs`` (eager or compiled), each giving its logprobs and every weight's main_grad."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ws1_kernels import LayoutContext
from ws1_kernels.integrations import qwen3
from ws1_kernels.integrations.train_compiled import TrainWeights, train_logprobs, train_scope

LENGTHS = (5, 3, 7)  # samples of the packed call; one pad row follows


def packed_call(vocab: int, device: Any) -> tuple[torch.Tensor, torch.Tensor, LayoutContext, torch.Tensor]:
    """(token ids, targets, the call's context, the per-row loss weights: zero on the pad)."""
    g = torch.Generator().manual_seed(13)
    n = sum(LENGTHS) + 1
    sid = torch.cat(
        [torch.full((m,), s, dtype=torch.int64) for s, m in enumerate(LENGTHS)] + [torch.tensor([-1])]
    )
    pos = torch.cat([torch.arange(m, dtype=torch.int64) for m in LENGTHS] + [torch.tensor([-1])])
    ids = torch.randint(0, vocab, (n,), generator=g)
    targets = torch.randint(0, vocab, (n,), generator=g)
    coef = torch.rand((n,), generator=g) + 0.5
    coef[-1] = 0.0
    return ids.to(device), targets.to(device), LayoutContext(sid, pos), coef.to(device)


def weights_of(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(n, p) for n, p in model.named_parameters()]


def zero_main_grads(model: torch.nn.Module) -> None:
    for _, p in weights_of(model):
        mg = getattr(p, "main_grad", None)
        if mg is not None:
            mg.zero_()


def main_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.main_grad.clone() for n, p in weights_of(model)}


def judged(
    model: torch.nn.Module, ctx: LayoutContext, ids: torch.Tensor, targets: torch.Tensor, coef: torch.Tensor
):  # type: ignore[no-untyped-def]
    """The judged path: (logprobs, main_grads)."""
    zero_main_grads(model)
    logits, _ = qwen3.forward_call(model, ids, ctx)
    lp = qwen3.logprobs(model, logits, targets, ctx)
    (lp * coef).sum().backward()
    return lp.detach().clone(), main_grads(model)


def trained(
    model: torch.nn.Module,
    ctx: LayoutContext,
    ids: torch.Tensor,
    targets: torch.Tensor,
    coef: torch.Tensor,
    *,
    compile_backend: str | None = None,
    fn: Callable[..., torch.Tensor] = train_logprobs,
):  # type: ignore[no-untyped-def]
    """The compile-ready path, eager (``compile_backend`` None) or ``torch.compile(fullgraph=True)``."""
    zero_main_grads(model)
    tw = TrainWeights.of(model)
    run = fn if compile_backend is None else torch.compile(fn, fullgraph=True, backend=compile_backend)
    with train_scope(ctx):
        lp = run(tw, ids, targets)
        (lp * coef).sum().backward()
    return lp.detach().clone(), main_grads(model)


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32 if t.element_size() == 4 else torch.int16)


def bit_mismatches(a: tuple, b: tuple) -> list[str]:  # type: ignore[type-arg]
    """The names of the tensors whose raw bits differ: 'logprobs' and each weight."""
    out = [] if torch.equal(raw(a[0]), raw(b[0])) else ["logprobs"]
    out += [n for n in a[1] if not torch.equal(raw(a[1][n]), raw(b[1][n]))]
    return out
