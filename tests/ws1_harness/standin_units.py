"""Stand-in unit records for in-process `ws1 matrix` tests: what a unit whose candidate raised reports, with no
kernel run (error cells carry the message and where it was raised)."""

from __future__ import annotations

from typing import Any

from ws1_harness.run.tasks import UnitTask
from ws1_harness.run.unit import JUDGMENTS


def error_records(
    task: UnitTask, status: str = "error", reason: str | None = "exception"
) -> list[dict[str, Any]]:
    return [
        {
            "profile": task.profile_label,
            "operator": task.operator,
            "tier": task.tier_label,
            "judgment": j,
            "status": status,
            "reason_code": reason,
            "diagnostics": {"why": "ValueError: the candidate's own message", "at": "my_kernel.py:42"},
            "observed_kernels": [],
            "observed_ops": [],
            "wall_s": 0.0,
            "layouts": [],
            "device": None,
        }
        for j in JUDGMENTS
    ]
