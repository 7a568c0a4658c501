"""``StepOps``: the table of raw inference ops a profile gives the step path (``integrations.step``).

Its own module so that a backend (``cuda.step_ops``) and the step path both import it without either importing
the other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .errors import KernelInputError


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
    #: rope in two parts, for a profile whose rope is two kernels (the angles' cos/sin table, then the rotation):
    #: ``rope_angles(positions [T], theta, head_dim) -> table``, made once per step, and ``rope_rotate(x, table)``
    #: for q and k of every layer. Why: the table depends on the step's positions alone, so making it 72 times a
    #: step (q and k of 36 layers) was 71 wasted launches and host calls. None: ``rope`` on every call (a profile
    #: whose rope is one kernel)
    rope_angles: Callable[[torch.Tensor, float, int], torch.Tensor] | None = None
    rope_rotate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    #: the torch library namespaces of the ops (``torch.ops.<namespace>.*``): the op watch of a rollout on the
    #: step path allows these and the step's glue, nothing else
    namespaces: tuple[str, ...] = ()
    #: kernel ids the ops may record beyond those the profile's candidates declare (a step-only kernel)
    kernels: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if (self.rope_angles is None) != (self.rope_rotate is None):
            raise KernelInputError("StepOps: rope_angles and rope_rotate come together (or neither)")

    def rope_of(
        self, positions: torch.Tensor, theta: float, head_dim: int
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The step's rope, ``x -> rotated x`` at ``positions``: the angles made here, once, where the profile
        splits rope; else each call is ``rope``."""
        if self.rope_angles is not None and self.rope_rotate is not None:
            table, rotate = self.rope_angles(positions, theta, head_dim), self.rope_rotate
            return lambda x: rotate(x, table)
        rope = self.rope
        return lambda x: rope(x, positions, theta)
