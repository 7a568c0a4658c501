"""Fixtures: the logical batch of one tier (samples with prompt/completion masks and token ids).

Token ids derive from `(case_id, "token_ids", (sample_id, position))`, so they never depend on other samples.
Logical order is samples ascending, positions ascending; row of (s, p) is `offsets[s] + p`.

Scoring convention (see docs/workload.md): the logit at position p scores the token at p + 1. Position p is
*scored* when token p + 1 exists and is a completion token, i.e. `prompt_len - 1 <= p <= length - 2`.
`Sample.active` is the completion mask itself (positions >= prompt_len).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from .errors import WorkloadError
from .inputs import canonical_key, derive_int
from .manifest import Manifest


@dataclass(frozen=True, eq=False)
class Sample:
    sample_id: int
    length: int
    prompt_len: int
    token_ids: torch.Tensor  # int64 [length]
    active: torch.Tensor  # bool [length]: completion tokens


@dataclass(frozen=True, eq=False)
class Fixture:
    tier: str
    case_id: str
    samples: tuple[Sample, ...]
    pad_id: int

    @cached_property
    def offsets(self) -> tuple[int, ...]:
        out, acc = [], 0
        for s in self.samples:
            out.append(acc)
            acc += s.length
        return tuple(out)

    @property
    def num_samples(self) -> int:
        return len(self.samples)

    @property
    def total_tokens(self) -> int:
        return sum(s.length for s in self.samples)

    @cached_property
    def logical_keys(self) -> tuple[tuple[int, int], ...]:
        """(sample_id, position) of every logical row, in logical order."""
        return tuple((s.sample_id, p) for s in self.samples for p in range(s.length))

    @cached_property
    def token_ids(self) -> torch.Tensor:
        return torch.cat([s.token_ids for s in self.samples])

    @cached_property
    def active(self) -> torch.Tensor:
        """Completion mask in logical order."""
        return torch.cat([s.active for s in self.samples])

    @cached_property
    def targets(self) -> torch.Tensor:
        """Logical next-token targets: token at p + 1, `pad_id` at each sample's last position."""
        return torch.cat([torch.cat([s.token_ids[1:], torch.tensor([self.pad_id])]) for s in self.samples])

    @cached_property
    def scored(self) -> torch.Tensor:
        """Logical mask of positions whose next-token logprob is scored (target is a completion token)."""
        return torch.cat([torch.cat([s.active[1:], torch.tensor([False])]) for s in self.samples])

    def sample(self, sample_id: int) -> Sample:
        if not 0 <= sample_id < len(self.samples):
            raise WorkloadError(f"fixture {self.case_id}: no sample {sample_id}")
        return self.samples[sample_id]


def make_fixture(
    case_id: str,
    lengths: Sequence[int],
    prompt_lens: Sequence[int],
    *,
    pad_id: int,
    token_id_limit: int,
    tier: str = "custom",
) -> Fixture:
    """Build a fixture from explicit lengths (sample ids 0..N-1); token ids in [0, limit) without pad_id."""
    if len(lengths) != len(prompt_lens) or not lengths:
        raise WorkloadError(f"fixture {case_id}: need as many prompt lengths as lengths, at least one")
    choices = token_id_limit - (1 if 0 <= pad_id < token_id_limit else 0)
    if choices < 1:
        raise WorkloadError(f"fixture {case_id}: no token id available below {token_id_limit}")
    samples = []
    for sid, (length, prompt) in enumerate(zip(lengths, prompt_lens, strict=True)):
        if length < 1 or not 0 <= prompt <= length:
            raise WorkloadError(f"fixture {case_id}: sample {sid} has length {length}, prompt_len {prompt}")
        ids = []
        for p in range(length):
            r = derive_int(choices, "token_ids", case_id, canonical_key((sid, p)))
            ids.append(r + 1 if 0 <= pad_id <= r else r)
        tokens = torch.tensor(ids, dtype=torch.int64)
        active = torch.arange(length) >= prompt
        samples.append(
            Sample(sample_id=sid, length=length, prompt_len=prompt, token_ids=tokens, active=active)
        )
    return Fixture(tier=tier, case_id=case_id, samples=tuple(samples), pad_id=pad_id)


def build_fixture(manifest: Manifest, tier: str) -> Fixture:
    """The fixture of one tier; case id `<workload_id>/<tier>`."""
    specs = manifest.samples(tier)
    return make_fixture(
        f"{manifest.workload_id}/{tier}",
        [s.length for s in specs],
        [s.prompt_len for s in specs],
        pad_id=manifest.pad_id,
        token_id_limit=manifest.token_id_limit,
        tier=tier,
    )
