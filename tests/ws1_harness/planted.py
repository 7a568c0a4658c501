"""Run one planted (deliberately broken or instrumented) candidate through a whole unit, in-process.

Shared by the guard tests and the regression suite's check tests: a portable candidate's identity with another
function, its declared kernels and ops, judged on the manifest's layouts against the shipped contract.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ws1_contract import load_contract
from ws1_harness.run.adapters import build_adapters
from ws1_harness.run.unit import CandidateUnderTest, UnitResult, run_unit
from ws1_kernels import reference, registry
from ws1_workload import Fixture, load_manifest

MANIFEST = load_manifest()
CONTRACT = load_contract()
MODEL = MANIFEST.model("tiny")
ADAPTERS = build_adapters(MODEL)


def run_planted(
    op: str,
    fn: Callable[..., torch.Tensor],
    fixture: Fixture,
    *,
    prefix: str,
    declared_kernels: frozenset[str],
    declared_ops: frozenset[str],
) -> UnitResult:
    """`fn` judged as `<prefix>.<op>` with the portable candidate's parameter rule, on every manifest layout."""
    base = registry.resolve("portable_cpu", op)
    cand = CandidateUnderTest(
        candidate_id=f"{prefix}.{op}",
        fn=fn,
        reference=reference.of(op),
        declared_kernels=declared_kernels,
        declared_ops=declared_ops,
        param_grad_rule=base.param_grad_rule,
    )
    return run_unit(
        cand,
        ADAPTERS[op],
        fixture,
        MANIFEST.layouts,
        CONTRACT,
        MANIFEST.operators[op].op_class,
        case_id=f"{prefix}/{op}",
        pad_id=MODEL.pad_id,
    )
