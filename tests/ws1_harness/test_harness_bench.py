"""`ws1 bench` on the CPU at the tiny widths: the machinery, the record and the arithmetic, never the speed.

No test asserts a timing: CPU wall-clock numbers say nothing about GPU kernels. Ratio, rate and target
arithmetic are checked with a fake timer whose times are chosen by the test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from fake_timer import FakeTimer
from profiles_support import CANDIDATE_PROFILES, MAIN_GRAD_PROFILES, skip_unless_runs_on

from ws1_harness.cli import main
from ws1_harness.run.bench import cases, records, targets
from ws1_harness.run.bench.runner import Options, collect
from ws1_harness.run.bench.shapes import BENCH_OPS, OPERATOR_OF, Point, op_shapes, operator_of

ROOT = Path(__file__).resolve().parents[2]
QUICK = [
    "--model",
    "tiny",
    "--device",
    "cpu",
    "--warmup-ms",
    "1",
    "--rep-ms",
    "1",
    "--copy-mib",
    "1",
    "--mm-n",
    "32",
]
PLUGIN = "bench_plugins:RAISING"


def _opts(tmp_path: Path, profile: str, **kw: object) -> Options:
    base: dict[str, object] = dict(
        profile=profile, device="cpu", model="tiny", out=tmp_path, ms=(1,), copy_mib=1.0, mm_n=16
    )
    base.update(kw)
    return Options(**base)  # type: ignore[arg-type]


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------- full runs


@pytest.mark.parametrize("profile", CANDIDATE_PROFILES)
def test_every_operator_gives_forward_and_backward_rows(tmp_path: Path, profile: str) -> None:
    skip_unless_runs_on(profile, "cpu")  # a profile for other hardware gives unavailable rows (tested below)
    times = {"candidate": 2.0, "peer": 1.0, "copy": 1.0, "mm": 1.0}
    doc = collect(_opts(tmp_path, profile), ["bench"], timer=FakeTimer(times), progress=None)
    records.validate(doc, "collect")
    seen = {(r["op"], r["phase"]) for r in doc["rows"]}
    phases = {op: ("fwd",) if op in OPERATOR_OF else ("fwd", "bwd") for op in BENCH_OPS}  # decode: inference
    assert seen == {(op, ph) for op in BENCH_OPS for ph in phases[op]}
    bad = [(r["op"], r["phase"], r["errors"]) for r in doc["rows"] if r["status"] != "ok"]
    assert not bad
    for r in doc["rows"]:
        assert r["candidate_id"] == f"{profile}.{operator_of(r['op'])}"
        assert r["kernels_observed"], f"{r['op']} {r['phase']}: no launch recorded by the probe call"
        assert r["ratio"] == pytest.approx(0.5)
    main_grad = [r for r in doc["rows"] if r["param_grad_rule"] == "sample_blocks_main_grad"]
    assert bool(main_grad) == (profile in MAIN_GRAD_PROFILES)


def test_cli_run_writes_json_and_markdown_with_provenance(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    rc = main(
        [
            "bench",
            "--profile",
            "portable_cpu",
            "--m",
            "1",
            "--shape",
            "down",
            "--op",
            "det_gemm",
            *QUICK,
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = _load(tmp_path / "bench-portable_cpu-cpu.json")
    assert doc["kind"] == "bench" and doc["schema_version"] == records.SCHEMA_VERSION
    assert doc["device"]["type"] == "cpu" and doc["timer"]["name"] == "wall_cpu"
    for key in ("git_commit", "git_dirty", "torch", "triton", "python", "cuda", "capability", "driver"):
        assert key in doc["provenance"]
    assert doc["command"].startswith("ws1 bench --profile portable_cpu")
    assert doc["ceilings"]["copy"]["GB_s"] > 0 and doc["ceilings"]["mm"]["TFLOP_s"] > 0
    assert [(r["shape"], r["m"], r["phase"]) for r in doc["rows"]] == [("down", 1, "fwd"), ("down", 1, "bwd")]
    fwd = doc["rows"][0]
    assert fwd["dims"] == {"K": 512, "N": 256}  # tiny: intermediate 512 -> hidden 256
    assert fwd["ratio"] == pytest.approx(fwd["peer_ms"] / fwd["candidate_ms"])
    assert fwd["work"] == 2 * 1 * 256 * 512
    assert fwd["target"]["text"] == "ratio >= 0.8"
    assert out.err.count("ws1 bench [") == 2  # one progress line per row, on stderr
    md = (tmp_path / "bench-portable_cpu-cpu.md").read_text(encoding="utf-8")
    assert "| det_gemm | down | 1 | fwd |" in md and doc["provenance"]["git_commit"] in md


# ---------------------------------------------------------------------------------------------- arithmetic


def test_ratio_rates_and_verdicts_follow_the_fake_times(tmp_path: Path) -> None:
    times = {"candidate": 0.5, "peer": 2.0, "copy": 0.001, "mm": 0.25}

    def run(op: str, m: int) -> dict:
        opts = _opts(tmp_path, "native_torch", ops=(op,), shapes=("o", "hidden"), ms=(m,))
        return collect(opts, ["bench"], timer=FakeTimer(times), progress=None)

    doc = run("det_gemm", 1)
    copy = doc["ceilings"]["copy"]
    assert copy["GB_s"] == pytest.approx(2 * 2**20 / 0.001 / 1e6)
    assert doc["ceilings"]["mm"]["TFLOP_s"] == pytest.approx(2 * 16**3 / 0.25 / 1e9)
    fwd, bwd = doc["rows"]
    assert fwd["ratio"] == pytest.approx(4.0) and fwd["target_met"] is True
    assert fwd["candidate_rate"] == pytest.approx(2 * 1 * 256 * 512 / 0.5 / 1e9)
    assert fwd["peer_rate"] == pytest.approx(fwd["candidate_rate"] / 4)
    assert bwd["work"] == 2 * fwd["work"]  # dx and dW
    assert doc["counts"]["target_met"] == 2 and doc["counts"]["target_missed"] == 0

    assert run("rms_norm", 1)["rows"][0]["target"] is None  # below the 8192-row threshold
    big = run("rms_norm", 8192)["rows"][0]
    assert big["candidate_rate"] == pytest.approx(2 * 8192 * 256 * 2 / 0.5 / 1e6)
    assert big["target"]["kind"] == "copy_fraction_min"
    assert big["target_met"] is (big["candidate_rate"] >= 0.85 * copy["GB_s"])


@pytest.mark.parametrize(
    ("op", "phase", "m", "dims", "text"),
    [
        ("det_gemm", "fwd", 512, {}, "ratio >= 0.9"),
        ("lm_head", "fwd", 64, {}, "ratio >= 0.8"),
        ("det_gemm", "fwd", 128, {}, None),
        ("lm_head", "bwd", 1, {}, "ratio >= 0.8"),
        ("attention", "fwd", 8192, {}, "ratio >= 0.8"),
        ("attention", "bwd", 8192, {}, "ratio >= 0.7"),
        ("logp", "fwd", 4096, {"V": 151936}, "<= 0.37 ms"),
        ("logp", "fwd", 4096, {"V": 5000}, None),
        ("swiglu", "bwd", 16384, {}, ">= 85% of copy"),
        ("embedding", "bwd", 16384, {}, None),
        ("linear_logp", "fwd", 4096, {}, "<= 1.1x lm_head fwd (same M, this run)"),
        ("linear_logp", "bwd", 4096, {}, None),
        ("attention_decode", "fwd", 64, {}, ">= 70% of copy (KV read)"),
        ("attention_decode", "fwd", 1, {}, None),
    ],
)
def test_target_table(op: str, phase: str, m: int, dims: dict, text: str | None) -> None:
    t = targets.target_for(op, phase, m, dims)
    assert (t.text if t else None) == text


@pytest.mark.parametrize(
    ("op", "phase", "m", "dims", "text"),
    [
        ("det_gemm", "fwd", 4096, {}, "ratio >= 0.95"),
        ("lm_head", "fwd", 64, {}, "ratio >= 1.0"),
        ("det_gemm", "fwd", 128, {}, None),
        ("lm_head", "bwd", 1, {}, "ratio >= 0.9"),
        ("attention", "fwd", 8192, {}, "ratio >= 0.9"),
        ("attention", "bwd", 8192, {}, "ratio >= 0.8"),
        ("logp", "fwd", 4096, {"V": 151936}, "<= 0.33 ms"),
        ("swiglu", "bwd", 16384, {}, ">= 85% of copy"),  # not one of the Hopper profile's own: ws1's
        ("linear_logp", "fwd", 4096, {}, "<= 1.1x lm_head fwd (same M, this run)"),
        ("attention_decode", "fwd", 64, {}, ">= 70% of copy (KV read)"),
    ],
)
def test_the_hopper_profile_is_held_to_its_own_targets(
    op: str, phase: str, m: int, dims: dict, text: str | None
) -> None:
    t = targets.target_for(op, phase, m, dims, "cuda_bf16_sm90")
    assert (t.text if t else None) == text


@pytest.mark.parametrize("profile", ["triton_cuda_bf16", "cuda_bf16", "portable_cpu", None])
def test_the_control_other_profiles_keep_ws1s_targets(profile: str | None) -> None:
    for op, phase, m, dims in (
        ("attention", "bwd", 8192, {}),
        ("det_gemm", "fwd", 4096, {}),
        ("logp", "fwd", 4096, {"V": 151936}),
    ):
        assert targets.target_for(op, phase, m, dims, profile) == targets.target_for(op, phase, m, dims)
    assert targets.targets_of(profile) is targets.DEFAULT


def test_the_bench_json_names_the_set_its_rows_were_judged_by() -> None:
    hopper, default = targets.table("cuda_bf16_sm90"), targets.table("triton_cuda_bf16")
    assert hopper[0] == {"set": targets.HOPPER.name} and default[0] == {"set": targets.DEFAULT.name}
    attn = [r["rule"] for r in hopper if r.get("ops") == ["attention"]]
    assert attn == ["ratio >= 0.9", "ratio >= 0.8"]
    # the control: the default table's attention rules are the Triton ones
    assert [r["rule"] for r in default if r.get("ops") == ["attention"]] == ["ratio >= 0.8", "ratio >= 0.7"]


def test_judge_edges() -> None:
    ratio = targets.Target("ratio_min", 0.9, "")
    assert targets.judge(ratio, 0.9, 1.0, None, None) is True
    assert targets.judge(ratio, 0.89, 1.0, None, None) is False
    assert targets.judge(ratio, None, None, None, None) is None
    ms = targets.Target("ms_max", 0.37, "")
    assert (
        targets.judge(ms, None, 0.37, None, None) is True
        and targets.judge(ms, None, 0.38, None, None) is False
    )
    copy = targets.Target("copy_fraction_min", 0.85, "")
    assert targets.judge(copy, None, 1.0, 850.0, 1000.0) is True
    assert targets.judge(copy, None, 1.0, 849.0, 1000.0) is False
    assert targets.judge(copy, None, 1.0, 849.0, None) is None  # no ceiling measured: not judged
    assert targets.judge(None, 2.0, 1.0, 1.0, 1.0) is None
    ref = targets.Target("reference_ratio_max", 1.1, "")
    assert targets.judge(ref, None, 1.1, None, None, reference_ms=1.0) is True
    assert targets.judge(ref, None, 1.11, None, None, reference_ms=1.0) is False
    assert targets.judge(ref, None, 1.0, None, None) is None  # no reference row: not judged


def _row(op: str, phase: str, m: int, ms: float | None, status: str = "ok") -> dict:
    t = targets.target_for(op, phase, m, {})
    return {"op": op, "phase": phase, "m": m, "status": status, "candidate_ms": ms,
            "target": t.to_json() if t else None, "target_met": None}  # fmt: skip


def test_a_fused_row_is_judged_against_its_gemm_of_the_same_run_and_m() -> None:
    rows = [
        _row("linear_logp", "fwd", 512, 1.265),
        _row("linear_logp", "fwd", 4096, 7.9),
        _row("linear_logp", "fwd", 64, 0.5),
        _row("lm_head", "fwd", 512, 1.021),
        _row("lm_head", "fwd", 4096, 7.281),
        _row("lm_head", "fwd", 64, 0.45, status="error"),  # an error row is no reference
        _row("lm_head", "bwd", 512, 0.1),  # another phase is no reference
    ]
    linked = targets.link_references(rows)
    assert [(r["m"], r["target_met"]) for r in linked] == [(512, False), (4096, True), (64, None)]
    assert rows[0]["reference"] == {"op": "lm_head", "phase": "fwd", "m": 512, "candidate_ms": 1.021}
    assert rows[2]["reference"] is None


def test_a_run_with_both_ops_links_them_and_a_run_without_the_gemm_does_not(tmp_path: Path) -> None:
    times = {"candidate": 0.5, "peer": 2.0, "copy": 0.001, "mm": 0.25}

    def run(*ops: str) -> dict:
        opts = _opts(tmp_path, "portable_cpu", ops=ops, ms=(4,))
        doc = collect(opts, ["bench"], timer=FakeTimer(times), progress=None)
        records.validate(doc, "doc")  # the counts include the linked verdicts
        return doc

    both = run("linear_logp", "lm_head")
    fwd = next(r for r in both["rows"] if (r["op"], r["phase"]) == ("linear_logp", "fwd"))
    assert fwd["reference"]["candidate_ms"] == 0.5 and fwd["target_met"] is True
    assert "1.00x of 0.5000 ms" in records.render_markdown(both, "x.json")
    alone = run("linear_logp")  # the control: no lm_head row, so nothing to judge against
    fwd = next(r for r in alone["rows"] if (r["op"], r["phase"]) == ("linear_logp", "fwd"))
    assert fwd["reference"] is None and fwd["target_met"] is None
    assert "not judged, the run measured no such row" in records.render_markdown(alone, "x.json")


# ---------------------------------------------------------------------------------------------- odd rows


def test_triton_on_cpu_is_an_unavailable_row(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc = main(
        [
            "bench",
            "--profile",
            "triton_cuda_bf16",
            "--op",
            "det_gemm",
            "--op",
            "rms_norm",
            *QUICK,
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    doc = _load(tmp_path / "bench-triton_cuda_bf16-cpu.json")
    assert [(r["op"], r["status"]) for r in doc["rows"]] == [
        ("det_gemm", "unavailable"),
        ("rms_norm", "unavailable"),
    ]
    assert all(r["reason"] and r["candidate_ms"] is None and r["target_met"] is None for r in doc["rows"])
    assert doc["counts"]["unavailable"] == 2 and doc["counts"]["ok"] == 0


def test_raising_candidate_is_an_error_row_and_missing_backward_is_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    rc = main(
        [
            "bench",
            "--profile",
            "bench_raises",
            "--candidates",
            PLUGIN,
            "--m",
            "1",
            "--op",
            "det_gemm",
            "--shape",
            "o",
            "--shape",
            "intermediate",
            "--shape",
            "hidden",
            "--op",
            "silu",
            "--op",
            "rms_norm",
            *QUICK,
            "--out",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    rows = {(r["op"], r["phase"]): r for r in _load(tmp_path / "bench-bench_raises-cpu.json")["rows"]}
    for phase in ("fwd", "bwd"):
        r = rows[("det_gemm", phase)]
        assert r["status"] == "error" and "deliberate failure" in r["errors"]["candidate"]
        assert (
            r["candidate_ms"] is None and r["peer_ms"] > 0 and r["ratio"] is None
        )  # the peer is still timed
    assert rows[("silu", "fwd")]["status"] == "ok"
    assert rows[("silu", "bwd")]["status"] == "skipped" and "no backward" in rows[("silu", "bwd")]["reason"]
    assert rows[("rms_norm", "bwd")]["status"] == "ok"
    assert "error: candidate: RuntimeError: bench_plugins: deliberate failure" in err


# ---------------------------------------------------------------------------------------------- files


def test_refuses_to_overwrite_without_force(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["bench", "--profile", "native_torch", "--op", "silu", "--m", "1", *QUICK, "--out", str(tmp_path)]
    assert main(args) == 0
    first = (tmp_path / "bench-native_torch-cpu.json").read_bytes()
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--force" in err[0]
    assert (tmp_path / "bench-native_torch-cpu.json").read_bytes() == first
    assert main([*args, "--force"]) == 0


def test_refuses_the_checkout(capsys: pytest.CaptureFixture) -> None:
    target = ROOT / "bench-test-output-never-created"
    rc = main(
        ["bench", "--profile", "native_torch", "--op", "silu", "--m", "1", *QUICK, "--out", str(target)]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "checkout" in err[0]
    assert not target.exists()


def test_report_renders_a_bench_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert (
        main(
            ["bench", "--profile", "native_torch", "--op", "silu", "--m", "1", *QUICK, "--out", str(tmp_path)]
        )
        == 0
    )
    src = tmp_path / "bench-native_torch-cpu.json"
    assert main(["report", str(src), "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "bench-native_torch-cpu.report.md").read_text(encoding="utf-8")
    assert (
        md.startswith("# ws1 bench: bench-native_torch-cpu.json")
        and "| silu | intermediate | 1 | bwd |" in md
    )
    doc = _load(src)
    doc["counts"]["ok"] += 1  # a doctored file is bad input, not a report
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    capsys.readouterr()
    assert main(["report", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "counts disagree" in err[0]


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--profile", "no_such_profile"], "unknown profile"),
        (["--profile", "native_torch", "--op", "no_such_op"], "unknown operator"),
        (["--profile", "native_torch", "--op", "pack"], "unknown operator"),
        (["--profile", "native_torch", "--shape", "no_such_shape"], "unknown shape"),
        (["--profile", "native_torch", "--device", "tpu"], "invalid choice"),
        (["--profile", "native_torch", "--model", "no_such_model"], "unknown model"),
        (["--profile", "native_torch", "--m", "0"], "--m: must be >= 1"),
        (["--profile", "native_torch", "--m", "1", "--m", "1"], "given twice"),
        (["--profile", "native_torch", "--m", "x"], "not an integer"),
        (["--profile", "native_torch", "--op", "attention", "--m", "1500"], "multiple"),
        (
            ["--profile", "native_torch", "--op", "silu", "--shape", "down"],
            "--op silu has none of --shape down",
        ),
        (["--profile", "native_torch", "--candidates", "no_such_module:X"], "--candidates"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], needle: str
) -> None:
    device = [] if "--device" in extra else ["--device", "cpu"]
    rc = main(["bench", *extra, *device, "--out", str(tmp_path)])
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and needle in lines[0], out.err
    assert "Traceback" not in out.err and "internal error" not in out.err
    assert not list(tmp_path.iterdir())  # nothing measured, nothing written


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_a_device_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc = main(["bench", "--profile", "native_torch", "--device", "cuda", "--out", str(tmp_path)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "no CUDA device" in lines[0]


def test_json_has_no_nan(tmp_path: Path) -> None:
    doc = collect(
        _opts(tmp_path, "bench_raises", ops=("det_gemm",), shapes=("o",), candidates=PLUGIN),
        ["bench"],
        timer=FakeTimer({"candidate": 1.0, "peer": 1.0, "copy": 1.0, "mm": 1.0}),
        progress=None,
    )
    text = json.dumps(doc, allow_nan=False)  # raises on NaN or inf
    assert all(
        not isinstance(v, float) or math.isfinite(v) for v in json.loads(text)["ceilings"]["copy"].values()
    )


def _decode_point(manifest_model: str = "tiny", m: int = 3) -> Point:
    from ws1_workload import load_manifest

    dims = dict(op_shapes(load_manifest(None).model(manifest_model))["attention_decode"]["gqa_cache"])
    dims["C"] = 40  # a short cache: the property is the wiring, not the size
    return Point("attention_decode", "gqa_cache", m, dims)


def test_decode_case_gives_the_candidate_the_same_math_as_its_peer() -> None:
    """The decode bench times what it claims: the candidate's new-token rows against its cached prefix equal
    the peer's SDPA over the whole cache. Negative control: the same call without the prefix differs."""
    from ws1_kernels import LayoutContext, registry

    p = _decode_point()
    case = cases.CASES["attention_decode"]
    t = case.make(p, torch.device("cpu"), torch.Generator().manual_seed(0))
    fn = registry.resolve("portable_cpu", "attention", device="cpu").fn
    assert case.context is not None
    got = case.candidate(fn, t, case.context(p, t), p).float()
    want = case.stock(t, p)[:, :, 0, :].float()
    from ws1_contract import load_contract

    tol = load_contract().resolve("forward_accuracy", "attention", "bf16")  # the contract's, no private one
    assert torch.allclose(got, want, atol=tol.atol, rtol=tol.rtol)
    no_prefix = LayoutContext(torch.arange(p.m), torch.zeros(p.m, dtype=torch.int64))
    alone = case.candidate(fn, t, no_prefix, p).float()
    assert not torch.allclose(alone, want, atol=tol.atol, rtol=tol.rtol)


class _SlabOps:
    """A stand-in for a profile's ``StepOps``: attention over each row's slab keys in plain torch (fp32)."""

    @staticmethod
    def attention(q, k, v, key_base, n_keys, scale):  # type: ignore[no-untyped-def]
        out = []
        for i in range(q.shape[0]):
            b, n = int(key_base[i]), int(n_keys[i])
            g = q.shape[1] // k.shape[1]
            ki = k[b : b + n].float().repeat_interleave(g, dim=1)  # [n, Hq, D]
            vi = v[b : b + n].float().repeat_interleave(g, dim=1)
            w = torch.softmax(torch.einsum("hd,nhd->hn", q[i].float(), ki) * scale, dim=-1)
            out.append(torch.einsum("hn,nhd->hd", w, vi))
        return torch.stack(out)


def test_decode_step_call_reads_each_sample_s_cache_in_place() -> None:
    """The decode row's step-path call (what a rollout runs: keys read in place from the cache slab) equals the
    peer's SDPA over each sample's whole cache. Negative control: slab bases one sample off read another
    sample's keys and differ."""
    p = _decode_point()
    case = cases.CASES["attention_decode"]
    assert case.step is not None
    t = case.make(p, torch.device("cpu"), torch.Generator().manual_seed(0))
    want = case.stock(t, p)[:, :, 0, :].float()
    got = case.step(_SlabOps(), t, p)
    assert torch.allclose(got, want, atol=2e-2, rtol=2e-2)
    shifted = dict(t, key_base=torch.roll(t["key_base"], 1))
    assert not torch.allclose(case.step(_SlabOps(), shifted, p), want, atol=2e-2, rtol=2e-2)


def test_decode_row_times_the_step_path_where_the_profile_has_one() -> None:
    """A profile with step ops is timed on them (the rollout's call); one without, and a row with no step
    call, on the candidate's call."""
    from ws1_harness.run.bench.runner import step_path_ops
    from ws1_kernels.step_ops import StepOps

    decode = cases.CASES["attention_decode"]
    assert isinstance(step_path_ops(decode, "triton_cuda_bf16"), StepOps)
    assert step_path_ops(decode, "portable_cpu") is None
    assert step_path_ops(cases.CASES["attention"], "triton_cuda_bf16") is None


def test_decode_work_is_the_kv_cache_read() -> None:
    p = _decode_point(m=4)
    per_sample = (p.dims["C"] + 1) * p.dims["Hkv"] * p.dims["D"] * 2 * 2  # k and v, bf16
    assert cases.CASES["attention_decode"].work(p, "fwd") == 4 * per_sample
