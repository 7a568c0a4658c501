"""Semantic rules of the numerical contract: what a JSON Schema cannot say clearly.

The schema fixes the shape (keys, types, enums, consts). These rules fix the meaning: the grid is complete,
invariance is raw-bit equality, fp8 is out of scope, every accuracy threshold says where it came from, no role
compares something with itself or with a non-gold reference, and the chain aggregates are the canonical ones.
Each rule raises its own ContractError naming the JSON path, so a reviewer knows exactly which row to fix.
Rules run in a fixed order and the first violation is reported (one line).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping, Sequence
from typing import Any

from . import vocabulary as v
from .documents import json_path
from .errors import ContractError

Path = Sequence[str | int]


class _Checker:
    """Holds the document and its source so that every rule reports `<source>: <json path>: <what>`."""

    def __init__(self, doc: Mapping[str, Any], source: str) -> None:
        self.doc = doc
        self.source = source

    def fail(self, message: str, path: Path) -> ContractError:
        return ContractError(message, f"{self.source}: {json_path(path)}")

    # -- the grid ---------------------------------------------------------------------------------------------

    def judgment_rows(self) -> None:
        judgments = self.doc["judgments"]
        for judgment in v.JUDGMENTS:
            if judgment not in judgments:
                if judgment == "gradient_accuracy":
                    raise self.fail(
                        "gradient_accuracy is missing: gradient rows are their own numbers and are never "
                        "inherited from forward_accuracy",
                        ["judgments"],
                    )
                raise self.fail(
                    f"judgment {judgment!r} is missing: every judgment needs its own rows", ["judgments"]
                )
            rows = judgments[judgment]
            for op_class in v.OP_CLASSES:
                if op_class not in rows:
                    if judgment == "gradient_accuracy" and op_class in judgments.get("forward_accuracy", {}):
                        raise self.fail(
                            f"gradient row {op_class!r} is missing: gradient thresholds are never inherited "
                            "from forward_accuracy",
                            ["judgments", judgment],
                        )
                    raise self.fail(f"op class row {op_class!r} is missing", ["judgments", judgment])
                for dtype in v.DTYPES:
                    if dtype not in rows[op_class]:
                        raise self.fail(
                            f"cell ({judgment}, {op_class}, {dtype}) is missing: every (judgment, op class, "
                            "dtype) cell must be present",
                            ["judgments", judgment, op_class],
                        )

    def cells(self) -> None:
        for judgment in v.JUDGMENTS:
            for op_class in v.OP_CLASSES:
                for dtype in v.DTYPES:
                    path: list[str | int] = ["judgments", judgment, op_class, dtype]
                    self.cell(judgment, dtype, self.doc["judgments"][judgment][op_class][dtype], path)

    def dtype_status(self, dtype: str, status: str, path: list[str | int]) -> None:
        """The dtype policy, cell by cell: fp8 out of scope, fp16 optional, fp32/bf16 judged."""
        if dtype == "fp8" and status != v.STATUS_OUT_OF_SCOPE:
            raise self.fail(
                f"fp8 is out of scope (policy.fp8): status must be 'out_of_scope', found {status!r}", path
            )
        if dtype == "fp16" and status not in (v.STATUS_OPTIONAL, v.STATUS_NOT_APPLICABLE):
            raise self.fail(
                f"fp16 is optional (policy.fp16): status must be 'optional' or 'not_applicable', found {status!r}",
                path,
            )
        if dtype in ("fp32", "bf16") and status not in (v.STATUS_APPLICABLE, v.STATUS_NOT_APPLICABLE):
            raise self.fail(
                f"{dtype} is always judged: status must be 'applicable' or 'not_applicable', found {status!r}",
                path,
            )

    def scope_fields(self, cell: Mapping[str, Any], keys: Sequence[str], path: list[str | int]) -> bool:
        """Common rules on status/reason/thresholds; return True when the cell is in scope (judged)."""
        status = cell["status"]
        reason = cell.get("reason")
        if status == v.STATUS_NOT_APPLICABLE and not (isinstance(reason, str) and reason.strip()):
            raise self.fail("status 'not_applicable' needs a non-empty 'reason'", [*path, "reason"])
        if status in v.IN_SCOPE_STATUSES:
            if "reason" in cell:
                raise self.fail(
                    f"'reason' is only for not_applicable/out_of_scope cells, this one is {status!r}",
                    [*path, "reason"],
                )
            for key in keys:
                value = cell[key]
                if value is None:
                    raise self.fail(f"an {status} cell needs {key!r}, found null", [*path, key])
                if isinstance(value, float) and not math.isfinite(value):
                    raise self.fail(f"{key} must be a finite number, found {value!r}", [*path, key])
                self.threshold_range(key, value, [*path, key])
            return True
        for key in keys:
            if cell[key] is not None:
                raise self.fail(
                    f"this {status} cell is never judged and carries no {key!r}: use null", [*path, key]
                )
        if "calibration" in cell:
            raise self.fail(f"this {status} cell carries no calibration record", [*path, "calibration"])
        return False

    def threshold_range(self, key: str, value: Any, path: list[str | int]) -> None:
        """A threshold lies in [0, MAX_THRESHOLD]: larger ones judge nothing, and a huge integer (10**400, which
        JSON allows) would overflow every float comparison the resolver and the comparators make."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return  # the schema names the wrong type
        try:
            as_float = float(value)
        except OverflowError:
            as_float = math.inf
        if not 0 <= as_float <= v.MAX_THRESHOLD:
            shown = repr(value)
            if isinstance(value, int) and abs(value) >= 10**6:  # str() of a huge int is slow, then refused
                shown = f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
            raise self.fail(
                f"{key} is {shown}, outside the range [0, {v.MAX_THRESHOLD}] a threshold may take "
                "(a larger one accepts any error)",
                path,
            )

    def cell(self, judgment: str, dtype: str, cell: Mapping[str, Any], path: list[str | int]) -> None:
        self.dtype_status(dtype, cell["status"], [*path, "status"])
        if not self.scope_fields(cell, ("mode", "atol", "rtol"), path):
            return
        mode = cell["mode"]
        if judgment in v.INVARIANCE_JUDGMENTS and mode != v.MODE_BITWISE:
            raise self.fail(
                f"invariance is judged on raw bits: mode must be 'bitwise', found {mode!r}", [*path, "mode"]
            )
        if mode == v.MODE_BITWISE:
            for key in ("atol", "rtol"):
                if cell[key] != 0:
                    raise self.fail(
                        f"a bitwise cell has atol = rtol = 0, found {key} = {cell[key]!r}", [*path, key]
                    )
            if "calibration" in cell:
                raise self.fail(
                    "a bitwise cell has no threshold to calibrate: remove 'calibration'",
                    [*path, "calibration"],
                )
            return
        if "calibration" not in cell:
            raise self.fail(
                "an accuracy threshold in tolerance mode needs a calibration record (source, active tokens, date, "
                "status)",
                [*path, "calibration"],
            )
        self.calibration(cell["calibration"], [*path, "calibration"])

    def calibration(self, record: Mapping[str, Any], path: list[str | int]) -> None:
        try:
            datetime.date.fromisoformat(record["date"])
        except ValueError:
            raise self.fail(
                f"calibration date {record['date']!r} is not a real date (YYYY-MM-DD)", [*path, "date"]
            ) from None
        if record["status"] == "calibrated":
            if record["active_tokens"] < v.MIN_CALIBRATION_TOKENS:
                raise self.fail(
                    f"a 'calibrated' threshold needs >= {v.MIN_CALIBRATION_TOKENS} active tokens, "
                    f"found {record['active_tokens']}",
                    [*path, "active_tokens"],
                )
            if record["seeds"] < v.MIN_CALIBRATION_SEEDS:
                raise self.fail(
                    f"a 'calibrated' threshold needs >= {v.MIN_CALIBRATION_SEEDS} seeds, found {record['seeds']}",
                    [*path, "seeds"],
                )

    # -- roles ------------------------------------------------------------------------------------------------

    def roles(self) -> None:
        forbidden = self.doc["forbidden_roles"]
        for name in v.ROLE_NAMES:
            role = self.doc["roles"][name]
            left, right = role["left"], role["right"]
            path: list[str | int] = ["roles", name]
            for index, entry in enumerate(forbidden):
                if {left, right} == {entry["left"], entry["right"]}:  # a forbidden pair in either order
                    raise self.fail(
                        f"role {left} vs {right} is forbidden (forbidden_roles[{index}]: {entry['why']})",
                        path,
                    )
            if left == right:
                raise self.fail(f"role compares {left!r} with itself", path)
            if name in v.ACCURACY_JUDGMENTS and right != v.ACCURACY_RIGHT:
                raise self.fail(
                    f"accuracy is judged against {v.ACCURACY_RIGHT!r} only, found {right!r}", [*path, "right"]
                )
            if name in v.INVARIANCE_JUDGMENTS and (left, right) != v.INVARIANCE_ROLE:
                raise self.fail(
                    f"invariance compares {v.INVARIANCE_ROLE[0]} with {v.INVARIANCE_ROLE[1]}, found {left} vs {right}",
                    path,
                )
            if name == v.CHAIN_PARITY and (left, right) != v.CHAIN_ROLE:
                raise self.fail(
                    f"chain parity compares {v.CHAIN_ROLE[0]} with {v.CHAIN_ROLE[1]}, found {left} vs {right}",
                    path,
                )

    # -- chain aggregates -------------------------------------------------------------------------------------

    def chain(self) -> None:
        chain = self.doc["chain"]
        if chain["difference"] != v.DIFFERENCE_FORMULA:
            raise self.fail(
                f"the chain difference must be {v.DIFFERENCE_FORMULA!r}, found {chain['difference']!r}",
                ["chain", "difference"],
            )
        for name, canonical in v.CHAIN_FORMULAS.items():
            found = chain["formulas"][name]
            if found != canonical:
                raise self.fail(
                    f"aggregate formula must be {canonical!r}, found {found!r}", ["chain", "formulas", name]
                )
        low, high = chain["clip_interval"]["low"], chain["clip_interval"]["high"]
        if not (low < high):
            raise self.fail(
                f"clip interval is empty: low ({low!r}) must be < high ({high!r})", ["chain", "clip_interval"]
            )
        if (low, high) != (v.CLIP_LOW, v.CLIP_HIGH):
            raise self.fail(
                f"clip interval must be [{v.CLIP_LOW}, {v.CLIP_HIGH}], found [{low!r}, {high!r}]",
                ["chain", "clip_interval"],
            )
        thresholds = chain["thresholds"]
        for dtype in v.DTYPES:
            path: list[str | int] = ["chain", "thresholds", dtype]
            if dtype not in thresholds:
                raise self.fail(
                    f"chain thresholds for {dtype!r} are missing: every dtype must be present",
                    ["chain", "thresholds"],
                )
            entry = thresholds[dtype]
            self.dtype_status(dtype, entry["status"], [*path, "status"])
            if self.scope_fields(entry, (*v.AGGREGATES, *v.GRADIENT_AGGREGATES), path):
                if "calibration" not in entry:
                    raise self.fail(
                        "chain thresholds need a calibration record (source, active tokens, date, status)",
                        [*path, "calibration"],
                    )
                self.calibration(entry["calibration"], [*path, "calibration"])


def check_semantics(doc: Mapping[str, Any], source: str) -> None:
    """Apply every semantic rule to a schema-valid contract document; raise the first violation."""
    checker = _Checker(doc, source)
    checker.judgment_rows()
    checker.cells()
    checker.roles()
    checker.chain()
