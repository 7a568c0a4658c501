"""The profiles a kernel, chain or bench test runs over, and how it treats one that cannot run on this machine.

It lives at the top of tests/ so the kernel and the harness tests import the same lists. Tests parametrize over
``PROFILES`` (every profile the registry knows when the tests are collected, so a new built-in profile is tested
without editing a test) and get each candidate through ``resolve_or_skip``: a candidate that exists but needs other
hardware (the registry's ``hardware_only``: Triton or CUDA on a CPU box) is skipped with the registry's reason; any
other refusal fails the test, never passes it.
"""

from __future__ import annotations

import pytest

from ws1_harness.run.layouts_exec import PARAM_RULE_MAIN_GRAD
from ws1_kernels import Candidate, CandidateUnavailable, registry

# snapshot at collection: plug-in profiles registered by other tests' bodies are not built-ins to test here
PROFILES: tuple[str, ...] = registry.profiles()
# profiles declared by name with no candidate at all (every resolve fails closed; their own test checks why)
DECLARED_ONLY: frozenset[str] = frozenset(p for p in PROFILES if not registry.candidates(p))
# the profiles that have candidates: the ones a kernel test can run (or skip for hardware)
CANDIDATE_PROFILES: tuple[str, ...] = tuple(p for p in PROFILES if p not in DECLARED_ONLY)
# profiles that promise batch invariance: every one with candidates except the stock baseline (whose candidates
# are torch's per-device choice, batch-variant by design)
BATCH_INVARIANT_PROFILES: tuple[str, ...] = tuple(
    p for p in CANDIDATE_PROFILES if not any(c.stock for c in registry.candidates(p).values())
)
# profiles with a candidate that accumulates weight gradients into an fp32 ``main_grad`` (the rule whose buffer
# checks a test feeds bad buffers to)
MAIN_GRAD_PROFILES: tuple[str, ...] = tuple(
    p
    for p in CANDIDATE_PROFILES
    if any(c.param_grad_rule == PARAM_RULE_MAIN_GRAD for c in registry.candidates(p).values())
)
# profiles whose candidates are the stock baseline (the ones an invariance gate must find red)
STOCK_PROFILES: tuple[str, ...] = tuple(p for p in CANDIDATE_PROFILES if p not in BATCH_INVARIANT_PROFILES)
CANDIDATE_OPS: tuple[str, ...] = tuple(op for op in registry.OPERATORS if op not in registry.LAYOUT_ONLY)


def resolve_or_skip(profile: str, operator: str, device: str = "cpu") -> Candidate:
    """The candidate on ``device``; a pytest skip only where the registry says the gap is hardware."""
    try:
        return registry.resolve(profile, operator, device)
    except CandidateUnavailable as exc:
        if exc.hardware_only:
            pytest.skip(f"hardware_only: {exc}")
        raise


def skip_unless_runs_on(profile: str, device: str) -> None:
    """Skip when some operator of ``profile`` is refused on ``device`` for hardware alone (a whole-model run such as
    a chain needs every operator); any other refusal fails the test."""
    for op in CANDIDATE_OPS:
        resolve_or_skip(profile, op, device)


def unrunnable(profile: str, device: str = "cpu") -> list[str]:
    """The operators of ``profile`` that are neither runnable on ``device`` nor refused for hardware alone."""
    out = []
    for op in CANDIDATE_OPS:
        try:
            registry.resolve(profile, op, device)
        except CandidateUnavailable as exc:
            if not exc.hardware_only:
                out.append(f"{profile}.{op}: {exc}")
    return out
