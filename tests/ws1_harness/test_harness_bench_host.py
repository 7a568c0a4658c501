"""`ws1 bench`'s host-cost figures (bench/host.py): which rows carry them, how they are judged, what is recorded.

No test asserts a speed: a judged call is either one whose host time is bounded below by construction (it
sleeps 2 ms, far above the 10 us target on any host) or a record the test writes itself.
"""

from __future__ import annotations

import time
from pathlib import Path

from ws1_harness.run.bench import host as H
from ws1_harness.run.bench.records import render_markdown
from ws1_harness.run.bench.runner import Options, collect


def _opts(tmp_path: Path, ms: tuple[int, ...]) -> Options:
    return Options(
        profile="portable_cpu",
        device="cpu",
        model="tiny",
        out=tmp_path,
        ops=("rms_norm",),
        ms=ms,
        copy_mib=1.0,
        mm_n=16,
        warmup_ms=1.0,
        rep_ms=1.0,
    )


def test_forward_rows_at_m1_carry_host_figures_for_both_sides(tmp_path: Path) -> None:
    doc = collect(_opts(tmp_path, (1, 4)), ["bench"], progress=None)
    by = {(r["m"], r["phase"]): r for r in doc["rows"]}
    host = by[(1, "fwd")]["host"]
    assert host is not None and host["target_us"] == H.HOST_TARGET_US
    for side in ("candidate", "peer"):
        assert host[side]["issue_us"] > 0 and host[side]["eager_us"] >= host[side]["issue_us"] * 0.5
        assert host[side]["graph_us"] is None and "CPU" in host[side]["graph_error"]
    assert host["met"] in (True, False)
    # negative controls: a backward row and a row at another M carry none
    assert by[(1, "bwd")]["host"] is None and by[(4, "fwd")]["host"] is None
    assert "## Host cost per call" in render_markdown(doc)


def test_a_call_that_spends_2ms_on_the_host_misses_the_target() -> None:
    cost = H.measure("cpu", lambda: time.sleep(0.002))
    assert cost.issue_us is not None and cost.issue_us >= 2000
    assert H.judge(cost) is False


def test_the_judge_reads_the_issue_figure_alone() -> None:
    assert H.judge(H.HostCost(issue_us=9.9, eager_us=500.0, graph_us=490.0)) is True
    assert H.judge(H.HostCost(issue_us=10.1, eager_us=10.2, graph_us=1.0)) is False
    assert H.judge(H.HostCost(error="boom")) is None and H.judge(None) is None


def test_a_raising_call_is_recorded_not_raised() -> None:
    def boom() -> None:
        raise ValueError("no\nsecond line")

    cost = H.measure("cpu", boom)
    assert cost.issue_us is None and cost.error is not None and "\n" not in cost.error
    assert H.judge(cost) is None
