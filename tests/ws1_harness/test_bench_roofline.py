"""`ws1 bench`'s roofline: each GEMM row's least time at the run's own ceilings, per side under its own
weight-gradient rule, and the share of it each side reaches. Arithmetic only, with a fake timer (never a speed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_timer import FakeTimer

from ws1_harness.run.bench import cases, records, roofline
from ws1_harness.run.bench.runner import Options, collect
from ws1_harness.run.bench.shapes import Point

QKV = Point("det_gemm", "qkv", 64, {"K": 4096, "N": 6144})


def test_floor_is_the_larger_of_compute_and_memory_time() -> None:
    # 1e9 FLOPs at 1 TFLOP/s: 1 ms; 1e6 bytes at 1 GB/s: 1 ms
    assert roofline.floor_ms(2e9, 1e6, 1.0, 1.0) == pytest.approx(2.0)  # compute sets it
    assert roofline.floor_ms(1e9, 3e6, 1.0, 1.0) == pytest.approx(3.0)  # memory sets it


@pytest.mark.parametrize(("mm", "copy"), [(None, 1.0), (1.0, None), (0.0, 1.0)])
def test_control_no_floor_without_both_ceilings(mm: float | None, copy: float | None) -> None:
    assert roofline.floor_ms(1e9, 1e6, mm, copy) is None


def test_gemm_traffic_counts_each_tensor_once_and_the_main_grad_rule() -> None:
    m, k, n = 64, 4096, 6144
    traffic = cases.CASES["det_gemm"].traffic
    assert traffic is not None
    assert traffic(QKV, "fwd", False) == 2 * (m * k + n * k + m * n)
    fresh, rule = traffic(QKV, "bwd", False), traffic(QKV, "bwd", True)
    assert fresh == 2 * (m * n + n * k + 2 * m * k) + 2 * n * k
    assert rule - fresh == 6 * n * k  # fp32 read + write (8 bytes) in place of a bf16 write (2)
    assert traffic(QKV, "fwd", True) == traffic(QKV, "fwd", False)  # the rule is the backward's only


# copy: 2 MiB moved in 1000 ms (about 2.1 MB/s); mm: 2 x 16^3 FLOPs in 1 ms: every GEMM row is memory-bound
TIMES = {"candidate": 2.0e5, "peer": 1.0e5, "peer_main_grad": 1.5e5, "copy": 1000.0, "mm": 1.0}


def _doc(tmp_path: Path, profile: str) -> dict:
    opts = Options(
        profile=profile, device="cpu", model="tiny", out=tmp_path, ops=("det_gemm", "logp"),
        shapes=("o", "vocab"), ms=(1,), copy_mib=1.0, mm_n=16,
    )  # fmt: skip
    doc = collect(opts, ["bench"], timer=FakeTimer(TIMES), progress=None)
    records.validate(doc, "collect")
    return doc


def test_each_side_is_held_to_the_floor_of_its_own_rule(tmp_path: Path) -> None:
    doc = _doc(tmp_path, "portable_cpu")
    copy = doc["ceilings"]["copy"]["GB_s"]
    rows = {(r["op"], r["phase"]): r for r in doc["rows"]}
    bwd = rows[("det_gemm", "bwd")]
    rl, tb = bwd["roofline"], bwd["traffic_bytes"]
    assert rl["bound"] == "memory"
    for side in ("candidate", "peer", "peer_main_grad"):
        assert rl["floor_ms"][side] == pytest.approx(tb[side] / (copy * 1e6))
    assert rl["floor_ms"]["candidate"] > rl["floor_ms"]["peer"]  # the fp32 main_grad's traffic
    assert rl["floor_ms"]["peer_main_grad"] == rl["floor_ms"]["candidate"]
    assert rl["of_floor"]["candidate"] == pytest.approx(rl["floor_ms"]["candidate"] / TIMES["candidate"])
    assert rl["of_floor"]["peer_main_grad"] == pytest.approx(
        rl["floor_ms"]["candidate"] / TIMES["peer_main_grad"]
    )
    fwd = rows[("det_gemm", "fwd")]["roofline"]
    assert fwd["floor_ms"]["candidate"] == fwd["floor_ms"]["peer"]
    assert rows[("logp", "fwd")]["roofline"] is None  # no traffic formula: no roofline, never a guess
    assert "## Roofline" in records.render_markdown(doc)


def test_control_an_autograd_candidate_shares_the_peers_floor(tmp_path: Path) -> None:
    bwd = next(
        r for r in _doc(tmp_path, "native_torch")["rows"] if r["op"] == "det_gemm" and r["phase"] == "bwd"
    )
    assert bwd["param_grad_rule"] == "autograd_accumulate"
    assert bwd["roofline"]["floor_ms"]["candidate"] == bwd["roofline"]["floor_ms"]["peer"]
    assert "peer_main_grad" not in bwd["traffic_bytes"]


def test_a_compute_bound_row_says_so() -> None:
    row = {"metric": "TFLOP/s", "work": 1e12, "traffic_bytes": {"candidate": 1.0, "peer": 1.0},
           "candidate_ms": 2000.0, "peer_ms": 1000.0}  # fmt: skip
    rl = roofline.row_roofline(row, 1.0, 1.0)
    assert rl is not None and rl["bound"] == "compute"
    assert rl["floor_ms"]["candidate"] == pytest.approx(1000.0)
    assert rl["of_floor"] == {"candidate": pytest.approx(0.5), "peer": pytest.approx(1.0)}


def test_control_an_unmeasured_ceiling_leaves_no_figures() -> None:
    row = {"metric": "TFLOP/s", "work": 1e12, "traffic_bytes": {"candidate": 1.0}, "candidate_ms": 1.0}
    rl = roofline.row_roofline(row, None, 1.0)
    assert rl is not None and rl["floor_ms"]["candidate"] is None and rl["of_floor"]["candidate"] is None
    assert rl["bound"] is None
