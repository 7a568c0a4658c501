"""Typed errors of ws1_kernels: every message is one line, ``<where>: <what>``."""

from __future__ import annotations

from collections.abc import Sequence


class KernelError(Exception):
    """Base class of every error raised by ws1_kernels."""


class KernelInputError(KernelError, ValueError):
    """A candidate or reference was called with inputs it must refuse (never a wrong answer or a crash)."""


class RegistryError(KernelError, LookupError):
    """Unknown profile or operator, or a malformed plug-in."""


class CandidateUnavailable(RegistryError):
    """No registered candidate can run here; ``rejections`` lists every one considered and why."""

    def __init__(
        self,
        profile: str,
        operator: str,
        device: str,
        rejections: Sequence[tuple[str, str]],
        *,
        hardware_only: bool = False,
    ):
        # hardware_only: a candidate exists and would run on other hardware (a gate reports it pending_arch);
        # False for a missing candidate, which is red.
        self.hardware_only = hardware_only
        self.profile = profile
        self.operator = operator
        self.device = device
        self.rejections = tuple(rejections)
        why = "; ".join(f"{cid}: {reason}" for cid, reason in self.rejections)
        super().__init__(f"registry.resolve({profile}, {operator}, {device}): no usable candidate [{why}]")
