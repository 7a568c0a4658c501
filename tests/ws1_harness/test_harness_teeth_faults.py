"""The gate's regression suite: every deliberately broken candidate of teeth_profiles is red for its own reason.

Each fault is a portable_cpu candidate broken the way real kernels break (teeth_profiles.py says how); it runs
through the same path as `ws1 matrix` (`execute_task`, in process) at the `tiny` widths on the `short` tier, and
must turn red exactly the judgments its entry names, each with its own reason among the cell's reasons. The
unbroken portable candidate of the same operator, on the same inputs, is the positive control.
"""

from __future__ import annotations

from typing import Any

import pytest
import teeth_profiles as tp

from ws1_harness.run.tasks import UnitTask, execute_task
from ws1_kernels import registry

TIER = "short"
MODEL = "tiny"


def run(profile: str, operator: str) -> dict[str, dict[str, Any]]:
    records = execute_task(UnitTask(profile, operator, TIER, model=MODEL))
    return {r["judgment"]: r for r in records}


def reasons(record: dict[str, Any]) -> list[str]:
    return list(record["diagnostics"].get("reasons", [record["reason_code"]]))


@pytest.mark.parametrize("name", sorted(tp.FAULTS))
def test_fault_is_red_for_its_own_reason(name: str) -> None:
    fault = tp.FAULTS[name]
    cand = tp.candidate(name)
    registry.register_profile(cand.profile, [cand], replace=True)
    cells = run(cand.profile, fault.operator)
    for judgment in fault.red:
        cell = cells[judgment]
        assert cell["status"] == "red", (judgment, cell["status"], cell["reason_code"], cell["diagnostics"])
        assert fault.reasons & set(reasons(cell)), (judgment, reasons(cell))
    # the wrapper declares what it dispatches: only the fault itself is a reason (an F.linear fallback excepted)
    for judgment, cell in cells.items():
        if "undeclared_op" not in fault.reasons:
            assert "undeclared_op" not in reasons(cell), (judgment, cell["diagnostics"].get("undeclared_ops"))


@pytest.mark.parametrize("operator", tp.OPERATORS)
def test_unbroken_candidate_is_green_on_the_same_inputs(operator: str) -> None:
    """Positive control: the fault, not the inputs or the harness, turns the cells red."""
    cells = run("portable_cpu", operator)
    assert {j: (c["status"], c["reason_code"]) for j, c in cells.items()} == {
        j: ("green", None) for j in cells
    }
