"""linear_logp's one autograd path (ws1_kernels.cuda.logprob), on the CPU with stand-in kernels: what a fused
forward keeps for the backward.

The Hopper profile's forward is fused (its logits are reduced in the GEMM's epilogue and never written); the
generic one materialises them. The autograd function must then keep no ``[T, V]`` tensor between the forward and
the backward for a fused forward, and keep the logits for an unfused one (the control). The kernels themselves
run on the GPU only (tests/ws1_kernels/test_cuda_sm90_logp_gpu.py).
"""

from __future__ import annotations

import pytest
import torch

from ws1_kernels.cuda import logprob

T, H, V = 6, 8, 40


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(T, H, generator=gen).requires_grad_(True)
    w = torch.randn(V, H, generator=gen).requires_grad_(True)
    return x, w, torch.randint(0, V, (T,), generator=gen)


def _logits(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.detach().float() @ w.detach().float().T


def _logp(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lse = torch.logsumexp(logits, -1)
    return logits.gather(1, targets[:, None])[:, 0] - lse, lse


def _fused(x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _logp(_logits(x, w), targets)


def _saved_shapes(f: logprob.LinearLogpForward) -> list[tuple[int, ...]]:
    x, w, targets = _inputs()
    out = logprob._LinearLogp.apply(x, w, targets, None, f)
    return [tuple(t.shape) for t in out.grad_fn.saved_tensors]


def test_a_fused_forward_keeps_no_logits_for_the_backward() -> None:
    shapes = _saved_shapes(logprob.LinearLogpForward(_logits, "k.fused", fused=_fused))
    assert (T, V) not in shapes
    assert shapes == [(T, H), (V, H), (T,), (T,)]  # x, weight, targets, lse


def test_the_control_an_unfused_forward_keeps_its_logits() -> None:
    assert (T, V) in _saved_shapes(logprob.LinearLogpForward(_logits, "k.unfused", logp=_logp))


@pytest.mark.parametrize("which", ["neither", "both"])
def test_a_forward_is_either_fused_or_not(which: str) -> None:
    kwargs = {} if which == "neither" else {"logp": _logp, "fused": _fused}
    with pytest.raises(ValueError, match="exactly one of logp"):
        logprob.LinearLogpForward(_logits, "k", **kwargs)
