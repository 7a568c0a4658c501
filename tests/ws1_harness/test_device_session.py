"""`ci/device_session.sh` (one device call from a clean clone, its steps chosen by the card that came): on a stand-in
checkout whose step runner only records what it was asked, with a stand-in `nvidia-smi` reporting the card's memory.

Each property has its control: the H200's mode on a 141 GB card against the H100's on an 80 GB one; the clone at
the commit asked for against HEAD; files newer than the checkout's git metadata (a warm device machine keeps the
.git of its first call) refused, and run in place when their tree is named, against a wrong tree; and each piece of
bad input (an unknown commit, an unknown mode, a merged run without its CPU shard) refused with one line and
exit 2."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "ci" / "device_session.sh"

#: the stand-in step runner: its arguments, and the variables a mode sets, one line each
RECORDER = """#!/usr/bin/env bash
{ echo "args $*"; echo "bench ${BENCH_ARGS:-}"; echo "merged_cpu ${MERGED_CPU:-}"; echo "nox_global ${NOX_GLOBAL-unset}";
  echo "head $(git rev-parse HEAD)"; echo "source ${WS1_SOURCE_COMMIT:-none} dirty ${WS1_SOURCE_DIRTY:-none}"; ls out;
  } > "$OUT/called.txt"
"""


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def checkout(tmp_path: Path) -> tuple[Path, str]:
    """A git checkout holding the script and the recorder, two commits (returns the first's sha), a CPU shard."""
    if shutil.which("git") is None or shutil.which("bash") is None:
        pytest.skip("no git or bash")
    root = tmp_path / "repo"
    (root / "ci").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "ci" / "device_session.sh")
    (root / "ci" / "device_gpu_run.sh").write_text(RECORDER)
    (root / ".gitignore").write_text("/out/\n")  # as in the project: the carried CPU shards are ignored
    _git(root, "init", "-q")
    _git(root, "add", "ci", ".gitignore")
    _git(root, "commit", "-q", "-m", "first")
    first = _git(root, "rev-parse", "HEAD").strip()
    (root / "later.txt").write_text("x\n")
    _git(root, "add", "later.txt")
    _git(root, "commit", "-q", "-m", "second")
    (root / "out" / "cpu-abc").mkdir(parents=True)  # git-ignored: copied all the same
    return root, first


def _run(root: Path, tmp: Path, mib: int, **env: str) -> tuple[subprocess.CompletedProcess[str], str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/usr/bin/env bash\necho {mib}\n")
    smi.chmod(0o755)
    out = tmp / f"out-{mib}-{len(env)}"
    out.mkdir()
    full = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "OUT": str(out),
            "CLONE_DIR": str(tmp / "clone"), "MODE_H200": "steps", "MODE_H100": "validate", **env}  # fmt: skip
    proc = subprocess.run(["bash", str(root / "ci" / "device_session.sh")], env=full, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    called = out / "called.txt"
    return proc, called.read_text() if called.is_file() else ""


def test_an_h200_runs_its_own_mode(checkout: tuple[Path, str], tmp_path: Path) -> None:
    root, _ = checkout
    proc, called = _run(root, tmp_path, 143771)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "args launch chain bench host" in called and "--batch 256" in called and "train_step" in called
    assert "mode steps" in proc.stdout


def test_an_h100_runs_the_other_mode(checkout: tuple[Path, str], tmp_path: Path) -> None:
    """The control: the same command on an 80 GB card runs MODE_H100."""
    root, _ = checkout
    proc, called = _run(root, tmp_path, 81559)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "args launch script host chain" in called and "mode validate" in proc.stdout


def test_the_clone_is_the_commit_asked_for_with_the_cpu_shards(
    checkout: tuple[Path, str], tmp_path: Path
) -> None:
    root, first = checkout
    head = _git(root, "rev-parse", "HEAD").strip()
    proc, called = _run(
        root, tmp_path, 143771, MODE_H200="merged", MERGED_CPU="out/cpu-abc", RUN_COMMIT=first
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"head {first}" in called and "cpu-abc" in called and "merged_cpu out/cpu-abc" in called
    assert "args merged" in called and "nox_global \n" in called  # each profile in its own environment
    _, called = _run(root, tmp_path, 143771, MODE_H200="merged", MERGED_CPU="out/cpu-abc")
    assert f"head {head}" in called  # the control: HEAD when no commit is named


def test_an_80g_card_runs_both_halves_and_the_gate_in_one_call(
    checkout: tuple[Path, str], tmp_path: Path
) -> None:
    """merged-80g: merged-1, merged-2 and the merged gate as the steps of one call, with the CPU shard (control: the
    same mode without the shard is refused before any step runs)."""
    root, _ = checkout
    proc, called = _run(root, tmp_path, 81559, MODE_H100="merged-80g", MERGED_CPU="out/cpu-abc")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "args merged-1 merged-2 merged-gate" in called and "merged_cpu out/cpu-abc" in called
    assert "nox_global \n" in called  # each profile in its own environment
    proc, called = _run(root, tmp_path, 81559, MODE_H100="merged-80g")
    assert proc.returncode == 2 and called == "" and "set MERGED_CPU" in proc.stdout


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"RUN_COMMIT": "0123456789abcdef0123456789abcdef01234567"}, "no commit 0123456789"),
        ({"MODE_H200": "fastest"}, "unknown mode fastest"),
        ({"MODE_H200": "merged"}, "set MERGED_CPU"),
        ({"MODE_H200": ""}, "set MODE_H200"),
        ({"SOURCE_COMMIT": "1a8e22b", "SOURCE_TREE": "ab" * 20}, "full 40-hex commit"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    checkout: tuple[Path, str], tmp_path: Path, env: dict[str, str], says: str
) -> None:
    root, _ = checkout
    proc, called = _run(root, tmp_path, 143771, **env)
    assert proc.returncode == 2 and called == ""
    assert says in proc.stdout and len(proc.stdout.strip().splitlines()[-1]) < 200


def _newer_files(root: Path) -> None:
    """The device copy after a warm call: the files of a later commit under the first call's git metadata."""
    (root / "later.txt").write_text("y\n")
    (root / "new_kernel.cu").write_text("// a file the metadata has never seen\n")


def _tree_of(root: Path, tmp: Path) -> str:
    """What `git rev-parse <commit>^{tree}` gives on the developer's side for these files: committed in a copy."""
    copy = tmp / "dev-side"
    shutil.copytree(root, copy)
    _git(copy, "add", "-A")
    _git(copy, "commit", "-q", "-m", "the later commit")
    return _git(copy, "rev-parse", "HEAD^{tree}").strip()


def test_files_newer_than_the_metadata_are_refused(checkout: tuple[Path, str], tmp_path: Path) -> None:
    root, _ = checkout
    _newer_files(root)
    proc, called = _run(root, tmp_path, 143771)
    assert proc.returncode == 2 and called == ""
    assert "differ from this checkout's HEAD" in proc.stdout and "SOURCE_TREE" in proc.stdout


def test_named_files_run_in_place_stating_their_commit(checkout: tuple[Path, str], tmp_path: Path) -> None:
    root, _ = checkout
    stale_head = _git(root, "rev-parse", "HEAD").strip()
    _newer_files(root)
    commit = "ab" * 20
    proc, called = _run(root, tmp_path, 143771, SOURCE_COMMIT=commit, SOURCE_TREE=_tree_of(root, tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"source {commit} dirty 0" in called and f"head {stale_head}" in called  # in place, not a clone
    assert f"commit {commit}" in proc.stdout


def test_a_wrong_tree_is_refused(checkout: tuple[Path, str], tmp_path: Path) -> None:
    """The control: the tree of other files (the metadata's own commit) does not pass for these."""
    root, _ = checkout
    head_tree = _git(root, "rev-parse", "HEAD^{tree}").strip()
    _newer_files(root)
    proc, called = _run(root, tmp_path, 143771, SOURCE_COMMIT="ab" * 20, SOURCE_TREE=head_tree)
    assert proc.returncode == 2 and called == ""
    assert "not SOURCE_TREE" in proc.stdout
