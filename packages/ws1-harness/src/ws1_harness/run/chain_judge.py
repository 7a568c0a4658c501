"""The judging step of `ws1 chain`: the contract's chain aggregates of two logprob vectors, and the normwise
figures of a gradient against the fp32 reference's.

Pure functions of recorded tensors and the contract's thresholds: the chain calls them, and the gate's
re-judgment (verdict/chain_rejudge.py) recomputes the verdicts from the numbers they record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ws1_contract import AggregateThresholds
from ws1_harness.run.chain_train import TrainRun
from ws1_harness.run.compare import bitwise_equal
from ws1_workload import Fixture


def aggregates(
    left: torch.Tensor, right: torch.Tensor, fx: Fixture, th: AggregateThresholds, *, bitwise: bool = True
) -> dict[str, Any]:
    """The contract's chain aggregates of ``d = left - right`` over the scored tokens.

    ``bitwise`` (parity): both sides must also be bit-identical, for every profile; the aggregates are
    reported and hold trivially then. Otherwise (accuracy against the fp32 reference) each aggregate must be
    within the contract's chain threshold. Non-finite differences and an empty active set fail, as the
    contract's ``chain`` section says.
    """
    scored = fx.scored
    a, b = left[scored].double(), right[scored].double()
    out: dict[str, Any] = {"tokens": int(scored.sum())}
    if a.numel() == 0:
        return {**out, "passed": False, "why": "empty active set"}
    d = a - b
    keys = [k for k, m in zip(fx.logical_keys, scored.tolist(), strict=True) if m]
    if not bool(torch.isfinite(d).all()):
        bad = int((~torch.isfinite(d)).nonzero()[0, 0])
        return {
            **out,
            "passed": False,
            "why": "non-finite logprob difference",
            "first_key": list(keys[bad]),
        }
    ratio = torch.exp(d)
    out.update(
        max_abs_dlogp=float(d.abs().max()),
        approx_kl0=float((ratio - 1 - d).mean()),
        clipfrac0=float(((ratio < th.clip_low) | (ratio > th.clip_high)).double().mean()),
    )
    within = (
        out["max_abs_dlogp"] <= th.max_abs_dlogp
        and out["approx_kl0"] <= th.approx_kl0
        and out["clipfrac0"] <= th.clipfrac0
    )
    out["within_contract"] = bool(within)
    if bitwise:
        bits = bitwise_equal(left[scored], right[scored], keys)
        out.update(bitwise_equal=bits.passed, first_key=bits.diagnostics.get("first_mismatch_key"))
        out["passed"] = bool(within and bits.passed)
    else:
        worst = int(d.abs().argmax())
        out.update(worst_key=list(keys[worst]), passed=bool(within))
    return out


def grad_accuracy(
    owners: Mapping[str, str],
    packed: TrainRun,
    ref: TrainRun,
    th: AggregateThresholds,
    *,
    device: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Per parameter: the normwise figures of the packed layout's gradient against the fp32 reference's,
    judged against the contract's chain gradient thresholds (``gradient_figures``). ``owners`` maps each
    parameter to its operator. ``device``: where the figures are computed, one parameter at a time (both runs'
    gradients wait on the host at full widths); default: where the reference's gradient is."""
    detail: dict[str, Any] = {}
    failed = []
    for name, got in packed.grads.items():
        want = ref.grads.get(name)
        row: dict[str, Any] = {"operator": owners[name]}
        if got is None or want is None:
            row.update(passed=False, why="no gradient arrived")
        else:
            where = device or want.device
            row.update(gradient_figures(got.to(where), want.to(where)))
            row["passed"] = gradient_within(row, th.grad_rel_l2, th.grad_rel_max_abs)
        detail[name] = row
        if not row["passed"]:
            failed.append(name)
    return detail, failed


def gradient_figures(got: torch.Tensor, want: torch.Tensor) -> dict[str, Any]:
    """The chain gradient figures of one parameter, computed on the tensors' device in float64:
    ``rel_l2 = norm2(g - g_ref) / norm2(g_ref)``, ``rel_max_abs = max|g - g_ref| / max|g_ref|`` (a zero
    reference: 0 when the gradient is zero too, else inf), the reference's scale, and whether every element is
    finite (a non-finite gradient fails: the figures are then null)."""
    g, r = got.detach().double(), want.detach().to(got.device).double()
    if g.shape != r.shape:
        return {
            "finite": False,
            "rel_l2": None,
            "rel_max_abs": None,
            "why": "shape differs from the reference",
        }
    if not bool(torch.isfinite(g).all()):
        return {"finite": False, "rel_l2": None, "rel_max_abs": None, "why": "non-finite gradient"}
    d = g - r
    ref_l2, ref_max = float(torch.linalg.vector_norm(r)), float(r.abs().max()) if r.numel() else 0.0
    d_l2, d_max = float(torch.linalg.vector_norm(d)), float(d.abs().max()) if d.numel() else 0.0

    # None: a non-zero gradient where the reference has none
    def ratio(num: float, den: float) -> float | None:
        return num / den if den > 0 else (0.0 if num == 0 else None)

    return {
        "finite": True,
        "rel_l2": ratio(d_l2, ref_l2),
        "rel_max_abs": ratio(d_max, ref_max),
        "ref_l2": ref_l2,
        "ref_max_abs": ref_max,
    }


def gradient_within(row: dict[str, Any], rel_l2: float | None, rel_max_abs: float | None) -> bool:
    """A parameter passes iff its gradient is finite and both figures are within the contract's thresholds."""
    if rel_l2 is None or rel_max_abs is None or not row.get("finite"):
        return False
    if row.get("rel_l2") is None or row.get("rel_max_abs") is None:
        return False
    return bool(row["rel_l2"] <= rel_l2 and row["rel_max_abs"] <= rel_max_abs)
