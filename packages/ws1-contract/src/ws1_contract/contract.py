"""The loaded numerical contract: validated once, then resolved by lookup.

`load_contract` runs the schema, then the semantic rules; only a contract that passes both becomes a Contract.
Every cell is turned into a frozen ToleranceSpec at load time, so `resolve` is a dictionary lookup that either
returns the cell's own spec or raises: it never falls back to another row, dtype or judgment.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from . import vocabulary as v
from .canonical import sha256_fingerprint
from .documents import parse_json, read_json
from .errors import ContractError
from .records import AggregateThresholds, CalibrationRecord, ComparisonRole, ToleranceSpec
from .schemas import validate_document
from .semantics import check_semantics

SHIPPED_SOURCE = "ws1_contract/data/tolerance.json"
_ARCH = re.compile(r"^[A-Za-z0-9_.+-]+$")


def _calibration(record: Mapping[str, Any] | None) -> CalibrationRecord | None:
    if record is None:
        return None
    return CalibrationRecord(
        status=record["status"],
        source=record["source"],
        date=record["date"],
        active_tokens=record["active_tokens"],
        seeds=record["seeds"],
    )


def _name_error(kind: str, value: object, known: tuple[str, ...]) -> ContractError:
    return ContractError(f"unknown {kind} {value!r} (known: {', '.join(known)})", "resolve")


def _check_schema_version(document: Any, source: str) -> None:
    """A legacy or future contract is refused by its version first, not by whichever key it lacks.

    A legacy contract without per-judgment rows once let gradient checks use forward thresholds.
    """
    if isinstance(document, Mapping) and "schema_version" in document:
        found = document["schema_version"]
        if found != v.SCHEMA_VERSION or isinstance(found, bool):
            raise ContractError(
                f"unsupported schema_version {found!r}: this ws1_contract reads version {v.SCHEMA_VERSION} only",
                f"{source}: $.schema_version",
            )


class Contract:
    """A validated numerical contract (read-only). Build it with `load_contract` or `Contract.from_document`."""

    def __init__(self, document: Mapping[str, Any], source: str) -> None:
        """Validate `document` (schema, then semantic rules) and index its cells; raise ContractError."""
        _check_schema_version(document, source)
        validate_document(document, "tolerance", source)
        check_semantics(document, source)
        self._doc: dict[str, Any] = copy.deepcopy(dict(document))
        self.source = source
        self.fingerprint: str = sha256_fingerprint(self._doc)
        self._cells: dict[tuple[str, str, str], Mapping[str, Any]] = {
            (judgment, op_class, dtype): self._doc["judgments"][judgment][op_class][dtype]
            for judgment in v.JUDGMENTS
            for op_class in v.OP_CLASSES
            for dtype in v.DTYPES
        }

    @classmethod
    def from_document(cls, document: Mapping[str, Any], source: str = "<document>") -> Contract:
        """Validate an in-memory contract document (used by tests and tools that build contracts)."""
        return cls(document, source)

    # -- identity ---------------------------------------------------------------------------------------------

    @property
    def judgments(self) -> tuple[str, ...]:
        return v.JUDGMENTS

    @property
    def op_classes(self) -> tuple[str, ...]:
        return v.OP_CLASSES

    @property
    def dtypes(self) -> tuple[str, ...]:
        return v.DTYPES

    @property
    def schema_version(self) -> int:
        return int(self._doc["schema_version"])

    @property
    def revision(self) -> int:
        return int(self._doc["revision"])

    @property
    def contract_id(self) -> str:
        return str(self._doc["contract_id"])

    @property
    def policy(self) -> dict[str, Any]:
        """The dtype policy (a copy)."""
        return copy.deepcopy(self._doc["policy"])

    def document(self) -> dict[str, Any]:
        """The whole validated document (a copy): what the fingerprint covers."""
        return copy.deepcopy(self._doc)

    # -- resolution -------------------------------------------------------------------------------------------

    def resolve(self, judgment: str, op_class: str, dtype: str, arch: str | None = None) -> ToleranceSpec:
        """Return the cell's own ToleranceSpec; raise ContractError for unknown, not_applicable or out-of-scope.

        `arch` is accepted so callers can state where they run, but the contract holds one shared set of rows
        for every backend profile (policy.per_backend_overrides is false): it never changes the answer.
        """
        if judgment not in v.JUDGMENTS:
            raise _name_error("judgment", judgment, v.JUDGMENTS)
        if op_class not in v.OP_CLASSES:
            raise _name_error("op class", op_class, v.OP_CLASSES)
        if dtype not in v.DTYPES:
            raise _name_error("dtype", dtype, v.DTYPES)
        if arch is not None and not (isinstance(arch, str) and _ARCH.fullmatch(arch)):
            raise ContractError(f"bad arch {arch!r}", "resolve")
        cell = self._cells[(judgment, op_class, dtype)]
        where = f"resolve({judgment}, {op_class}, {dtype})"
        status = cell["status"]
        if status == v.STATUS_NOT_APPLICABLE:
            raise ContractError(f"cell is not_applicable: {cell['reason']}", where)
        if status == v.STATUS_OUT_OF_SCOPE:
            reason = cell.get("reason") or "out of scope"
            raise ContractError(f"cell is out_of_scope: {reason}", where)
        return ToleranceSpec(
            judgment=judgment,
            op_class=op_class,
            dtype=dtype,
            status=status,
            mode=cell["mode"],
            atol=float(cell["atol"]),
            rtol=float(cell["rtol"]),
            optional=status == v.STATUS_OPTIONAL,
            calibration=_calibration(cell.get("calibration")),
        )

    def role(self, judgment: str) -> ComparisonRole:
        """The two sides a judgment (or "chain_parity") compares: left is judged against right."""
        if judgment not in v.ROLE_NAMES:
            raise _name_error("judgment", judgment, v.ROLE_NAMES)
        entry = self._doc["roles"][judgment]
        return ComparisonRole(left=entry["left"], right=entry["right"])

    def forbidden_roles(self) -> tuple[ComparisonRole, ...]:
        """Pairs no judgment may compare (in either order)."""
        return tuple(ComparisonRole(e["left"], e["right"]) for e in self._doc["forbidden_roles"])

    def aggregates(self, dtype: str) -> AggregateThresholds:
        """Chain-level logprob thresholds for `dtype`; raise ContractError for unknown or out-of-scope dtypes."""
        if dtype not in v.DTYPES:
            raise _name_error("dtype", dtype, v.DTYPES)
        chain = self._doc["chain"]
        entry = chain["thresholds"][dtype]
        status = entry["status"]
        if status not in v.IN_SCOPE_STATUSES:
            raise ContractError(
                f"chain thresholds are {status}: {entry.get('reason') or status}", f"aggregates({dtype})"
            )
        return AggregateThresholds(
            max_abs_dlogp=float(entry["max_abs_dlogp"]),
            approx_kl0=float(entry["approx_kl0"]),
            clipfrac0=float(entry["clipfrac0"]),
            grad_rel_l2=float(entry["grad_rel_l2"]),
            grad_rel_max_abs=float(entry["grad_rel_max_abs"]),
            clip_low=float(chain["clip_interval"]["low"]),
            clip_high=float(chain["clip_interval"]["high"]),
            dtype=dtype,
            status=status,
            optional=status == v.STATUS_OPTIONAL,
            calibration=_calibration(entry.get("calibration")),
        )

    def __repr__(self) -> str:
        return f"Contract({self.contract_id} r{self.revision}, {self.fingerprint}, source={self.source!r})"


def _shipped_document() -> Any:
    entry = resources.files("ws1_contract").joinpath("data", "tolerance.json")
    if not entry.is_file():
        raise ContractError("the shipped contract is missing from the package data", SHIPPED_SOURCE)
    return parse_json(entry.read_text(encoding="utf-8"), SHIPPED_SOURCE)


def load_contract(path: str | Path | None = None) -> Contract:
    """Load and validate a contract file (None: the contract shipped with this package); raise ContractError."""
    if path is None:
        return Contract(_shipped_document(), SHIPPED_SOURCE)
    return Contract(read_json(path), str(path))
