"""The nox sessions check their inputs first and say what is wrong in one line, never with a traceback.

The noxfile is loaded as a module and its sessions are called with a stand-in session whose `error` raises (as
nox's does) and whose `install` fails the test: nothing is installed and no subprocess of nox is started.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from repo_scripts import load_noxfile

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def noxfile() -> ModuleType:
    return load_noxfile("ws1_noxfile_under_test")


class SessionError(Exception):
    """What nox's `session.error` does: stop the session with one message."""


class FakeSession:
    venv_backend = "virtualenv"

    def __init__(self, posargs: list[str] | None = None) -> None:
        self.posargs = posargs or []
        self.logged: list[str] = []

    def error(self, message: str) -> None:
        raise SessionError(message)

    def install(self, *args: str) -> None:
        raise AssertionError(f"installed {args} before the arguments were checked")

    def run(self, *args: object, **kwargs: object) -> None:
        raise AssertionError(f"ran {args} before the arguments were checked")

    def log(self, message: str) -> None:
        self.logged.append(message)

    def warn(self, message: str) -> None:
        self.logged.append(message)


def _one_line_error(call) -> str:
    with pytest.raises(SessionError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize("where", ["file", "under-file", "proc"])
def test_ws1_out_that_cannot_hold_evidence_is_one_line(noxfile, tmp_path, monkeypatch, where) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    out = {"file": a_file, "under-file": a_file / "sub", "proc": Path("/proc/ws1-no-such-dir")}[where]
    monkeypatch.setenv("WS1_OUT", str(out))
    message = _one_line_error(lambda: noxfile._evidence_dir(FakeSession(), "gate"))
    assert message.startswith(f"evidence directory (WS1_OUT={str(out)!r}): ")


def test_ws1_out_that_is_a_folder_is_used(noxfile, tmp_path, monkeypatch) -> None:
    """The negative control of the test above: a usable WS1_OUT gives its session folder."""
    monkeypatch.setenv("WS1_OUT", str(tmp_path / "ev"))
    assert noxfile._evidence_dir(FakeSession(), "gate") == tmp_path / "ev" / "gate"
    assert (tmp_path / "ev" / "gate").is_dir()


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda d: str(d / "missing.json"), "no such file"),
        (lambda d: str(d), "not a file"),
        (lambda d: (d / "shard.txt").write_text("{}") and str(d / "shard.txt"), "finalised evidence .json"),
        (lambda d: "--full", "options go to ws1 gate"),
    ],
    ids=["missing", "folder", "not-json", "option"],
)
def test_gate_session_checks_its_arguments_before_installing(noxfile, tmp_path, make, fragment) -> None:
    session = FakeSession([make(tmp_path)])
    message = _one_line_error(lambda: noxfile.gate(session))
    assert message.startswith("gate: ") and fragment in message


def test_gate_session_accepts_existing_shards(noxfile, tmp_path) -> None:
    """The negative control: real files pass the check (and the session goes on to install)."""
    shard = tmp_path / "s.json"
    shard.write_text("{}")
    assert noxfile.shard_args_problem([str(shard)]) is None
    with pytest.raises(AssertionError, match="installed"):
        noxfile.gate(FakeSession([str(shard)]))


def test_gpu_session_without_torch_says_torch_is_missing(noxfile, monkeypatch) -> None:
    """It once said "no CUDA device visible" in a venv that had no torch at all."""
    # the probe itself, run by an interpreter that cannot see site-packages: no torch there
    probe = subprocess.run([sys.executable, "-I", "-S", "-c", noxfile.GPU_PROBE], capture_output=True)
    assert probe.returncode == 3
    monkeypatch.setattr(noxfile, "GPU_PROBE", "import sys; sys.exit(3)")
    message = _one_line_error(lambda: noxfile._gpu_session(FakeSession(), "gpu_sm90"))
    assert "torch is not installed" in message and "CUDA" not in message.split("(")[0]
    monkeypatch.setattr(noxfile, "GPU_PROBE", "import sys; sys.exit(4)")
    assert "no CUDA device visible" in _one_line_error(
        lambda: noxfile._gpu_session(FakeSession(), "gpu_sm90")
    )


def test_ws1_out_inside_the_checkout_is_refused_before_a_folder_is_made(noxfile) -> None:
    """`WS1_OUT` inside the checkout once made the folder, then `ws1 matrix` refused it."""
    target = ROOT / "ws1-refused-nox-out" / "cpu_contract"
    problem = noxfile.evidence_dir_problem(target)
    assert problem is not None and "inside the checkout" in problem
    assert not target.parent.exists()


def test_ws1_out_outside_the_checkout_is_made(noxfile, tmp_path: Path) -> None:
    target = tmp_path / "ev" / "cpu_contract"
    assert noxfile.evidence_dir_problem(target) is None  # negative control: the check does not refuse all
    assert target.is_dir()


def test_a_proxy_session_runs_only_profiles_whose_code_it_builds(noxfile) -> None:
    """gpu_sm86 on an sm_90 card: Triton and the stock baseline are left out (their kernels are the device's arch),
    and naming one of them is a one-line error, never a shard labelled sm86-proxy that is not."""
    session = FakeSession([])
    assert noxfile._proxy_profiles(session, list(noxfile.GPU_PROFILES)) == ["cuda_bf16"]
    assert any("leaving out" in w for w in session.logged)
    named = FakeSession(["--profile", "triton_cuda_bf16"])
    assert "cannot run as an sm86 proxy" in _one_line_error(
        lambda: noxfile._proxy_profiles(named, ["triton_cuda_bf16"])
    )
    assert noxfile._proxy_profiles(FakeSession(["--profile", "cuda_bf16"]), ["cuda_bf16"]) == ["cuda_bf16"]


def test_gate_session_takes_expectations_apart_from_shards(noxfile) -> None:  # type: ignore[no-untyped-def]
    expects, rest = noxfile.split_expect(
        ["a.json", "--expect", "cuda_bf16@sm90", "b.json", "--expect", "x@y"]
    )
    assert expects == ["cuda_bf16@sm90", "x@y"] and rest == ["a.json", "b.json"]
    # control: a dangling --expect is kept as an empty value (the session refuses it), never swallowed silently
    assert noxfile.split_expect(["a.json", "--expect"]) == ([""], ["a.json"])
