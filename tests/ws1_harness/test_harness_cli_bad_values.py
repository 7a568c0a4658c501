"""Values a user may mistype: each is bad input (exit 2, one line), never a traceback, an internal error, a
false pass or a silent default. Every case here once went wrong in a new user's hands (the message it gave is
in each test's docstring)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from commit_support import REAL_COMMIT

from ws1_harness import cli

REPO = Path(__file__).resolve().parents[2]


def _bad(capsys, *args: object, fragment: str = "") -> str:
    code = cli.main([str(a) for a in args])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "0", "-3"])
def test_cell_timeout_must_be_finite_and_positive(tmp_path: Path, capsys, value: str) -> None:
    """`--cell-timeout 1e400` once ended in "internal error: OverflowError" and left a partial file."""
    _bad(capsys, "matrix", "--profile", "portable_cpu", "--cell-timeout", value, "--out", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_bench_rep_ms_inf_is_bad_input(tmp_path: Path, capsys) -> None:
    """`ws1 bench --rep-ms inf` once ended in "internal error: ValueError"."""
    _bad(
        capsys, "bench", "--profile", "portable_cpu", "--rep-ms", "inf", "--out", tmp_path, fragment="finite"
    )


@pytest.mark.parametrize("value", ["-4", "0"])
def test_bench_mm_n_must_be_positive(tmp_path: Path, capsys, value: str) -> None:
    """`--mm-n -4` once recorded an error ceiling and exited 0; `--mm-n 0` silently meant 512."""
    _bad(capsys, "bench", "--profile", "portable_cpu", "--mm-n", value, "--out", tmp_path, fragment=">= 1")


def test_bench_empty_out_is_refused(capsys, tmp_path: Path, monkeypatch) -> None:
    """`ws1 bench --out ""` once exited 0 and wrote into the current folder."""
    monkeypatch.chdir(tmp_path)
    _bad(capsys, "bench", "--profile", "portable_cpu", "--op", "silu", "--out", "", fragment="--out is empty")
    assert list(tmp_path.iterdir()) == []


def test_shard_that_holds_no_unit_is_refused(tmp_path: Path, capsys) -> None:
    """`--shard 5/10` of a one-unit run once exited 0 with an empty shard."""
    args = ["matrix", "--profile", "portable_cpu", "--op", "silu", "--tier", "short", "--shard", "5/10"]
    _bad(capsys, *args, "--out", tmp_path, fragment="holds no unit")


def test_negative_shard_names_the_rule(tmp_path: Path, capsys) -> None:
    """`--shard -1/2` once read "expected one argument"."""
    _bad(
        capsys,
        "matrix",
        "--profile",
        "portable_cpu",
        "--shard",
        "-1/2",
        "--out",
        tmp_path,
        fragment="0 <= i < n",
    )


@pytest.mark.parametrize("command", ["matrix", "bench"])
def test_plugin_that_exits_on_import_is_bad_input(tmp_path: Path, capsys, monkeypatch, command: str) -> None:
    """A plug-in calling sys.exit(3) on import once made `ws1 matrix` exit 3 ("pending only") silently."""
    (tmp_path / f"exits_plugin_{command}.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin = f"exits_plugin_{command}:X"
    args = [command, "--profile", "portable_cpu", "--candidates", plugin, "--out", tmp_path / "o"]
    _bad(capsys, *args, fragment="sys.exit(3)")


def test_chain_manifest_with_a_self_referencing_anchor_is_one_line(tmp_path: Path, capsys) -> None:
    """`ws1 chain --manifest` on `a: &a [*a]` once said "internal error"."""
    bad = tmp_path / "loop.yaml"
    bad.write_text("a: &a [*a]\n")
    args = ["chain", "--profile", "portable_cpu", "--manifest", bad, "--out", tmp_path / "o"]
    _bad(capsys, *args, fragment="itself")


@pytest.fixture
def committed_evidence(factory, monkeypatch) -> Path:
    monkeypatch.setenv("WS1_SOURCE_COMMIT", REAL_COMMIT)
    monkeypatch.setenv("WS1_SOURCE_DIRTY", "0")
    writer, _ = factory.write("committed")
    return writer.path


def test_expect_commit_accepts_the_abbreviated_sha(committed_evidence: Path, capsys) -> None:
    """`--expect-commit e6b4420` was once RED against evidence of that very commit's full sha."""
    assert cli.main(["gate", str(committed_evidence), "--expect-commit", REAL_COMMIT[:7]]) == 0
    capsys.readouterr()
    # negative control: another commit is still red
    assert cli.main(["gate", str(committed_evidence), "--expect-commit", "b" * 7]) == 1


@pytest.mark.parametrize("value", ["zzz", "abc", "-1"])
def test_expect_commit_that_is_no_sha_is_bad_input(committed_evidence: Path, capsys, value: str) -> None:
    """`--expect-commit zzz` was once exit 1 (red), as if the evidence were wrong."""
    _bad(capsys, "gate", committed_evidence, "--expect-commit", value, fragment="not a commit")


def test_gate_refuses_a_device_file_before_reading_it(capsys) -> None:
    """`ws1 gate /dev/zero` under a memory limit once ended in "internal error: MemoryError"."""
    _bad(capsys, "gate", "/dev/zero", fragment="not a regular file")


def test_gate_refuses_an_oversized_file_before_reading_it(tmp_path: Path, capsys, monkeypatch) -> None:
    from ws1_harness.verdict import evidence

    big = tmp_path / "big.json"
    big.write_text("{" + " " * 4096 + "}")
    monkeypatch.setattr(evidence, "MAX_EVIDENCE_BYTES", 1024)
    _bad(capsys, "gate", big, fragment="above the")


def test_json_number_beyond_a_double_names_the_file(tmp_path: Path, capsys) -> None:
    """Evidence holding 1e400 once gave "canonical_json: not canonical JSON", naming no file."""
    path = tmp_path / "huge.json"
    path.write_text(json.dumps({"a": 1}).replace("1", "1e400"))
    line = _bad(capsys, "gate", path, fragment="1e400")
    assert str(path) in line


def test_report_of_a_bench_file_inside_the_checkout_is_refused(tmp_path: Path, capsys) -> None:
    """`ws1 report` on a bench JSON inside the checkout once wrote there without --allow-in-checkout."""
    from ws1_harness.run.bench import is_bench_file

    bench = REPO / "docs" / "evidence" / "bench-h200-f102aaa" / "bench-triton_cuda_bf16-cuda.json"
    assert is_bench_file(str(bench))
    report = bench.with_name("bench-triton_cuda_bf16-cuda.report.md")
    before = report.read_bytes() if report.exists() else None
    out = REPO / "ws1-refused-bench-report"
    _bad(capsys, "report", bench, "--out", out, fragment="inside the git checkout")
    assert not out.exists()
    assert (report.read_bytes() if report.exists() else None) == before


def test_chain_device_cuda_without_a_gpu_names_the_flag(tmp_path: Path, capsys) -> None:
    """`ws1 chain --profile portable_cpu --device cuda` once said the profile "runs on CUDA"."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal cannot happen")
    line = _bad(capsys, "chain", "--profile", "portable_cpu", "--device", "cuda", "--out", tmp_path)
    assert "--device cuda" in line and "runs on CUDA" not in line


def test_empty_contract_path_is_named_as_empty(tmp_path: Path, capsys, committed_evidence: Path) -> None:
    """`--contract ""` once read "is a directory"."""
    _bad(capsys, "gate", committed_evidence, "--contract", "", fragment="empty")


def test_self_referencing_yaml_anchor_is_one_line(tmp_path: Path) -> None:
    """A manifest with `a: &a [*a]` once gave a RecursionError traceback from `ws1-workload describe`."""
    bad = tmp_path / "loop.yaml"
    bad.write_text("a: &a [*a]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ws1_workload", "describe", "--manifest", str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "refers to itself" in lines[0], proc.stderr


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "ws1_workload", "describe", "--json"],
        [sys.executable, "-m", "ws1_contract", "validate"],
    ],
    ids=["ws1-workload describe", "ws1-contract validate"],
)
def test_a_reader_that_leaves_gets_no_traceback(command: list[str]) -> None:
    """`... | head -c 3` once printed a BrokenPipeError traceback."""
    proc = subprocess.run(
        f"{subprocess.list2cmdline(command)} | head -c 3",
        shell=True,
        capture_output=True,
        text=True,
        check=False,
    )
    assert len(proc.stdout) == 3
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
