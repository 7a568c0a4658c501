"""The records `ws1 chain` writes (no torch: the verdict side of the harness can read them).

One `ChainCell` per (profile, model, layers, tier): the judgments of the whole model on that tier's fixture, the
first divergence when one failed, and what the rollout did. `ChainCell.to_json` is the record `ws1 chain` writes
into the `chain_cells` of a ws1 evidence file (contracts/evidence.schema.json), where `ws1 gate` re-judges it
(ws1_harness.verdict.chain_rejudge). A `ChainResult` holds the cells of one run with what they were judged against.
docs/chain.md describes every field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The judgments of a chain cell, in the order they are reported.
JUDGMENTS: tuple[str, ...] = (
    "parity",
    "logprob_accuracy",
    "gradient_invariance",
    "gradient_accuracy",
    "op_watch",
)


@dataclass(frozen=True)
class ChainJudgment:
    """One judgment of a cell. ``judged`` is False for what is recorded but not gated (the stock baseline's
    op watch); ``passed`` is then still reported. ``detail`` is JSON-ready."""

    name: str
    passed: bool
    judged: bool = True
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "judged": self.judged, "detail": dict(self.detail)}


@dataclass(frozen=True)
class ChainCell:
    """The chain verdict of one tier: ``status`` is ``green`` iff every judged judgment passed (the words of a
    matrix cell, so one evidence file speaks one language). ``profile`` is the label the evidence uses
    (``<profile>@<arch>`` on a GPU); ``device`` is where the model ran (``type``, ``name``, ``capability``)."""

    profile: str
    model: str
    layers: int
    tier: str
    case_id: str
    active_tokens: int
    judgments: tuple[ChainJudgment, ...]
    first_divergence: Mapping[str, Any] | None = None
    rollout: Mapping[str, Any] = field(default_factory=dict)
    dtype: str = "bf16"
    device: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "cpu", "name": "cpu", "capability": None}
    )
    stock: bool = False
    #: what the run was given (seed, training layouts, chunk size, sampler, upstream gradient)
    settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "green" if all(j.passed for j in self.judgments if j.judged) else "red"

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(j.name for j in self.judgments if j.judged and not j.passed)

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "model": self.model,
            "layers": self.layers,
            "tier": self.tier,
            "case_id": self.case_id,
            "dtype": self.dtype,
            "device": dict(self.device),
            "stock": self.stock,
            "status": self.status,
            "failed": list(self.failed),
            "active_tokens": self.active_tokens,
            "judgments": [j.to_json() for j in self.judgments],
            "first_divergence": None if self.first_divergence is None else dict(self.first_divergence),
            "rollout": dict(self.rollout),
            "settings": dict(self.settings),
        }


@dataclass(frozen=True)
class ChainResult:
    """One `ws1 chain` run: its cells, what they were judged against, and the run's settings (the writer adds
    provenance and the cells digest when it puts the cells into an evidence file)."""

    profile: str
    model: str
    layers: int
    dtype: str
    device: str
    stock: bool
    settings: Mapping[str, Any]
    workload: Mapping[str, Any]
    contract: Mapping[str, Any]
    cells: Sequence[ChainCell]

    @property
    def verdict(self) -> str:
        return "pass" if self.cells and all(c.status == "green" for c in self.cells) else "fail"


def thresholds_record(th: Any) -> dict[str, Any]:
    """The contract's chain aggregates (`ws1_contract.AggregateThresholds`) in the shape a chain cell records
    them: written by `ws1 chain`, recomputed by the gate from its own contract, so the two must be one shape."""
    return {
        "dtype": th.dtype,
        "max_abs_dlogp": th.max_abs_dlogp,
        "approx_kl0": th.approx_kl0,
        "clipfrac0": th.clipfrac0,
        "clip_low": th.clip_low,
        "clip_high": th.clip_high,
        "status": th.status,
        "calibration": None if th.calibration is None else th.calibration.status,
    }


def gradient_thresholds_record(th: Any) -> dict[str, Any]:
    """The contract's chain gradient thresholds (``grad_rel_l2``, ``grad_rel_max_abs`` of
    `ws1_contract.AggregateThresholds`) as the gradient_accuracy judgment of a chain cell records them; the gate
    recomputes the same record from its own contract."""
    return {
        "dtype": th.dtype,
        "grad_rel_l2": th.grad_rel_l2,
        "grad_rel_max_abs": th.grad_rel_max_abs,
        "status": th.status,
        "calibration": None if th.calibration is None else th.calibration.status,
    }
