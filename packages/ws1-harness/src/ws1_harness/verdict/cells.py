"""Matrix cells: their key, their record, and the expected cell set derived from the axes.

Tests and gates of earlier systems hard-coded how many cells a matrix has. Here the expected set is always
computed from the axes (profiles × operators × tiers × judgments) and the manifest's operator specs, which say
which cells are layout-only (`na` with reason `layout_only`), which gradient cells do not apply (`na` with
reason `not_differentiable`) and which operators are optional (may be absent, or `na` with
`optional_not_provided`). No torch here: the gate uses this module.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ws1_harness.errors import HarnessError
from ws1_harness.verdict.status import CellStatus, ReasonCode, StatusError, check_status_reason

GRADIENT_JUDGMENTS: frozenset[str] = frozenset({"gradient_accuracy", "gradient_invariance"})


def json_safe(value: Any) -> Any:
    """Strict-JSON copy of a diagnostics value: non-finite floats become "nan", "inf", "-inf"; tuples become
    lists. JSON has no NaN/Inf, and a diagnostic must never make an evidence file unwritable."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


class CellError(HarnessError, ValueError):
    """A malformed cell record or operator spec."""


@dataclass(frozen=True, order=True)
class CellKey:
    """One point of the matrix."""

    profile: str
    operator: str
    tier: str
    judgment: str

    def label(self) -> str:
        return f"{self.profile}/{self.operator}/{self.tier}/{self.judgment}"


@dataclass(frozen=True)
class OperatorInfo:
    """A torch-free copy of an operator spec, as recorded in the evidence axes."""

    name: str
    op_class: str | None
    differentiable: bool
    optional: bool
    layout_only: bool

    @classmethod
    def of(cls, spec: Any) -> OperatorInfo:
        """From an OperatorSpec-like object or a mapping with the same fields."""
        get = spec.get if isinstance(spec, Mapping) else (lambda k: getattr(spec, k))
        try:
            return cls(
                name=str(get("name")),
                op_class=get("op_class"),
                differentiable=bool(get("differentiable")),
                optional=bool(get("optional")),
                layout_only=bool(get("layout_only")),
            )
        except (AttributeError, KeyError) as exc:
            raise CellError(f"operator spec: missing field {exc}") from None

    def to_json(self) -> dict[str, Any]:
        return {
            "op_class": self.op_class,
            "differentiable": self.differentiable,
            "optional": self.optional,
            "layout_only": self.layout_only,
        }


CHECK_MODES: frozenset[str] = frozenset({"tolerance", "bitwise"})


def check_record(tensor: str, mode: str, comparison: Mapping[str, Any]) -> dict[str, Any]:
    """The verdict-bearing record of one comparison (a `Comparison.to_json()` dict) of one tensor.

    The gate does not take a layout's `passed` on trust: it re-judges every check from these figures (mismatch
    counts, the thresholds used) against the contract the evidence names. They are copied out of the
    comparator's free-form diagnostics into a fixed shape so that the schema can type them.
    """
    if mode not in CHECK_MODES:
        raise CellError(f"check {tensor}: mode must be tolerance or bitwise, got {mode!r}")
    diag = comparison.get("diagnostics", {})

    def number(name: str) -> Any:
        value = diag.get(name)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    counts = {name: number(name) for name in ("n_total", "n_mismatch", "n_non_finite_mismatch")}
    return {
        "tensor": tensor,
        "mode": mode,
        "passed": bool(comparison["passed"]),
        "reason_code": comparison.get("reason_code"),
        "n_total": None if counts["n_total"] is None else int(counts["n_total"]),
        "n_mismatch": None if counts["n_mismatch"] is None else int(counts["n_mismatch"]),
        "n_non_finite_mismatch": (
            None
            if mode == "bitwise" or counts["n_non_finite_mismatch"] is None
            else int(counts["n_non_finite_mismatch"])
        ),
        "atol": number("atol") if mode == "tolerance" else None,
        "rtol": number("rtol") if mode == "tolerance" else None,
    }


@dataclass(frozen=True)
class LayoutResult:
    """The outcome of one judgment under one physical layout (e.g. forward_invariance under `padded_left`).

    `checks` holds one `check_record` per compared tensor: what the gate re-judges `passed` from. Accuracy
    judgments record one result for the canonical layout, invariance judgments one per compared layout.
    """

    layout: str
    passed: bool
    reason_code: str | None = None
    diagnostics: Mapping[str, Any] = field(default_factory=dict)
    checks: tuple[Mapping[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "passed": self.passed,
            "reason_code": self.reason_code,
            "diagnostics": json_safe(dict(self.diagnostics)),
            "checks": [dict(c) for c in self.checks],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LayoutResult:
        return cls(
            d["layout"],
            d["passed"],
            d.get("reason_code"),
            dict(d.get("diagnostics", {})),
            tuple(dict(c) for c in d.get("checks", ())),
        )


@dataclass(frozen=True)
class Cell:
    """The record of one executed (or explained) matrix cell."""

    key: CellKey
    status: CellStatus
    reason_code: str | None
    required: bool
    diagnostics: Mapping[str, Any] = field(default_factory=dict)
    observed_kernels: tuple[str, ...] = ()
    observed_ops: tuple[str, ...] = ()
    wall_s: float = 0.0
    layouts: tuple[LayoutResult, ...] = ()
    shard: int | None = None
    # where the cell's tensors lived, read from the candidate's outputs: {"type", "name", "capability"};
    # None when nothing ran (unavailable candidate, timeout)
    device: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", CellStatus(self.status))
        try:
            check_status_reason(self.status, self.reason_code)
        except StatusError as exc:
            raise CellError(f"cell {self.key.label()}: {exc}") from None
        if self.wall_s < 0:
            raise CellError(f"cell {self.key.label()}: negative wall_s")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "profile": self.key.profile,
            "operator": self.key.operator,
            "tier": self.key.tier,
            "judgment": self.key.judgment,
            "status": self.status.value,
            "reason_code": self.reason_code,
            "required": self.required,
            "diagnostics": json_safe(dict(self.diagnostics)),
            "observed_kernels": sorted(self.observed_kernels),
            "observed_ops": sorted(self.observed_ops),
            "wall_s": float(self.wall_s),
            "layouts": [lr.to_json() for lr in self.layouts],
            "device": None if self.device is None else dict(self.device),
        }
        if self.shard is not None:
            out["shard"] = self.shard
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Cell:
        return cls(
            key=cell_key_of(d),
            status=CellStatus(d["status"]),
            reason_code=d.get("reason_code"),
            required=bool(d["required"]),
            diagnostics=dict(d.get("diagnostics", {})),
            observed_kernels=tuple(d.get("observed_kernels", ())),
            observed_ops=tuple(d.get("observed_ops", ())),
            wall_s=float(d.get("wall_s", 0.0)),
            layouts=tuple(LayoutResult.from_json(x) for x in d.get("layouts", ())),
            shard=d.get("shard"),
            device=d.get("device"),
        )


def split_arch(label: str) -> tuple[str, str | None]:
    """`cuda_bf16@sm86-proxy` -> (`cuda_bf16`, `sm86-proxy`); a profile without an arch (the CPU shard's
    `portable_cpu`) -> (`portable_cpu`, None). The label is what names a cell's arch: a proxy shard's cells record
    the device they ran on (sm_90), not the arch they stand for."""
    base, sep, arch = label.partition("@")
    return base, (arch if sep and arch else None)


def cell_key_of(d: Mapping[str, Any]) -> CellKey:
    """The key of a cell given as a JSON dict."""
    return CellKey(d["profile"], d["operator"], d["tier"], d["judgment"])


@dataclass(frozen=True)
class ExpectedCell:
    """What the gate expects at one key: whether it is required and, if it must be `na`, the reason."""

    key: CellKey
    required: bool
    na_reason: str | None = None


def expected_na_reason(judgment: str, info: OperatorInfo) -> str | None:
    """The `na` reason a cell must carry by construction (layout-only op, gradient of a non-differentiable op)."""
    if info.layout_only:
        return ReasonCode.LAYOUT_ONLY.value
    if judgment in GRADIENT_JUDGMENTS and not info.differentiable:
        return ReasonCode.NOT_DIFFERENTIABLE.value
    return None


def operator_infos(operator_specs: Mapping[str, Any] | Iterable[Any]) -> dict[str, OperatorInfo]:
    """Normalise operator specs (a name→spec mapping or an iterable of specs) to OperatorInfo by name."""
    infos: dict[str, OperatorInfo] = {}
    if isinstance(operator_specs, Mapping):
        for name, spec in operator_specs.items():
            if isinstance(spec, Mapping) and "name" not in spec:
                spec = {"name": name, **spec}
            info = OperatorInfo.of(spec)
            if info.name != name:
                raise CellError(f"operator spec: key {name!r} holds spec named {info.name!r}")
            infos[name] = info
    else:
        for spec in operator_specs:
            info = OperatorInfo.of(spec)
            infos[info.name] = info
    return infos


def expected_cells(
    profiles: Sequence[str],
    operators: Sequence[str],
    tiers: Sequence[str],
    judgments: Sequence[str],
    operator_specs: Mapping[str, Any] | Iterable[Any],
) -> dict[CellKey, ExpectedCell]:
    """The full expected cell set: the product of the axes, each cell marked required or optional.

    Every operator on the axis must have a spec (CellError otherwise): an operator the manifest does not know
    cannot be judged. Layout-only and not-differentiable cells are expected as `na` with their reason; cells of
    optional operators are not required.
    """
    infos = operator_infos(operator_specs)
    for axis_name, axis in (
        ("profiles", profiles),
        ("operators", operators),
        ("tiers", tiers),
        ("judgments", judgments),
    ):
        if len(set(axis)) != len(axis):
            raise CellError(f"axes: duplicate entry in {axis_name}")
    unknown = [op for op in operators if op not in infos]
    if unknown:
        raise CellError(f"axes: operators without a spec: {', '.join(unknown)}")
    out: dict[CellKey, ExpectedCell] = {}
    for profile, op, tier, judgment in itertools.product(profiles, operators, tiers, judgments):
        info = infos[op]
        key = CellKey(profile, op, tier, judgment)
        out[key] = ExpectedCell(key, required=not info.optional, na_reason=expected_na_reason(judgment, info))
    return out
