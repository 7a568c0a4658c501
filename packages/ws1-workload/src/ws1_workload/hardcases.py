"""The hard cases of the workload: what kernels get wrong, named in the manifest and proven present.

A gate can only catch a fault its inputs exercise. An embedding backward that counts a repeated id once passes on
fixtures without a repeated id; a norm that ignores eps passes when every row has an RMS near 1; a kernel that
mishandles a block edge passes when no sample length sits next to it. The manifest names each such case
(`fixtures.hard_cases`: what it is, the tiers that must hold it, its parameters); this module parses them and
checks, on the built fixtures and inputs, that every case is present in every tier it lists. An unknown case
name is refused: a name without a check would be a claim nobody verifies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .errors import WorkloadError
from .inputs import HARD_ROW_KINDS, HARD_ROW_SLOT
from .token_probes import TOKEN_CASES

#: Cases about the token ids, lengths and layouts of a fixture.
FIXTURE_CASES: tuple[str, ...] = (
    "repeated_id_within_sample",
    "repeated_id_across_samples",
    "id_zero",
    "id_last",
    "block_edge_lengths",
    "single_row_call",
    "padded_layouts_pad",
    "decode_crosses_key_block",
)
#: Cases about the rows of operator inputs (the kinds `logical_tensor` generates).
ROW_CASES: tuple[str, ...] = HARD_ROW_KINDS
#: Cases that place a few tokens of a fixture (`token_probes`): order probes of reductions over tokens.
KNOWN_CASES: tuple[str, ...] = FIXTURE_CASES + ROW_CASES + TOKEN_CASES
_NEEDS_INPUTS = frozenset(ROW_CASES) | frozenset(TOKEN_CASES)
_NEEDS_BLOCKS = frozenset({"block_edge_lengths", "decode_crosses_key_block"})


@dataclass(frozen=True)
class HardCaseSpec:
    """One hard case as the manifest states it."""

    name: str
    what: str
    tiers: tuple[str, ...]
    blocks: tuple[int, ...] = ()
    inputs: tuple[str, ...] = ()


def parse_hard_cases(
    doc: Mapping[str, Any], operators: Sequence[str], source: str
) -> Mapping[str, HardCaseSpec]:
    """The schema-validated `fixtures.hard_cases` mapping as specs; unknown names and misplaced keys refused."""
    out: dict[str, HardCaseSpec] = {}
    for name, case in doc.items():
        where = f"$.fixtures.hard_cases.{name}"
        if name not in KNOWN_CASES:
            raise WorkloadError(f"{where}: unknown hard case (known: {', '.join(KNOWN_CASES)})", source)
        blocks = tuple(int(b) for b in case.get("blocks", ()))
        inputs = tuple(str(i) for i in case.get("inputs", ()))
        if (name in _NEEDS_BLOCKS) != bool(blocks):
            need = "needs" if name in _NEEDS_BLOCKS else "takes no"
            raise WorkloadError(f"{where}: this case {need} 'blocks'", source)
        if (name in _NEEDS_INPUTS) != bool(inputs):
            need = "needs" if name in _NEEDS_INPUTS else "takes no"
            raise WorkloadError(f"{where}: this case {need} 'inputs'", source)
        for item in inputs:
            if item.split(".", 1)[0] not in operators:
                raise WorkloadError(f"{where}: input {item!r} names no chain operator", source)
        out[name] = HardCaseSpec(name, str(case["what"]), tuple(case["tiers"]), blocks, inputs)
    slots: dict[tuple[str, int], str] = {}
    for spec in out.values():
        if spec.name in TOKEN_CASES:
            _check_token_inputs(spec, source)
            continue
        for item in spec.inputs:
            other = slots.setdefault((item, HARD_ROW_SLOT[spec.name]), spec.name)
            if other != spec.name:  # one row kind per slot: the second would never be generated
                raise WorkloadError(
                    f"$.fixtures.hard_cases.{spec.name}: input {item!r} already holds {other}, which takes the "
                    "same rows",
                    source,
                )
    return MappingProxyType(out)


def _check_token_inputs(spec: HardCaseSpec, source: str) -> None:
    """A token probe edits an input and what meets it: dW needs each operator's input with its upstream
    gradient, attention's probe its query and its values."""
    where = f"$.fixtures.hard_cases.{spec.name}.inputs"
    by_op: dict[str, set[str]] = {}
    for item in spec.inputs:
        op, _, name = item.partition(".")
        by_op.setdefault(op, set()).add(name)
    for op, names in sorted(by_op.items()):
        if spec.name == "wgrad_order_tokens":
            ok = "upstream" in names and len(names) == 2
            want = "one input and its upstream"
        else:
            ok = names == {"q", "v"}
            want = "q and v"
        if not ok:
            raise WorkloadError(f"{where}: {op} names {sorted(names)}; the probe needs {want}", source)


def token_cases_of(cases: Mapping[str, HardCaseSpec]) -> Mapping[str, tuple[str, ...]]:
    """Token probe case -> the operator inputs it edits."""
    return MappingProxyType({c.name: c.inputs for c in cases.values() if c.name in TOKEN_CASES})


def hard_rows_of(cases: Mapping[str, HardCaseSpec]) -> Mapping[str, tuple[str, ...]]:
    """Operator input (`<operator>.<input>`) -> the kinds of hard row it holds."""
    rows: dict[str, list[str]] = {}
    for case in cases.values():
        if case.name in ROW_CASES:
            for item in case.inputs:
                rows.setdefault(item, []).append(case.name)
    return MappingProxyType({k: tuple(v) for k, v in rows.items()})
