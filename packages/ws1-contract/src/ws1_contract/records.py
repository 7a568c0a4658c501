"""Frozen records the resolver hands out.

They are values, not views of the contract document: a caller can keep, hash and serialise them, and nothing it
does can change the thresholds another caller resolves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CalibrationRecord:
    """Where a threshold came from: `provisional` (published figures) or `calibrated` (measured by ws1)."""

    status: str
    source: str
    date: str
    active_tokens: int
    seeds: int

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "source": self.source,
            "date": self.date,
            "active_tokens": self.active_tokens,
            "seeds": self.seeds,
        }


@dataclass(frozen=True)
class ToleranceSpec:
    """The rule for one (judgment, op class, dtype) cell.

    mode "tolerance": pass iff `abs(c - r) <= atol + rtol * abs(r)` element-wise.
    mode "bitwise": pass iff the raw bits are equal (atol = rtol = 0, calibration None).
    `optional` is True for an `optional` cell (fp16): it resolves, but the gate may leave it unjudged.
    """

    judgment: str
    op_class: str
    dtype: str
    status: str
    mode: str
    atol: float
    rtol: float
    optional: bool
    calibration: CalibrationRecord | None

    def to_json(self) -> dict[str, Any]:
        return {
            "judgment": self.judgment,
            "op_class": self.op_class,
            "dtype": self.dtype,
            "status": self.status,
            "mode": self.mode,
            "atol": self.atol,
            "rtol": self.rtol,
            "optional": self.optional,
            "calibration": None if self.calibration is None else self.calibration.to_json(),
        }


@dataclass(frozen=True)
class ComparisonRole:
    """Which two sides a judgment compares: `left` is judged against `right`."""

    left: str
    right: str

    def to_json(self) -> dict[str, str]:
        return {"left": self.left, "right": self.right}


@dataclass(frozen=True)
class AggregateThresholds:
    """Chain-level logprob thresholds for one dtype, d = logp_left - logp_right over the active tokens.

    Pass iff max(abs(d)) <= max_abs_dlogp, mean(exp(d)-1-d) <= approx_kl0 and the fraction of exp(d) outside
    [clip_low, clip_high] <= clipfrac0. A non-finite d or an empty active set is a failure, never a pass.

    The gradient thresholds bound every parameter gradient g of the whole model against the fp32 reference's
    g_ref: norm2(g - g_ref) / norm2(g_ref) <= grad_rel_l2 and max|g - g_ref| / max|g_ref| <= grad_rel_max_abs
    (None only in a record built by hand: the contract requires both in scope).
    """

    max_abs_dlogp: float
    approx_kl0: float
    clipfrac0: float
    grad_rel_l2: float | None = None
    grad_rel_max_abs: float | None = None
    clip_low: float = 0.8
    clip_high: float = 1.2
    dtype: str = ""
    status: str = "applicable"
    optional: bool = False
    calibration: CalibrationRecord | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "status": self.status,
            "optional": self.optional,
            "max_abs_dlogp": self.max_abs_dlogp,
            "approx_kl0": self.approx_kl0,
            "clipfrac0": self.clipfrac0,
            "grad_rel_l2": self.grad_rel_l2,
            "grad_rel_max_abs": self.grad_rel_max_abs,
            "clip_low": self.clip_low,
            "clip_high": self.clip_high,
            "calibration": None if self.calibration is None else self.calibration.to_json(),
        }
