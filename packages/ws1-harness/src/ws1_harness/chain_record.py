"""The records `ws1 chain` writes (no torch: the verdict side of the harness can read them).

One `ChainCell` per (profile, model, layers, tier): the judgments of the whole model on that tier's fixture, the
first divergence when one failed, and what the rollout did. A `ChainResult` holds the cells of one run with
provenance and the fingerprints of the contract and manifest it was judged against. `to_json` gives plain JSON;
docs/chain.md describes every field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CHAIN_SCHEMA = "ws1.chain/1"

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
    """The chain verdict of one tier: ``status`` is ``pass`` iff every judged judgment passed."""

    profile: str
    model: str
    layers: int
    tier: str
    case_id: str
    active_tokens: int
    judgments: tuple[ChainJudgment, ...]
    first_divergence: Mapping[str, Any] | None = None
    rollout: Mapping[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "pass" if all(j.passed for j in self.judgments if j.judged) else "fail"

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
            "status": self.status,
            "failed": list(self.failed),
            "active_tokens": self.active_tokens,
            "judgments": [j.to_json() for j in self.judgments],
            "first_divergence": None if self.first_divergence is None else dict(self.first_divergence),
            "rollout": dict(self.rollout),
        }


@dataclass(frozen=True)
class ChainResult:
    """One `ws1 chain` run: its cells, what they were judged against, and where they came from."""

    profile: str
    model: str
    layers: int
    dtype: str
    device: str
    stock: bool
    settings: Mapping[str, Any]
    workload: Mapping[str, Any]
    contract: Mapping[str, Any]
    provenance: Mapping[str, Any]
    created: str
    cells: Sequence[ChainCell]

    @property
    def verdict(self) -> str:
        return "pass" if self.cells and all(c.status == "pass" for c in self.cells) else "fail"

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": CHAIN_SCHEMA,
            "created": self.created,
            "profile": self.profile,
            "model": self.model,
            "layers": self.layers,
            "dtype": self.dtype,
            "device": self.device,
            "stock": self.stock,
            "verdict": self.verdict,
            "settings": dict(self.settings),
            "workload": dict(self.workload),
            "contract": dict(self.contract),
            "provenance": dict(self.provenance),
            "cells": [c.to_json() for c in self.cells],
        }
