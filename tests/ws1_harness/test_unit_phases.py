"""A unit's time is split by phase (`PhaseClock`), so a slow cell of a GPU run says where its seconds went.

Runs in-process at the `tiny` widths on the `primary` fixture, with the portable silu as the candidate."""

from __future__ import annotations

import time
from typing import Any

import guard_profiles as gp
import torch

from ws1_contract import load_contract
from ws1_harness.run.adapters import build_adapters
from ws1_harness.run.unit import CandidateUnderTest, PhaseClock, UnitResult, run_unit
from ws1_kernels import reference
from ws1_workload import build_fixture, load_manifest

MANIFEST = load_manifest()
MODEL = MANIFEST.model("tiny")
FIXTURE = build_fixture(MANIFEST, "primary")
DELAY_S = 0.05


def _unit(fn: Any, ref: Any = reference.silu) -> UnitResult:
    cand = CandidateUnderTest(
        "phases.silu",
        fn,
        ref,
        frozenset({gp.portable("silu").kernel_id}),
        gp.portable("silu").declared_ops,
        None,
    )
    specs = tuple(s for s in MANIFEST.layouts if s.name in ("packed", "split_1"))
    return run_unit(
        cand, build_adapters(MODEL)["silu"], FIXTURE, specs, load_contract(), "elementwise",
        case_id="phases/silu", pad_id=MODEL.pad_id,
    )  # fmt: skip


def _slow(fn: Any) -> Any:
    def call(*args: Any) -> torch.Tensor:
        time.sleep(DELAY_S)
        return fn(*args)

    return call


def test_every_phase_is_recorded_and_they_add_up_to_the_wall_time() -> None:
    result = _unit(gp.portable("silu").fn)
    assert set(result.phases_s) == {"inputs", "reference", "canonical", "layouts"}
    assert all(v >= 0 for v in result.phases_s.values())
    assert sum(result.phases_s.values()) <= result.wall_s + 1e-3


def test_a_slow_candidate_s_time_lands_in_its_layouts_not_the_reference() -> None:
    """Each candidate call sleeps: the canonical layout (one call) and split_1 (one call a sample) take it, the
    reference does not. Control: a slow reference moves the time to `reference`."""
    n = len(FIXTURE.samples)
    slow_cand = _unit(_slow(gp.portable("silu").fn)).phases_s
    assert slow_cand["canonical"] >= DELAY_S
    assert slow_cand["layouts"] >= n * DELAY_S
    assert slow_cand["reference"] < DELAY_S
    slow_ref = _unit(gp.portable("silu").fn, _slow(reference.silu)).phases_s
    assert slow_ref["reference"] >= DELAY_S
    assert slow_ref["layouts"] < n * DELAY_S


def test_a_phase_named_twice_is_summed() -> None:
    clock = PhaseClock()
    time.sleep(0.01)
    clock.mark("a")
    time.sleep(0.01)
    clock.mark("a")
    assert clock.phases["a"] >= 0.02
