"""Provenance is always collected; a missing git never reads as a clean tree (traps 6 and 22)."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from ws1_harness.verdict import provenance
from ws1_harness.verdict.provenance import collect_provenance, git_state


def test_collects_every_field() -> None:
    prov = collect_provenance(["ws1", "gate", "x"]).to_json()
    for key in ("git_commit", "git_dirty", "device", "torch", "triton", "python", "platform", "argv"):
        assert key in prov
    assert prov["argv"] == ["ws1", "gate", "x"]
    assert prov["device"] in ("cpu", "cuda")
    assert isinstance(prov["git_dirty"], bool)
    json.dumps(prov, allow_nan=False)


def test_no_hostname_recorded() -> None:
    host = socket.gethostname()
    text = json.dumps(collect_provenance([]).to_json())
    if len(host) >= 4:
        assert host not in text


def test_git_missing_is_unknown_and_dirty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WS1_SOURCE_COMMIT", raising=False)
    monkeypatch.setattr(provenance.shutil, "which", lambda name: None)
    assert git_state() == ("unknown", True, "unknown")


def test_outside_a_checkout_is_unknown_and_dirty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WS1_SOURCE_COMMIT", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert git_state(tmp_path) == ("unknown", True, "unknown")


def test_clean_and_dirty_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WS1_SOURCE_COMMIT", raising=False)
    if provenance.shutil.which("git") is None:
        pytest.skip("git not installed")
    env = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.txt").write_text("a\n")
    subprocess.run(["git", "-C", str(tmp_path), "add", "a.txt"], check=True)
    subprocess.run(["git", "-C", str(tmp_path), *env, "commit", "-q", "-m", "a"], check=True)
    commit, dirty, source = git_state(tmp_path)
    assert len(commit) == 40 and dirty is False and source == "git"
    (tmp_path / "a.txt").write_text("b\n")
    assert git_state(tmp_path)[1] is True


def test_environment_override_is_labelled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WS1_SOURCE_COMMIT", "a" * 40)
    monkeypatch.delenv("WS1_SOURCE_DIRTY", raising=False)
    assert git_state() == ("a" * 40, True, "env")  # dirty unless stated clean
    monkeypatch.setenv("WS1_SOURCE_DIRTY", "0")
    assert git_state() == ("a" * 40, False, "env")


@pytest.mark.parametrize("bad", ["not-a-sha", "c75c590", "a" * 39])
def test_environment_commit_must_be_a_full_sha(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    """An abbreviated or malformed commit is refused (one line), never recorded as `unknown` in silence."""
    from ws1_harness.verdict.provenance import ProvenanceError

    monkeypatch.setenv("WS1_SOURCE_COMMIT", bad)
    with pytest.raises(ProvenanceError, match="full 40-hex commit"):
        git_state()


def test_arch_proxy_is_recorded_only_when_declared(monkeypatch) -> None:
    from ws1_harness.verdict.provenance import collect_provenance

    monkeypatch.delenv("WS1_ARCH_PROXY", raising=False)
    assert collect_provenance(["ws1"]).arch_proxy is None
    monkeypatch.setenv("WS1_ARCH_PROXY", "sm86 PTX on sm_90")
    assert collect_provenance(["ws1"]).to_json()["arch_proxy"] == "sm86 PTX on sm_90"


def test_evidence_never_records_machine_paths() -> None:
    """Committed evidence must not carry the writer's absolute paths (output folders, checkout location)."""
    from ws1_harness.verdict.provenance import portable_command, portable_path, repo_root

    assert portable_path("/root/out/ev/native_torch") == ".../ev/native_torch"
    assert portable_path("--tier") == "--tier" and portable_path("short") == "short"
    root = repo_root()
    assert root is not None
    assert portable_path(str(root / "docs" / "x.json")) == "docs/x.json"
    assert portable_command(["/usr/bin/ws1", "matrix", "--out", "/tmp/abc/def"]) == (
        "ws1",
        "matrix",
        "--out",
        ".../abc/def",
    )
