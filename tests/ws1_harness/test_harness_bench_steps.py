"""`ws1 bench --op train_step / --op decode_step` on the CPU at the tiny widths: the rows, what ran on each side,
the path checks (planted profiles that must be caught) and bad input. Never the speed: CPU times say nothing
about GPU kernels, so a fake timer gives the times where the arithmetic is checked.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from fake_timer import FakeTimer

from ws1_harness.cli import main
from ws1_harness.run.bench import records, targets
from ws1_harness.run.bench import steps as ST
from ws1_harness.run.bench.runner import Options, collect
from ws1_kernels import native, registry
from ws1_kernels.integrations.qwen3 import CHAIN_OPERATORS
from ws1_workload import load_manifest, tensor_shapes

QUICK = ["--model", "tiny", "--device", "cpu", "--warmup-ms", "1", "--rep-ms", "1", "--copy-mib", "1"]
QUICK += ["--mm-n", "32"]
STEPS = dict(ops=("train_step", "decode_step"), tokens=40, cache=6, batches=(1, 3))


TIMES = {"candidate": 2.0, "peer": 1.0, "copy": 1.0, "mm": 1.0}


def _collect(tmp_path: Path, profile: str, timer: FakeTimer | None = None, **kw: object) -> dict:
    base: dict[str, object] = dict(
        profile=profile, device="cpu", model="tiny", out=tmp_path, copy_mib=1.0, mm_n=16, **STEPS
    )
    base.update(kw)
    doc = collect(Options(**base), ["bench"], timer=timer or FakeTimer(TIMES), progress=None)  # type: ignore[arg-type]
    records.validate(doc, "collect")
    return doc


def _kernel_ids(profile: str) -> set[str]:
    return {k for c in registry.candidates(profile).values() for k in c.all_kernel_ids}


def _register(monkeypatch: pytest.MonkeyPatch, name: str, table: dict[str, registry.Candidate]) -> str:
    """Register a planted profile for this test only (the registry's tables are restored afterwards)."""
    monkeypatch.setattr(registry, "_PROFILES", dict(registry._PROFILES))
    monkeypatch.setattr(registry, "_PLUGIN_SOURCES", dict(registry._PLUGIN_SOURCES))
    registry.register_profile(
        name, [dataclasses.replace(c, profile=name) for c in table.values()], replace=True
    )
    return name


def _portable_with(op: str, fn: object) -> dict[str, registry.Candidate]:
    table = dict(registry.candidates("portable_cpu"))
    table[op] = dataclasses.replace(table[op], fn=fn)
    return table


# ---------------------------------------------------------------------------------------------- the rows


def test_step_rows_time_both_sides_and_record_the_kernels_that_ran(tmp_path: Path) -> None:
    doc = _collect(tmp_path, "portable_cpu")
    rows = doc["rows"]
    assert [(r["op"], r["m"]) for r in rows] == [("train_step", 40), ("decode_step", 1), ("decode_step", 3)]
    own, stock = _kernel_ids("portable_cpu"), _kernel_ids(ST.STOCK_PROFILE)
    for r in rows:
        assert r["status"] == "ok", r["errors"]
        assert r["candidate_ms"] == TIMES["candidate"] and r["peer_ms"] == TIMES["peer"]
        assert set(r["kernels_observed"]) <= own
        assert set(r["step"]["peer_kernels_observed"]) <= stock
        # every chain operator recorded a kernel on each side (observed at the launch sites, not declared)
        for side, profile in (
            (r["kernels_observed"], "portable_cpu"),
            (r["step"]["peer_kernels_observed"], ST.STOCK_PROFILE),
        ):
            for op in CHAIN_OPERATORS:
                assert registry.candidates(profile)[op].all_kernel_ids & set(side), (r["op"], profile, op)
        assert r["step"]["path_problems"] == {"candidate": [], "peer": []}


def test_train_step_packs_several_varlen_samples(tmp_path: Path) -> None:
    doc = _collect(tmp_path, "portable_cpu", ops=("train_step",), batches=None, cache=None)
    (row,) = doc["rows"]
    lengths = row["step"]["sample_lengths"]
    assert sum(lengths) == row["m"] == row["dims"]["tokens"] and len(lengths) >= 2
    assert len(set(lengths)) > 1  # varlen, not equal blocks


@pytest.mark.parametrize("tokens", [1, 2, 3, 40, 1000, 8192, 20000])
def test_sample_lengths_cover_the_call(tokens: int) -> None:
    lengths = ST.sample_lengths(tokens)
    assert sum(lengths) == tokens and min(lengths) >= 1
    assert len(lengths) == min(
        tokens, max(ST.MIN_SAMPLES, min(ST.MAX_SAMPLES, tokens // ST.TOKENS_PER_SAMPLE))
    )


def test_train_step_work_counts_every_gemm_weight_and_causal_pair() -> None:
    cfg = dataclasses.replace(load_manifest(None).model("tiny"), num_layers=2)
    p = ST.StepPoint("train_step", 40, 2, lengths=ST.sample_lengths(40))
    gemm = sum(  # every matrix except the embedding (a gather) is a GEMM weight
        s[0] * s[1] for name, s in tensor_shapes(cfg).items() if len(s) == 2 and "embed_tokens" not in name
    )
    pairs = sum(n * (n + 1) // 2 for n in p.lengths)
    attn = 4.0 * pairs * cfg.num_heads * cfg.head_dim * cfg.num_layers
    assert ST.step_work(cfg, p) == ("TFLOP/s", pytest.approx(3 * 2.0 * 40 * gemm + 3.5 * attn))


@pytest.mark.parametrize(("op", "ratio"), [("train_step", 1 / 1.15), ("decode_step", 1 / 1.15)])
def test_step_targets_are_the_slowdown_bounds(op: str, ratio: float) -> None:
    t = targets.target_for(op, "fwd", 1, {})
    assert t is not None
    assert targets.judge(t, ratio * 1.001, None, None, None) is True
    assert targets.judge(t, ratio * 0.999, None, None, None) is False


def test_unrunnable_profile_gives_one_unavailable_row_per_step_op(tmp_path: Path) -> None:
    doc = _collect(tmp_path, "triton_cuda_bf16")
    assert [(r["op"], r["status"]) for r in doc["rows"]] == [
        ("train_step", "unavailable"),
        ("decode_step", "unavailable"),
    ]
    assert all(r["reason"] for r in doc["rows"])


# ---------------------------------------------------------------------------------------------- negative controls


def test_planted_stock_op_on_the_candidate_path_is_an_error_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile whose swiglu calls the stock one: caught by the op watch and the stock-kernel check."""
    name = _register(monkeypatch, "bench_steps_stock_swiglu", _portable_with("swiglu", native.swiglu))
    doc = _collect(tmp_path, name, ops=("train_step",), batches=None, cache=None)
    (row,) = doc["rows"]
    assert row["status"] == "error" and row["target_met"] is None
    assert row["candidate_ms"] is not None and row["peer_ms"] is not None  # timed, but not judged
    assert "ws1.native.swiglu" in row["errors"]["candidate_path"]
    assert "ws1.native.swiglu" in row["kernels_observed"]


def test_candidate_table_equal_to_native_is_an_error_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every candidate is native's under another name (declaring native's kernels, so the op watch is content)."""
    table = {op: dataclasses.replace(c, stock=False) for op, c in registry.candidates("native_torch").items()}
    name = _register(monkeypatch, "bench_steps_native_table", table)
    doc = _collect(tmp_path, name, ops=("decode_step",), tokens=None, batches=(2,))
    (row,) = doc["rows"]
    assert row["status"] == "error" and row["target_met"] is None
    problem = row["errors"]["candidate_path"]
    assert "stock kernels recorded" in problem and "exactly the stock peer's kernels" in problem


def test_a_peer_that_is_not_the_stock_model_is_an_error_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ST, "STOCK_PROFILE", "portable_cpu")
    doc = _collect(tmp_path, "portable_cpu", ops=("decode_step",), tokens=None, batches=(1,))
    (row,) = doc["rows"]
    assert row["status"] == "error" and row["target_met"] is None
    assert "is not stock" in row["errors"]["peer_path"]


def test_ok_row_with_the_same_times_is_judged(tmp_path: Path) -> None:
    """The control of the two above: the same times on a clean path give a verdict."""
    doc = _collect(tmp_path, "portable_cpu", ops=("decode_step",), tokens=None, batches=(1,))
    (row,) = doc["rows"]
    assert row["status"] == "ok" and row["target_met"] is (TIMES["peer"] / TIMES["candidate"] >= 1 / 1.2)


# ---------------------------------------------------------------------------------------------- the command


def test_cli_writes_step_rows_and_report_shows_them(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "b"
    argv = ["bench", "--profile", "portable_cpu", "--op", "train_step", "--op", "decode_step", *QUICK]
    argv += ["--tokens", "24", "--cache", "4", "--batch", "2", "--layers", "1", "--out", str(out)]
    rc = main(argv)
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    doc = json.loads((out / "bench-portable_cpu-cpu.json").read_text(encoding="utf-8"))
    assert [(r["op"], r["status"], r["dims"]["layers"]) for r in doc["rows"]] == [
        ("train_step", "ok", 1),
        ("decode_step", "ok", 1),
    ]
    assert doc["options"]["steps"]["stock_profile"] == ST.STOCK_PROFILE
    assert [ln for ln in cap.err.splitlines() if ln.startswith("ws1 bench [")][-1].startswith(
        "ws1 bench [2/2] decode_step"
    )
    assert main(["report", str(out / "bench-portable_cpu-cpu.json")]) == 0
    report = (out / "bench-portable_cpu-cpu.report.md").read_text(encoding="utf-8")
    assert "## Whole-model steps" in report and "| decode_step | 2 | 1 |" in report


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--op", "train_step", "--layers", "0"], "--layers: must be >= 1"),
        (["--op", "decode_step", "--layers", "3"], "--layers 3"),  # tiny has 2 layers
        (["--op", "train_step", "--tokens", "0"], "--tokens"),
        (["--op", "decode_step", "--batch", "0"], "--batch"),
        (["--op", "decode_step", "--cache", "0"], "--cache"),
        (["--op", "decode_step", "--batch", "2", "--batch", "2"], "--batch given twice"),
        (["--op", "train_step", "--batch", "2"], "--batch applies"),
        (["--op", "det_gemm", "--tokens", "8"], "--tokens applies"),
        (["--op", "train_step", "--m", "8"], "--m sets operator rows"),
        (["--op", "warp_step"], "unknown operator 'warp_step'"),
        (["--op", "train_step", "--model", "qwen9"], "unknown model 'qwen9'"),
    ],
)
def test_bad_step_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], needle: str
) -> None:
    argv = ["bench", "--profile", "portable_cpu", *QUICK, *extra, "--out", str(tmp_path / "b")]
    if "--model" in extra:  # the model under test replaces QUICK's
        argv.remove("tiny")
        argv.remove("--model")
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "b").exists()
