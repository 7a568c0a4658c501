"""Bad input is one plain line and exit 2; only a bug in ws1 is called an internal error.

Every case here calls `ws1_harness.cli.main(argv)` in this process (a subprocess costs seconds of torch import per
case); `test_harness_cli.py` keeps one real subprocess per command.
"""

from __future__ import annotations

import subprocess
import sys
import types
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from ws1_harness import cli


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


def ws1(capsys, *args: object) -> Ran:
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return Ran(code, captured.out, captured.err)


def assert_bad_input(ran: Ran, fragment: str = "") -> str:
    """Exit 2, exactly one stderr line, not an internal error, and containing `fragment`."""
    assert ran.code == 2, ran
    lines = ran.err.strip().splitlines()
    assert len(lines) == 1, ran.err
    assert "internal error" not in lines[0] and "Traceback" not in ran.err
    assert fragment in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------------------ gate


@pytest.mark.parametrize("content", ["", "{", '{"cells": []}', "[1, 2]", '{"a": NaN}'])
def test_gate_bad_files(tmp_path: Path, capsys, content: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert_bad_input(ws1(capsys, "gate", path))


def test_gate_unknown_file(tmp_path: Path, capsys) -> None:
    assert_bad_input(ws1(capsys, "gate", tmp_path / "absent.json"), "no such file")


def test_gate_truncated_file(factory, capsys) -> None:
    writer, _ = factory.write("t")
    text = writer.path.read_text()
    writer.path.write_text(text[: len(text) - 40])
    assert_bad_input(ws1(capsys, "gate", writer.path))


def test_gate_pending_exit_3_and_allow(factory, capsys) -> None:
    expected = factory.Synth().expected()
    key = next(k for k, e in expected.items() if e.na_reason is None and e.required)
    pending, _ = factory.write(
        "pending", factory.Synth(overrides={key: ("pending_arch", "arch_unavailable")})
    )
    assert ws1(capsys, "gate", pending.path).code == 3
    assert ws1(capsys, "gate", pending.path, "--allow-pending-arch").code == 0


class _ClosedPipe:
    """A stdout whose reader has gone (`ws1 gate FILE | head -2`)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("status", ["green", "red"])
def test_gate_into_a_closed_pipe_keeps_its_verdict_quietly(factory, capsys, monkeypatch, status) -> None:
    """It once printed "internal error: BrokenPipeError" and exited 2 whatever the verdict."""
    expected = factory.Synth().expected()
    key = next(k for k, e in expected.items() if e.na_reason is None and e.required)
    overrides = {} if status == "green" else {key: ("red", "bits_differ")}
    writer, _ = factory.write(status, factory.Synth(overrides=overrides))
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    code = cli.main(["gate", str(writer.path)])
    assert code == (0 if status == "green" else 1)
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------------------------------------ arguments


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("nonsense",),
        ("gate",),
        ("gate", "a", "b"),
        ("merge", "--out", "x.json"),
        ("matrix", "--out", "d"),
        ("matrix", "--profile", "p", "--out", "d", "--shard", "3/2"),
        ("matrix", "--profile", "p", "--out", "d", "--cell-timeout", "-1"),
        ("gate", "x.json", "--bogus-flag"),
    ],
)
def test_bad_arguments(capsys, args: tuple[str, ...]) -> None:
    assert_bad_input(ws1(capsys, *args))


def test_a_bug_is_reported_as_an_internal_error_with_a_traceback_hint(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(args):
        raise RuntimeError("something ws1 did wrong")

    monkeypatch.setattr(cli, "_cmd_gate", broken)
    monkeypatch.delenv("WS1_TRACEBACK", raising=False)
    ran = ws1(capsys, "gate", tmp_path / "x.json")
    assert ran.code == 2
    assert ran.err.strip() == (
        "ws1: internal error: RuntimeError: something ws1 did wrong "
        "(a bug in ws1; rerun with WS1_TRACEBACK=1 for the traceback)"
    )
    monkeypatch.setenv("WS1_TRACEBACK", "1")
    ran = ws1(capsys, "gate", tmp_path / "x.json")
    assert ran.code == 2 and "Traceback (most recent call last)" in ran.err


@pytest.mark.parametrize("kind", ["device", "host"])
def test_running_out_of_memory_is_named_not_called_a_bug(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A 36-layer chain on an 80 GB card once ended in "internal error ... a bug in ws1". The control is the test
    above: any other exception still reads as a bug."""
    import torch

    error = (
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.32 GiB")
        if kind == "device"
        else MemoryError()
    )

    def starved(args):
        raise error

    monkeypatch.setattr(cli, "_cmd_gate", starved)
    ran = ws1(capsys, "gate", tmp_path / "x.json")
    assert ran.code == 2 and ran.err.count("\n") == 1
    assert (
        ran.err.startswith("ws1: out of memory: ")
        and "not a bug in ws1" in ran.err
        and "internal error" not in ran.err
    )


def test_every_harness_input_error_shares_one_base() -> None:
    from ws1_harness.errors import HarnessError
    from ws1_harness.run.bench.records import BenchInputError
    from ws1_harness.run.compare import ComparatorError
    from ws1_harness.run.matrix import MatrixInputError
    from ws1_harness.verdict.cells import CellError
    from ws1_harness.verdict.evidence import EvidenceError
    from ws1_harness.verdict.status import StatusError

    for cls in (BenchInputError, CellError, ComparatorError, EvidenceError, MatrixInputError, StatusError):
        assert issubclass(cls, HarnessError), cls
    assert issubclass(cli.UsageError, HarnessError)


# ------------------------------------------------------------------------------------------------ --out


def _out_cases(tmp_path: Path) -> dict[str, tuple[str, str]]:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    return {
        "empty": ("", "--out is empty"),
        "file": (str(a_file), "is a file, not a directory"),
        "under-file": (str(a_file / "sub"), "lies under"),
        "proc": ("/proc/ws1-no-such-dir", "cannot create"),
    }


@pytest.mark.parametrize("case", ["empty", "file", "under-file", "proc"])
def test_matrix_out_that_cannot_hold_evidence_is_one_line(tmp_path: Path, capsys, case: str) -> None:
    value, fragment = _out_cases(tmp_path)[case]
    line = assert_bad_input(ws1(capsys, "matrix", "--profile", "portable_cpu", "--out", value), fragment)
    assert line.startswith("ws1 matrix: --out")
    assert not list(Path.cwd().glob("portable_cpu*.json"))  # `--out ""` once wrote into the current folder


@pytest.mark.parametrize("case", ["empty", "file", "under-file", "proc"])
def test_report_out_that_cannot_hold_a_report_is_one_line(factory, tmp_path: Path, capsys, case: str) -> None:
    writer, _ = factory.write("rep")
    value, fragment = _out_cases(tmp_path)[case]
    if case == "proc":
        fragment = "cannot create /proc/ws1-no-such-dir"
    assert_bad_input(ws1(capsys, "report", writer.path, "--out", value), fragment)


@pytest.mark.parametrize("case", ["empty", "under-file", "proc", "directory", "not-json"])
def test_merge_out_that_cannot_be_written_is_one_line(factory, tmp_path: Path, capsys, case: str) -> None:
    writer, _ = factory.write("s0")
    cases = _out_cases(tmp_path)
    value, fragment = {
        "empty": cases["empty"],
        "under-file": (cases["under-file"][0] + "/m.json", "lies under"),
        "proc": ("/proc/ws1-no-such-dir/m.json", "cannot create"),
        "directory": (str(tmp_path / "d.json"), "is a directory"),
        "not-json": (str(tmp_path / "m.txt"), "must end in .json"),
    }[case]
    if case == "directory":
        (tmp_path / "d.json").mkdir()
    assert_bad_input(ws1(capsys, "merge", writer.path, "--out", value), fragment)


def test_merge_never_overwrites_an_input(factory, capsys) -> None:
    """`ws1 merge s0.json s1.json --out s1.json` once replaced the shard s1 with the merge."""
    keys = list(factory.Synth().expected())
    a, _ = factory.write("a", factory.Synth(only=keys[:5]))
    b, _ = factory.write("b", factory.Synth(only=keys[5:]))
    before = b.path.read_bytes()
    line = assert_bad_input(ws1(capsys, "merge", a.path, b.path, "--out", b.path), "is also an input")
    assert str(b.path) in line and b.path.read_bytes() == before
    # the same file spelled another way is the same file
    other = b.path.parent / ".." / b.path.parent.name / b.path.name
    assert_bad_input(ws1(capsys, "merge", a.path, b.path, "--out", other), "is also an input")


def test_merge_disagreeing_shards(factory, monkeypatch, tmp_path: Path, capsys) -> None:
    keys = list(factory.Synth().expected())
    monkeypatch.setenv("WS1_SOURCE_COMMIT", "1" * 40)
    a, _ = factory.write("a", factory.Synth(only=keys[:5]))
    monkeypatch.setenv("WS1_SOURCE_COMMIT", "2" * 40)
    b, _ = factory.write("b", factory.Synth(only=keys[5:]))
    assert_bad_input(ws1(capsys, "merge", a.path, b.path, "--out", tmp_path / "m.json"), "git commit")


def test_report_inside_the_checkout_is_refused(factory, tmp_path: Path, capsys) -> None:
    """`ws1 report --out` a folder of the checkout once left untracked files there."""
    if subprocess.run(["git", "--version"], capture_output=True).returncode != 0:
        pytest.skip("git not installed")
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    writer, _ = factory.write("rep")
    assert_bad_input(ws1(capsys, "report", writer.path, "--out", repo / "reports"), "inside the git checkout")
    assert not (repo / "reports").exists()
    # the negative control: allowed explicitly, it writes
    ran = ws1(capsys, "report", writer.path, "--out", repo / "reports", "--allow-in-checkout")
    assert ran.code == 0 and (repo / "reports" / "rep.report.md").is_file()


# ------------------------------------------------------------------------------------------------ matrix


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--profile", "no_such_profile"], "unknown profile 'no_such_profile'"),
        (["--profile", "portable_cpu", "--op", "no_such_op"], "unknown operator 'no_such_op'"),
        (["--profile", "portable_cpu", "--tier", "no_such_tier"], "unknown tier 'no_such_tier'"),
        (["--profile", "portable_cpu", "--model", "no_such_model"], "unknown model 'no_such_model'"),
        (["--profile", "portable_cpu", "--op", "silu", "--op", "silu"], "--op given twice"),
        (["--profile", "portable_cpu", "--tier", "short", "--tier", "short"], "--tier given twice"),
        (["--profile", "portable_cpu", "--shard", "3/2"], "shard"),
        (["--profile", "portable_cpu", "--op", "pack"], "layout-only operators have no candidate"),
    ],
    ids=["profile", "op", "tier", "model", "dup-op", "dup-tier", "shard", "layout-only"],
)
def test_matrix_user_mistakes_are_one_plain_line(
    tmp_path: Path, capsys, args: list[str], fragment: str
) -> None:
    line = assert_bad_input(ws1(capsys, "matrix", *args, "--out", tmp_path), fragment)
    assert line.startswith("ws1 matrix") or line.startswith("ws1: ")
    assert not list(tmp_path.glob("*.json*"))  # refused before any evidence is written


def _plugin_module(name: str, **attrs: object) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


def _bad_candidates() -> dict[str, tuple[str, dict[str, object]]]:
    """Each kind of broken `--candidates module:attr`: (spec, attributes of the module)."""
    from ws1_kernels import registry

    silu = registry.resolve("portable_cpu", "silu", device="cpu")

    def mine(profile: str, op: str = "silu"):
        base = silu if op == "silu" else registry.resolve("portable_cpu", op, device="cpu")
        return replace(base, profile=profile)

    def raises():
        raise RuntimeError("the plug-in's own factory failed")

    return {
        "no-colon": ("ws1_test_plugin", {}),
        "two-colons": ("ws1_test_plugin:a:b", {}),
        "no-module": ("ws1_no_such_module:P", {}),
        "no-attr": ("ws1_test_plugin:MISSING", {}),
        "not-a-pair": ("ws1_test_plugin:P", {"P": 42}),
        "pair-of-three": ("ws1_test_plugin:P", {"P": ("x", [], 3)}),
        "name-not-str": ("ws1_test_plugin:P", {"P": (7, [])}),
        "bad-name": ("ws1_test_plugin:P", {"P": ("Bad Name", [mine("bad")])}),
        "no-candidates": ("ws1_test_plugin:P", {"P": ("ws1_empty", [])}),
        "not-a-candidate": ("ws1_test_plugin:P", {"P": ("ws1_odd", ["silu"])}),
        "other-profile": ("ws1_test_plugin:P", {"P": ("ws1_mine", [mine("someone_else")])}),
        "two-for-one-op": ("ws1_test_plugin:P", {"P": ("ws1_twice", [mine("ws1_twice"), mine("ws1_twice")])}),
        "factory-raises": ("ws1_test_plugin:P", {"P": raises}),
        "built-in-name": ("ws1_test_plugin:P", {"P": ("portable_cpu", [mine("portable_cpu")])}),
    }


BAD_CANDIDATE_KINDS = (
    "no-colon",
    "two-colons",
    "no-module",
    "no-attr",
    "not-a-pair",
    "pair-of-three",
    "name-not-str",
    "bad-name",
    "no-candidates",
    "not-a-candidate",
    "other-profile",
    "two-for-one-op",
    "factory-raises",
    "built-in-name",
)


def test_every_kind_is_listed() -> None:
    assert set(BAD_CANDIDATE_KINDS) == set(_bad_candidates())


@pytest.mark.parametrize("kind", BAD_CANDIDATE_KINDS)
def test_every_kind_of_bad_candidates_is_one_plain_line(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Each once printed `ws1: internal error: MatrixInputError: ...` (or worse)."""
    from ws1_kernels import registry

    monkeypatch.setattr(registry, "_PROFILES", dict(registry._PROFILES))  # nothing registered leaks out
    spec, attrs = _bad_candidates()[kind]
    monkeypatch.setitem(sys.modules, "ws1_test_plugin", _plugin_module("ws1_test_plugin", **attrs))
    ran = ws1(capsys, "matrix", "--profile", "portable_cpu", "--candidates", spec, "--out", tmp_path)
    assert_bad_input(ran, f"ws1 matrix: --candidates {spec}: ")
    assert registry.resolve("portable_cpu", "silu", device="cpu").profile == "portable_cpu"


# ------------------------------------------------------------------------------------------------ help and docs


def test_matrix_help_states_the_real_defaults(capsys) -> None:
    """The help once said the default tier was every tier (it runs short and primary) and `--cell-timeout` was
    "per cell" (the limit is per unit)."""
    from ws1_harness.run.matrix import CPU_DEFAULT_TIERS, DEFAULT_CELL_TIMEOUT_S

    ran = ws1(capsys, "matrix", "--help")
    assert ran.code == 0
    text = " ".join(ran.out.split())
    assert f"default: {' and '.join(CPU_DEFAULT_TIERS)}" in text
    assert "default: every tier" not in text
    assert "seconds one unit" in text and f"(default {DEFAULT_CELL_TIMEOUT_S:g})" in text
    assert "per cell" not in text


def test_readme_lists_real_folders_and_links_the_matrix_doc() -> None:
    """The README listed `csrc/`, which does not exist, and its layout omitted docs/matrix.md."""
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text(encoding="utf-8")
    layout = readme.split("## Layout", 1)[1].split("```", 2)[1]
    listed = [line.split()[0] for line in layout.splitlines() if line and not line.startswith(" ")]
    assert listed, "no layout block"
    for entry in listed:
        assert (root / entry.rstrip("/")).exists(), f"README lists {entry}, which does not exist"
    assert "docs/matrix.md" in readme and "matrix" in layout
