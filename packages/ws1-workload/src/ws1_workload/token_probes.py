"""Order probes across tokens: the weight gradient's sum over tokens and attention's sum over keys.

The row probes (`inputs.HARD_ROW_KINDS`) shape one row so that a change of order along that row's axis changes
the bits. Two reductions run along the token axis instead, so their probe is a placement of a few tokens:

- **The weight gradient** of a GEMM, `dW[n, k] = sum_t dy[t, n] x[t, k]`, walks the active tokens in the
  `sample_blocks_main_grad` order: samples by id, each sample's tokens in 16-position blocks aligned to
  position 0, every block added into `main_grad` in turn. The probe (`wgrad_order_tokens`) takes three active
  tokens: the survivor in an earlier sample, then `plus` and `minus` in two different 16-position blocks of one
  later sample. The input `x` holds 1 in column 0 at those three tokens and 0 in column 0 everywhere else; the
  upstream gradient holds `ORDER_PROBE_TINY`, +1 and -1 in column 0 at them. So `dW[0, 0]` is the sum of three
  exact products, every other token adding an exact zero: the walk above gives `tiny + 1 = 1`, then `1 - 1 = 0`;
  an order that cancels the pair before the survivor meets it (the call's blocks summed from zero and added to
  `main_grad` at the end, a call walked backwards or split in parts, samples in physical order) keeps `tiny`.
  `plus` and `minus` never share a 16-token block, so no single MMA instruction decides it. Where a sample
  follows the pair's, a second probe in column 2 puts the survivor after the pair (correct result `tiny`), which
  catches the faults the first one cannot (a call walked backwards from zero). The tokens are ordinary rows (no
  other hard row of the inputs involved), so the dot-order rows stay intact.
- **Attention's weighted sum over values**, `out[i] = sum_j p[i, j] v[j] / sum_j p[i, j]`. The probe
  (`pv_order_rows`) zeroes the query rows of some positions `i >= 896` of a sample of at least 897 tokens, so
  every score is 0 and every `p` is exactly 1 (the running max is 0 from the first block on, every rescale
  factor exactly 1). Column 0 of every value head of that sample is 0 except `ORDER_PROBE_TINY` at key 1, +1
  at key 768 and -1 at key 896. Keys 768 and 896 lie in different key blocks of every size up to 128 and in
  the last quarter of each probe query's window (`i < 1024`), and they form one aligned block of 256: the
  ascending walk gives 0; a split of the window into 2, 3 or 4 parts, the blocks walked backwards and a tree
  over blocks give `tiny / (i + 1)`, a normal bf16 number. Only the `long` tier holds such a sample.

Both probes are pure functions of the fixture (its samples' lengths and prompts) and the logical key, so a row's
data never depends on the layout. `tests/ws1_workload/test_token_probes.py` computes every order explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .errors import WorkloadError
from .inputs import HARD_ROW_PERIOD, ORDER_PROBE_TINY, hard_row_kind

if TYPE_CHECKING:
    from .fixtures import Sample

#: The token-probe cases and the inputs each takes: an operator's input and its upstream gradient.
TOKEN_CASES: tuple[str, ...] = ("wgrad_order_tokens", "pv_order_rows")
#: Tokens per weight-gradient block (every backend's `sample_blocks_main_grad` block; one MMA K step).
WGRAD_BLOCK = 16
#: The probe elements of dW: `dW[c, c]` for these columns of the input (k) and of the upstream gradient (n),
#: the survivor-first probe in the first, the survivor-last one in the second (column 1 holds the dot-order
#: rows' survivor). Attention's probe uses column 0 of the values.
WGRAD_COLUMNS = (0, 2)
PROBE_COLUMN = 0
#: The attention probe's key positions: survivor, then the pair that fills one aligned block of 256.
PV_TINY_KEY, PV_PLUS_KEY, PV_MINUS_KEY = 1, 768, 896
#: The probe queries lie in [PV_MINUS_KEY, PV_WINDOW): there 768 stays in the last quarter of the window.
PV_WINDOW = 1024
#: Largest attention key block the probe separates the pair for (portable 64, Triton 32 to 128).
PV_MAX_KEY_BLOCK = 128
#: Slot (as `inputs.HARD_ROW_SLOT`) of the probe queries among the positions [PV_MINUS_KEY, PV_WINDOW).
PV_QUERY_SLOT = 4

Key = tuple[int, int]


@dataclass(frozen=True)
class WgradProbe:
    """Three active tokens whose products meet in `dW[column, column]`.

    `tiny_first`: the survivor sits in an earlier sample than the pair (it meets +1 alone in the correct walk,
    result 0); otherwise it sits in a later sample (the pair cancels first, result 2^-30). Faults differ in
    which of the two they can hide from: a call summed from zero hides from neither when the survivor comes
    first, a call walked backwards from zero only when it comes last.
    """

    tiny: Key
    plus: Key
    minus: Key
    column: int
    tiny_first: bool


@dataclass(frozen=True)
class PvProbe:
    """One sample's attention probe: the queries whose rows are zero (the value keys are fixed)."""

    sample_id: int
    queries: tuple[int, ...]


@dataclass(frozen=True)
class ColumnEdit:
    """What the token probes write into one logical tensor (columns of the last axis, every head).

    Columns `zero_columns` are set to 0 on every row of the samples `zero_samples` (None: of every sample),
    then `values[(key, column)]` are written; `zero_rows` are whole rows set to 0.
    """

    values: Mapping[tuple[Key, int], float] = field(default_factory=dict)
    zero_columns: tuple[int, ...] = ()
    zero_samples: frozenset[int] | None = frozenset()
    zero_rows: frozenset[Key] = frozenset()


def _ordinary(key: Key, kinds: Sequence[str]) -> bool:
    return hard_row_kind(key, kinds) is None


def _active_ordinary(smp: Sample, kinds: Sequence[str]) -> list[int]:
    return [p for p in range(smp.length) if bool(smp.active[p]) and _ordinary((smp.sample_id, p), kinds)]


def wgrad_probes(samples: Sequence[Sample], kinds: Sequence[str] = ()) -> tuple[WgradProbe, ...]:
    """The weight-gradient probes of a fixture: survivor first (column 0) and, where a later sample exists,
    survivor last (column 2); none when no sample after the first spans two 16-position blocks.

    The pair goes into the first sample (by id, not the first) whose active ordinary tokens span two 16-position
    blocks: `plus` the last such token of its first block, `minus` the first of a later block. The survivor is
    the last active ordinary token of the nearest earlier sample, or the first of the nearest later one.
    `kinds`: the hard-row kinds of the inputs involved, whose rows the probe must not touch (column 1 stays
    free too: the dot-order rows keep their survivor there).
    """
    ordered = sorted(samples, key=lambda s: s.sample_id)
    for j, smp in enumerate(ordered):
        act = _active_ordinary(smp, kinds)
        if j == 0 or not act:
            continue
        first_block = act[0] // WGRAD_BLOCK
        later = [p for p in act if p // WGRAD_BLOCK > first_block]
        if not later:
            continue
        plus = (smp.sample_id, max(p for p in act if p // WGRAD_BLOCK == first_block))
        minus = (smp.sample_id, later[0])
        before = [(e.sample_id, _active_ordinary(e, kinds)) for e in reversed(ordered[:j])]
        after = [(e.sample_id, _active_ordinary(e, kinds)) for e in ordered[j + 1 :]]
        earlier = next(((sid, pos[-1]) for sid, pos in before if pos), None)
        if earlier is None:
            continue
        out = [WgradProbe(earlier, plus, minus, WGRAD_COLUMNS[0], True)]
        following = next(((sid, pos[0]) for sid, pos in after if pos), None)
        if following is not None:
            out.append(WgradProbe(following, plus, minus, WGRAD_COLUMNS[1], False))
        return tuple(out)
    return ()


def wgrad_probes_for(
    samples: Sequence[Sample], inputs: Sequence[str], hard_rows: Mapping[str, Sequence[str]]
) -> tuple[WgradProbe, ...]:
    """`wgrad_probes` for the inputs a case edits: their hard-row kinds are the rows the probe must avoid."""
    kinds = sorted({k for item in inputs for k in hard_rows.get(item, ())})
    return wgrad_probes(samples, kinds)


def pv_probes(samples: Sequence[Sample]) -> tuple[PvProbe, ...]:
    """The attention probes: one per sample long enough to hold a probe query (length > PV_MINUS_KEY)."""
    out = []
    for smp in sorted(samples, key=lambda s: s.sample_id):
        queries = tuple(
            p
            for p in range(PV_MINUS_KEY, min(smp.length, PV_WINDOW))
            if (smp.sample_id + p) % HARD_ROW_PERIOD == PV_QUERY_SLOT
        )
        if queries:
            out.append(PvProbe(smp.sample_id, queries))
    return tuple(out)


def _role(item: str) -> str:
    return "upstream" if item.endswith(".upstream") else "input"


def token_edits(
    samples: Sequence[Sample],
    cases: Mapping[str, Sequence[str]],
    hard_rows: Mapping[str, Sequence[str]],
) -> dict[str, ColumnEdit]:
    """Operator input -> the edit its token probes make, for a fixture's samples.

    `cases`: token case -> the inputs it names (the manifest's `hard_cases`); `hard_rows`: input -> its row
    kinds. A case whose probe the fixture cannot hold edits nothing (the presence check reports it).
    """
    edits: dict[str, ColumnEdit] = {}
    for case, inputs in cases.items():
        if case == "wgrad_order_tokens":
            probes = wgrad_probes_for(samples, inputs, hard_rows)
            if not probes:
                continue
            cols = tuple(p.column for p in probes)
            for item in inputs:
                values: dict[tuple[Key, int], float] = {}
                for p in probes:
                    if _role(item) == "upstream":
                        for key, value in ((p.tiny, ORDER_PROBE_TINY), (p.plus, 1.0), (p.minus, -1.0)):
                            values[(key, p.column)] = value
                    else:
                        values.update(
                            dict.fromkeys(((p.tiny, p.column), (p.plus, p.column), (p.minus, p.column)), 1.0)
                        )
                if _role(item) == "upstream":
                    edits[item] = ColumnEdit(values=values)
                else:
                    edits[item] = ColumnEdit(values=values, zero_columns=cols, zero_samples=None)
        elif case == "pv_order_rows":
            pv = pv_probes(samples)
            if not pv:
                continue
            for item in inputs:
                if item.endswith(".q"):
                    zero = frozenset((p.sample_id, q) for p in pv for q in p.queries)
                    edits[item] = ColumnEdit(zero_rows=zero)
                else:
                    vals: dict[tuple[Key, int], float] = {}
                    for p in pv:
                        vals[((p.sample_id, PV_TINY_KEY), PROBE_COLUMN)] = ORDER_PROBE_TINY
                        vals[((p.sample_id, PV_PLUS_KEY), PROBE_COLUMN)] = 1.0
                        vals[((p.sample_id, PV_MINUS_KEY), PROBE_COLUMN)] = -1.0
                    edits[item] = ColumnEdit(
                        values=vals,
                        zero_columns=(PROBE_COLUMN,),
                        zero_samples=frozenset(p.sample_id for p in pv),
                    )
        else:
            raise WorkloadError(f"unknown token probe case {case!r} (known: {', '.join(TOKEN_CASES)})")
    return edits


def apply_edit(x: torch.Tensor, keys: Sequence[Any], edit: ColumnEdit | None) -> torch.Tensor:
    """`x` (rows in the order of `keys`) with the edit written in (a copy; `x` itself is left alone).

    Values are written in x's dtype: 1, -1 and 2^-30 are exact in bf16 and fp32.
    """
    if edit is None:
        return x
    out = x.clone()
    index = {(int(k[0]), int(k[1])): r for r, k in enumerate(keys) if isinstance(k, (tuple, list))}
    cols = list(edit.zero_columns)
    if cols and edit.zero_samples is None:
        out[..., cols] = 0
    elif cols and edit.zero_samples:
        rows = [r for key, r in index.items() if key[0] in edit.zero_samples]
        for c in cols:
            out[rows, ..., c] = 0
    for (key, column), value in edit.values.items():
        if key in index:
            out[index[key], ..., column] = value
    for key in edit.zero_rows:
        if key in index:
            out[index[key]] = 0
    return out
