"""Whether committed GPU evidence still describes the code: the sources behind a profile, unchanged since the commit
the evidence names.

A bundle in `docs/evidence/` is a claim about the kernels at one commit. When a kernel file changes afterwards, the
bundle still passes the gate (its cells are internally consistent) but no longer says anything about the code that
ships. This module names, per profile, the files whose change makes its evidence stale, and asks git which of them
differ between the evidence's commit and the working tree. The verdict side imports no torch, so this is plain
paths and a `git diff`.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_KERNELS = "packages/ws1-kernels/src/ws1_kernels"
#: modules every backend stands on (row tables, checks, the main_grad rule, the layout context, the launch log)
FLOORS: tuple[str, ...] = tuple(
    f"{_KERNELS}/{name}"
    for name in (
        "backend.py",
        "row_tables.py",
        "op_checks.py",
        "rope_math.py",
        "main_grad.py",
        "_validate.py",
        "context.py",
        "launches.py",
    )
)
#: the files behind each profile's evidence (a profile not named here cannot be judged fresh: an error)
PROFILE_SOURCES: dict[str, tuple[str, ...]] = {
    # the Triton kernels and launch path, and the step ops' C++ host path (csrc/launch/, its own module)
    "triton_cuda_bf16": (f"{_KERNELS}/triton_ops", "csrc/launch"),
    # the generic build: csrc/ less the Hopper kernels (csrc/sm90/ builds into another module)
    "cuda_bf16": ("csrc/kernels", "csrc/ws1_ops.cpp", "csrc/binding.h", "csrc/setup.py", f"{_KERNELS}/cuda"),
    # both modules of csrc/setup.py (the Hopper profile runs the generic kernels beside its own)
    "cuda_bf16_sm90": (
        "csrc/kernels",
        "csrc/sm90",
        "csrc/ws1_ops.cpp",
        "csrc/binding.h",
        "csrc/setup.py",
        f"{_KERNELS}/cuda",
        f"{_KERNELS}/cuda_sm90",
    ),
    "native_torch": (f"{_KERNELS}/native.py",),
    "portable_cpu": (f"{_KERNELS}/portable",),
}
#: a chain bundle also depends on the drop-in that runs the whole model
CHAIN_SOURCES: tuple[str, ...] = (f"{_KERNELS}/integrations/qwen3.py", f"{_KERNELS}/integrations/rollout.py")


class FreshnessError(Exception):
    """The check itself cannot run (no git history, an unknown profile or commit): never a silent pass."""


@dataclass(frozen=True)
class Staleness:
    """The files behind `profile` that changed after `commit` (empty: the evidence is fresh)."""

    evidence: str
    profile: str
    commit: str
    changed: tuple[str, ...]

    def message(self) -> str:
        return (
            f"{self.evidence}: {self.profile} evidence names commit {self.commit[:12]}, but "
            f"{', '.join(self.changed)} changed since: rerun it where it ran and replace the bundle"
        )


def sources_of(profile: str, *, chain: bool = False) -> tuple[str, ...]:
    if profile not in PROFILE_SOURCES:
        raise FreshnessError(f"no source list for profile {profile!r} (ws1_harness.verdict.freshness)")
    return (*PROFILE_SOURCES[profile], *FLOORS, *(CHAIN_SOURCES if chain else ()))


def changed_since(root: Path, commit: str, paths: tuple[str, ...]) -> tuple[str, ...]:
    """The files under `paths` that differ between `commit` and the working tree of the git checkout `root`
    (uncommitted edits count: a planted edit is seen before it is committed)."""
    probe = subprocess.run(
        ["git", "-C", str(root), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        raise FreshnessError(
            f"commit {commit[:12]} is not in the history of {root} (a shallow clone? fetch the full history)"
        )
    diff = subprocess.run(
        ["git", "-C", str(root), "diff", "--name-only", commit, "--", *paths],
        capture_output=True,
        text=True,
    )
    if diff.returncode != 0:
        raise FreshnessError(f"git diff failed in {root}: {diff.stderr.strip().splitlines()[:1]}")
    return tuple(sorted(line for line in diff.stdout.splitlines() if line))


def check(root: Path, evidence: str, profile: str, commit: str, *, chain: bool = False) -> Staleness:
    return Staleness(evidence, profile, commit, changed_since(root, commit, sources_of(profile, chain=chain)))
