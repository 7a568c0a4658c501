"""The `sample_blocks_main_grad` rule's shared pieces: the block size and the fp32 `main_grad` buffer.

A floor under every backend whose rule is `sample_blocks_main_grad` (portable and Triton alike), so no backend
imports another's module for them.
"""

from __future__ import annotations

import torch

#: Tokens per weight-gradient block, aligned to each sample's position 0 (one MMA K step on the GPU).
WGRAD_BLOCK = 16


def main_grad_of(weight: torch.Tensor) -> torch.Tensor:
    """The fp32 ``weight.main_grad`` accumulator (created as zeros the first time, as Megatron does)."""
    mg = getattr(weight, "main_grad", None)
    if mg is None:
        mg = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        setattr(weight, "main_grad", mg)  # noqa: B010 (torch.Tensor has no declared main_grad)
    return mg


def check_main_grad(where: str, weight: torch.Tensor) -> None:
    """A ``main_grad`` set by the caller must be contiguous fp32 of the weight's shape on its device.

    Checked in the forward (cheap); absent is fine: the backward creates it as zeros, as Megatron does. Shared by
    every backend whose rule is ``sample_blocks_main_grad``.
    """
    from .errors import KernelInputError

    mg = getattr(weight, "main_grad", None)
    if mg is not None and (
        not isinstance(mg, torch.Tensor)
        or mg.dtype != torch.float32
        or mg.shape != weight.shape
        or mg.device != weight.device
        or not mg.is_contiguous()
    ):
        raise KernelInputError(
            f"{where}: weight.main_grad must be contiguous fp32 of shape {tuple(weight.shape)} on {weight.device}"
        )
