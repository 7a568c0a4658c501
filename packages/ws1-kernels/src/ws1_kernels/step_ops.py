"""``StepOps``: the table of raw inference ops a profile gives the step path (``integrations.step``).

Its own module so that a backend (``cuda.step_ops``) and the step path both import it without either importing
the other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepOps:
    """A profile's raw inference ops (plain tensors in and out, no context, no autograd)."""

    embedding: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # ids [T], w [V,H] -> [T,H]
    norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]  # x [T,...,D], w [D], eps
    linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # x [T,K], w [N,K] -> x w^T
    rope: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]  # x [T,H,D], positions [T], theta
    # q [T,Hq,D], the layer's slabs k, v [R,Hkv,D], key_base [T] int32, n_keys [T] int32, scale -> [T,Hq,D]
    attention: Callable[
        [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
    ]
    swiglu: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    logp: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # logits [T,V], targets [T] -> fp32 [T]
    #: the torch library namespaces of the ops (``torch.ops.<namespace>.*``): the op watch of a rollout on the
    #: step path allows these and the step's glue, nothing else
    namespaces: tuple[str, ...] = ()
    #: kernel ids the ops may record beyond those the profile's candidates declare (a step-only kernel)
    kernels: frozenset[str] = frozenset()
