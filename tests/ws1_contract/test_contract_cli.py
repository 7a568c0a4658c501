"""`ws1-contract` / `python -m ws1_contract`: exit 0 with output, or exit 2 with exactly one stderr line.

One real subprocess per command (validate, resolve, fingerprint) proves the entry points; every bad-input case
calls `main(argv)` in this process, which is the same code without the interpreter start-up.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ws1_contract import load_contract
from ws1_contract.cli import main


def _run(*args: str, console_script: bool = False) -> subprocess.CompletedProcess[str]:
    if console_script:
        exe = shutil.which("ws1-contract", path=str(Path(sys.executable).parent))
        if exe is None:
            pytest.skip("ws1-contract console script is not installed next to this python")
        cmd = [exe, *args]
    else:
        cmd = [sys.executable, "-m", "ws1_contract", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def _main(*args: str) -> subprocess.CompletedProcess[str]:
    """`ws1-contract ARGS` in this process: exit code and both streams, as a subprocess would report them."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # --help: argparse exits by itself, as it does in the real command
            code = exc.code if isinstance(exc.code, int) else 0
    return subprocess.CompletedProcess(["ws1-contract", *args], code, out.getvalue(), err.getvalue())


def _assert_bad_input(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert result.returncode == 2, result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("console_script", [False, True], ids=["python-m", "console-script"])
def test_validate_shipped(console_script: bool) -> None:
    result = _run("validate", console_script=console_script)
    assert result.returncode == 0, result.stderr
    assert load_contract().fingerprint in result.stdout
    assert "valid" in result.stdout and result.stderr == ""


def test_validate_and_fingerprint_a_file(tmp_path: Path, doc: dict[str, Any]) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert _main("validate", str(path)).returncode == 0
    result = _run("fingerprint", str(path))
    assert result.returncode == 0
    assert result.stdout.strip() == load_contract(path).fingerprint == load_contract().fingerprint


def test_resolve_prints_the_spec_as_json() -> None:
    result = _run(
        "resolve",
        "--judgment",
        "gradient_accuracy",
        "--op-class",
        "gemm",
        "--dtype",
        "bf16",
        "--arch",
        "sm90",
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    contract = load_contract()
    assert {
        k: out[k] for k in contract.resolve("gradient_accuracy", "gemm", "bf16").to_json()
    } == contract.resolve("gradient_accuracy", "gemm", "bf16").to_json()
    assert out["arch"] == "sm90" and out["contract_fingerprint"] == contract.fingerprint


def test_resolve_with_explicit_contract(tmp_path: Path, doc: dict[str, Any]) -> None:
    doc["judgments"]["forward_accuracy"]["gemm"]["bf16"]["atol"] = 0.25
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    args = (
        "resolve",
        "--judgment",
        "forward_accuracy",
        "--op-class",
        "gemm",
        "--dtype",
        "bf16",
        "--contract",
        str(path),
    )
    result = _main(*args)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["atol"] == 0.25


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "c.json"
    path.write_text(text, encoding="utf-8")
    return str(path)


RESOLVE = ("resolve", "--judgment", "forward_accuracy", "--op-class", "gemm")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((), "the following arguments are required: COMMAND"),
        (("bogus",), "invalid choice: 'bogus'"),
        (("validate", "a", "b"), "unrecognized arguments: b"),
        (
            ("resolve", "--judgment", "forward_accuracy"),
            "the following arguments are required: --op-class, --dtype",
        ),
        (("fingerprint", "--frobnicate"), "unrecognized arguments: --frobnicate"),
        (("validate", "/nonexistent/c.json"), "/nonexistent/c.json: file not found"),
        (("fingerprint", "/nonexistent/c.json"), "file not found"),
        ((*RESOLVE, "--dtype", "fp8"), "cell is out_of_scope"),
        ((*RESOLVE, "--dtype", "bfloat16"), "unknown dtype 'bfloat16'"),
        (
            ("resolve", "--judgment", "forward", "--op-class", "gemm", "--dtype", "bf16"),
            "unknown judgment 'forward'",
        ),
        (
            ("resolve", "--judgment", "forward_accuracy", "--op-class", "mm", "--dtype", "bf16"),
            "unknown op class 'mm'",
        ),
        ((*RESOLVE, "--dtype", "bf16", "--arch", "sm 90"), "bad arch"),
        ((*RESOLVE, "--dtype", "bf16", "--contract", "/nonexistent/c.json"), "file not found"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: tuple[str, ...], fragment: str) -> None:
    _assert_bad_input(_main(*args), fragment)


def test_bad_files_exit_2_with_one_line(tmp_path: Path, doc: dict[str, Any]) -> None:
    _assert_bad_input(_main("validate", _write(tmp_path, '{"a": ')), "invalid JSON")
    _assert_bad_input(_main("validate", str(tmp_path)), "is a directory")
    doc["judgments"]["forward_invariance"]["gemm"]["bf16"]["atol"] = 1e-3
    _assert_bad_input(
        _main("validate", _write(tmp_path, json.dumps(doc))),
        "$.judgments.forward_invariance.gemm.bf16.atol: a bitwise cell has atol = rtol = 0",
    )
    doc["judgments"]["forward_invariance"]["gemm"]["bf16"]["atol"] = 0.0
    doc["chain"]["bogus"] = {"x": "\n".join(["multi", "line"])}
    _assert_bad_input(
        _main("fingerprint", _write(tmp_path, json.dumps(doc))), "$.chain: Additional properties"
    )


@pytest.mark.parametrize("atol", [10**400, 1e308], ids=["integer-10^400", "1e308"])
@pytest.mark.parametrize("command", ["validate", "resolve"])
def test_threshold_out_of_range_is_refused_by_validate_and_resolve(
    tmp_path: Path, doc: dict[str, Any], atol: float, command: str
) -> None:
    """Once a traceback in `resolve` (an integer atol of 10^400 overflowed float()) and accepted by `validate`."""
    doc["judgments"]["forward_accuracy"]["gemm"]["bf16"]["atol"] = atol
    path = _write(tmp_path, json.dumps(doc))
    args = ("validate", path) if command == "validate" else (*RESOLVE, "--dtype", "bf16", "--contract", path)
    _assert_bad_input(_main(*args), "$.judgments.forward_accuracy.gemm.bf16.atol: atol is ")


def test_resolve_not_applicable_reports_reason(tmp_path: Path, doc: dict[str, Any]) -> None:
    doc["judgments"]["gradient_accuracy"]["logprob"]["bf16"] = {
        "status": "not_applicable",
        "mode": None,
        "atol": None,
        "rtol": None,
        "reason": "layout_only",
    }
    path = _write(tmp_path, json.dumps(doc))
    args = (
        "resolve",
        "--judgment",
        "gradient_accuracy",
        "--op-class",
        "logprob",
        "--dtype",
        "bf16",
        "--contract",
        path,
    )
    _assert_bad_input(_main(*args), "cell is not_applicable: layout_only")


def test_help_exits_0() -> None:
    result = _main("--help")
    assert result.returncode == 0 and "validate" in result.stdout
