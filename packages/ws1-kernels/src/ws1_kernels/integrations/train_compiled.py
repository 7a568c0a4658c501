"""The trainer's re-scoring forward and backward of a swapped Qwen3 model, written for ``torch.compile``.

Why a second training forward beside ``qwen3.forward_call``: that one goes through the runtime's candidate
calls, which validate and build their tables per call on the host; Dynamo cannot trace them, so compiling it
would break the graph at every op. ``train_logprobs`` calls ``triton_cuda_bf16``'s training ops
(``triton_ops.train_ops``: torch custom ops with autograd) on the model's weights, so
``torch.compile(fullgraph=True)`` traces the whole forward and, through AOTAutograd, the backward.

Why the bits are the judged path's: every op launches the candidate's kernels with its tiles and tables, in the
same order within a layer, and the autograd graph has the same shape (the same ops created in the same order), so
the gradient of a tensor used twice is summed in the same order. The weight gradients go into each weight's
``main_grad`` in the candidates' block order. The CPU tests compare the eager and compiled paths with
``forward_call`` + ``logprobs`` bit for bit (logprobs and every ``main_grad``), under the interpreter; the GPU test
does the same with inductor on the H200.

Usage::

    w = TrainWeights.of(model)                  # once: the weights and their main_grad buffers
    step = torch.compile(train_logprobs, fullgraph=True)
    with train_scope(ctx):                      # the packed call's LayoutContext, forward and backward
        lp = step(w, token_ids, targets)
        (lp * coef).sum().backward()            # main_grad of every weight accumulates
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..main_grad import main_grad_of
from ..triton_ops import train_ops  # noqa: F401 - registers torch.ops.ws1_triton.train_*
from ..triton_ops.train_ops import train_scope
from .step import StepWeights

__all__ = ["TrainWeights", "train_logprobs", "train_scope"]


@dataclass(frozen=True)
class TrainWeights:
    """A swapped model's weights (``StepWeights``) and the fp32 ``main_grad`` of each, gathered once."""

    w: StepWeights
    embed: torch.Tensor
    layers: tuple[dict[str, torch.Tensor], ...]
    norm: torch.Tensor
    lm_head: torch.Tensor

    @classmethod
    def of(cls, model: nn.Module) -> TrainWeights:
        """The model's weights and their ``main_grad`` buffers (created as zeros where absent, as the
        candidates' backward would)."""
        w = StepWeights.of(model)
        return cls(
            w,
            main_grad_of(w.embed),
            tuple({name: main_grad_of(t) for name, t in lw.items()} for lw in w.layers),
            main_grad_of(w.norm),
            main_grad_of(w.lm_head),
        )


def train_logprobs(tw: TrainWeights, token_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The selected-token logprob of every row of one packed call (fp32 ``[T]``), with autograd into the weights'
    ``main_grad``. Run it (and its backward) inside ``train_scope(ctx)`` of the call's layout."""
    ops = torch.ops.ws1_triton
    w = tw.w
    t = token_ids.shape[0]
    scale = w.head_dim**-0.5
    x = ops.train_embedding(token_ids, w.embed, tw.embed)
    for lw, lg in zip(w.layers, tw.layers, strict=True):
        h = ops.train_norm(x, lw["ln1"], lg["ln1"], w.eps)
        q = ops.train_linear(h, lw["q"], lg["q"]).reshape(t, w.heads, w.head_dim)
        k = ops.train_linear(h, lw["k"], lg["k"]).reshape(t, w.kv_heads, w.head_dim)
        v = ops.train_linear(h, lw["v"], lg["v"]).reshape(t, w.kv_heads, w.head_dim)
        q = ops.train_norm(q, lw["qn"], lg["qn"], w.eps)
        k = ops.train_norm(k, lw["kn"], lg["kn"], w.eps)
        q = ops.train_rope(q, w.theta)
        k = ops.train_rope(k, w.theta)
        a, _ = ops.train_attention(q, k, v, scale)
        x = x + ops.train_linear(a.reshape(t, w.heads * w.head_dim), lw["o"], lg["o"])
        h = ops.train_norm(x, lw["ln2"], lg["ln2"], w.eps)
        act = ops.train_swiglu(
            ops.train_linear(h, lw["gate"], lg["gate"]), ops.train_linear(h, lw["up"], lg["up"])
        )
        x = x + ops.train_linear(act, lw["down"], lg["down"])
    h = ops.train_norm(x, w.norm, tw.norm, w.eps)
    logits = ops.train_linear(h, w.lm_head, tw.lm_head)
    lp, _ = ops.train_logp(logits, targets)
    return lp
