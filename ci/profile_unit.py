"""Profile one matrix unit in this process (host-side cProfile, device synchronised at the end).

    python ci/profile_unit.py native_torch attention long [qwen3-8b]

Prints the wall time and the 25 most expensive functions by own time and by cumulative time: where a sweep's
time goes (docs/gpu.md).
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

from ws1_harness.run.tasks import UnitTask, execute_task


def main() -> None:
    profile, operator, tier = sys.argv[1:4]
    model = sys.argv[4] if len(sys.argv) > 4 else "qwen3-8b"
    task = UnitTask(profile, operator, tier, model=model)
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    records = execute_task(task)
    prof.disable()
    print(f"wall {time.perf_counter() - start:.1f}s", [(r["judgment"], r["status"]) for r in records])
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
