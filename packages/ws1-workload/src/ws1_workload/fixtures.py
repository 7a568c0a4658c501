"""Fixtures: the logical batch of one tier (samples with prompt/completion masks and token ids).

Token ids derive from `(case_id, "token_ids", (sample_id, position))`, so they never depend on other samples.
They are skewed as text is: three positions in eight draw from a hot set of `HOT_IDS` ids shared by every
sample of the case, so ids repeat within and across samples. The first three completion tokens of a sample are
the edge ids (even samples 0, V-1, 0; odd samples V-1, 0, V-1), so id 0 (also the pad id) and the last id of
the vocab are scored, and one id repeats inside a sample whatever the draws. Logical order is samples ascending, positions ascending; row of (s, p) is `offsets[s] + p`.

Scoring convention (see docs/workload.md): the logit at position p scores the token at p + 1. Position p is
*scored* when token p + 1 exists and is a completion token, i.e. `prompt_len - 1 <= p <= length - 2`.
`Sample.active` is the completion mask itself (positions >= prompt_len).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

import torch

from .errors import WorkloadError
from .inputs import canonical_key, derive_int
from .manifest import Manifest
from .token_probes import ColumnEdit, token_edits


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
    # the id range is [0, vocab): vocab - 1 is the edge id V-1 of every sample
    vocab: int = 0
    # operator input (`<operator>.<input>`) -> the kinds of hard row it holds (from the manifest's hard cases)
    hard_rows: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # token probe case -> the operator inputs it edits (`token_probes`; from the manifest's hard cases)
    token_cases: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))

    @cached_property
    def token_edits(self) -> Mapping[str, ColumnEdit]:
        """Operator input -> what the token probes write into it (`token_probes.apply_edit`)."""
        return MappingProxyType(token_edits(self.samples, self.token_cases, self.hard_rows))

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


#: Size of the hot set of token ids every sample of a case draws from, and the share of positions that do.
HOT_IDS = 8
HOT_SHARE = (3, 8)


def _edge_id(sample_id: int, k: int, last: int) -> int | None:
    """The id of completion token k of a sample when it is an edge id: 0 and V-1 alternate, k=2 repeats k=0."""
    if k not in (0, 1, 2):
        return None
    first, second = (0, last) if sample_id % 2 == 0 else (last, 0)
    return second if k == 1 else first


def make_fixture(
    case_id: str,
    lengths: Sequence[int],
    prompt_lens: Sequence[int],
    *,
    pad_id: int,
    token_id_limit: int,
    tier: str = "custom",
    vocab: int | None = None,
    hard_rows: Mapping[str, Sequence[str]] | None = None,
    token_cases: Mapping[str, Sequence[str]] | None = None,
) -> Fixture:
    """Build a fixture from explicit lengths (sample ids 0..N-1).

    Token ids lie in [0, token_id_limit), skewed towards a hot set, and the first completion tokens are the edge
    ids 0 and `vocab - 1` (`vocab` defaults to `token_id_limit`; it must not be smaller). The pad id is a real
    id like any other: pads are known by the layout map.
    """
    if len(lengths) != len(prompt_lens) or not lengths:
        raise WorkloadError(f"fixture {case_id}: need as many prompt lengths as lengths, at least one")
    if token_id_limit < 1:
        raise WorkloadError(f"fixture {case_id}: no token id available below {token_id_limit}")
    vocab = token_id_limit if vocab is None else vocab
    if vocab < token_id_limit:
        raise WorkloadError(
            f"fixture {case_id}: vocab {vocab} is smaller than token_id_limit {token_id_limit}"
        )
    hot = [derive_int(token_id_limit, "hot_ids", case_id, str(i)) for i in range(HOT_IDS)]
    samples = []
    for sid, (length, prompt) in enumerate(zip(lengths, prompt_lens, strict=True)):
        if length < 1 or not 0 <= prompt <= length:
            raise WorkloadError(f"fixture {case_id}: sample {sid} has length {length}, prompt_len {prompt}")
        ids = []
        for p in range(length):
            edge = _edge_id(sid, p - prompt, vocab - 1)
            if edge is not None:
                ids.append(edge)
                continue
            r = derive_int(1 << 64, "token_ids", case_id, canonical_key((sid, p)))
            if r % HOT_SHARE[1] < HOT_SHARE[0]:
                ids.append(hot[(r // HOT_SHARE[1]) % HOT_IDS])
            else:
                ids.append((r // (HOT_SHARE[1] * HOT_IDS)) % token_id_limit)
        tokens = torch.tensor(ids, dtype=torch.int64)
        active = torch.arange(length) >= prompt
        samples.append(
            Sample(sample_id=sid, length=length, prompt_len=prompt, token_ids=tokens, active=active)
        )
    rows = MappingProxyType({name: tuple(kinds) for name, kinds in (hard_rows or {}).items()})
    probes = MappingProxyType({case: tuple(items) for case, items in (token_cases or {}).items()})
    return Fixture(
        tier=tier,
        case_id=case_id,
        samples=tuple(samples),
        pad_id=pad_id,
        vocab=vocab,
        hard_rows=rows,
        token_cases=probes,
    )


def build_fixture(manifest: Manifest, tier: str, model: str | None = None) -> Fixture:
    """The fixture of one tier; case id `<workload_id>/<tier>`.

    `model` names the model judged: its vocab gives the edge id V-1 (every other id is the same for every
    model). None: the edge id is `token_id_limit - 1`, inside every model's vocab.
    """
    specs = manifest.samples(tier)
    return make_fixture(
        f"{manifest.workload_id}/{tier}",
        [s.length for s in specs],
        [s.prompt_len for s in specs],
        pad_id=manifest.pad_id,
        token_id_limit=manifest.token_id_limit,
        tier=tier,
        vocab=None if model is None else manifest.model(model).vocab,
        hard_rows=manifest.hard_rows,
        token_cases=manifest.token_cases,
    )


def next_token_targets(fx: Fixture, sample_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Target token of each physical row: token at position + 1 of its sample, pad_id on pads/last tokens."""
    out = torch.full_like(sample_ids, fx.pad_id)
    for i, (s, p) in enumerate(zip(sample_ids.tolist(), positions.tolist(), strict=True)):
        if s >= 0 and p + 1 < fx.samples[s].length:
            out[i] = fx.samples[s].token_ids[p + 1]
    return out
