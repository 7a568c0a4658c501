"""`ci/device_command.sh` (the device call's command line for this checkout's HEAD, its commit and tree taken from
git): on a stand-in checkout with `ci/device_session.sh` and a step runner that only records what it was asked.

The printed command, run where the files are HEAD's, passes device_session.sh's tree check and states HEAD's full
commit to the harness; the control: the same command after another commit is refused (it is bound to the files it
was printed for). Bad input (a dirty tree, no mode, an argument that is not NAME=VALUE) is one line and exit 2.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECORDER = (
    '#!/usr/bin/env bash\necho "args $* source ${WS1_SOURCE_COMMIT:-none} dirty ${WS1_SOURCE_DIRTY:-none}'
    ' profiles ${PROFILES:-none}" > "$OUT/called.txt"\n'
)


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def root(tmp_path: Path) -> Path:
    if shutil.which("git") is None or shutil.which("bash") is None:
        pytest.skip("no git or bash")
    root = tmp_path / "repo"
    (root / "ci").mkdir(parents=True)
    for name in ("device_command.sh", "device_session.sh"):
        shutil.copy(REPO / "ci" / name, root / "ci" / name)
    (root / "ci" / "device_gpu_run.sh").write_text(RECORDER)
    (root / ".gitignore").write_text("/out/\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "first")
    return root


def _print(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(root / "ci" / "device_command.sh"), *args], capture_output=True, text=True, timeout=60
    )


def _run_on_device(root: Path, tmp: Path, command: str) -> tuple[int, str, str]:
    """The printed command as the device would run it, less its wheel install (no wheels here): in the checkout's
    root, with $OUT and a stand-in nvidia-smi for a 141 GB card. (exit status, its output, what the runner saw)."""
    body = command.split("|| exit;", 1)[1]
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text("#!/usr/bin/env bash\necho 143771\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    out = tmp / "device-out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "OUT": str(out)}
    proc = subprocess.run(
        ["bash", "-c", body], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    packed = tmp / "device-back"  # what comes back: $OUT packed into one archive
    shutil.rmtree(packed, ignore_errors=True)
    packed.mkdir()
    subprocess.run(["tar", "xzf", str(out / "all.tgz"), "-C", str(packed)], check=True)
    session = packed / "session.log"
    called = packed / "called.txt"
    log = session.read_text() if session.is_file() else ""
    return proc.returncode, proc.stdout + log, called.read_text() if called.is_file() else ""


def test_the_command_runs_head_in_place_stating_its_full_commit(root: Path, tmp_path: Path) -> None:
    printed = _print(root, "MODE_H200=steps", "MODE_H100=validate")
    assert printed.returncode == 0, printed.stdout
    head = _git(root, "rev-parse", "HEAD").strip()
    assert f"SOURCE_COMMIT={head} " in printed.stdout and printed.stdout.count("\n") == 1
    rc, out, called = _run_on_device(root, tmp_path, printed.stdout)
    assert f"source {head} dirty 0" in called and "args launch chain bench host" in called, out


def test_the_control_the_command_is_bound_to_its_commit(root: Path, tmp_path: Path) -> None:
    printed = _print(root, "MODE_H200=steps", "MODE_H100=validate").stdout
    (root / "later.txt").write_text("a later commit's file\n")
    _git(root, "add", "later.txt")
    _git(root, "commit", "-q", "-m", "second")
    _, out, called = _run_on_device(root, tmp_path, printed)
    assert called == "" and "not SOURCE_TREE" in out


def test_a_follow_up_script_runs_with_the_commit_stated(root: Path, tmp_path: Path) -> None:
    """The `script` mode hands a carried file from the ignored out/ to the runner's `script` step, under the same
    tree check, with HEAD's commit stated to the harness (a follow-up once recorded the machine's older commit). The
    stand-in runner records the step and the commit; it does not run the file. Control: a script file that is not
    there is refused before any step runs."""
    (root / "out").mkdir()
    (root / "out" / "f.sh").write_text("# a follow-up's commands\n")
    printed = _print(root, "MODE_H200=script", "MODE_H100=script", "SCRIPT_FILE=out/f.sh")
    assert printed.returncode == 0, printed.stdout
    head = _git(root, "rev-parse", "HEAD").strip()
    rc, out, called = _run_on_device(root, tmp_path, printed.stdout)
    assert f"source {head} dirty 0" in called and "args script" in called, out
    missing = _print(root, "MODE_H200=script", "MODE_H100=script", "SCRIPT_FILE=out/none.sh").stdout
    rc, out, called = _run_on_device(root, tmp_path, missing)
    assert called == "" and "out/none.sh is not a file here" in out


def test_the_profiles_mode_runs_the_named_profiles(root: Path, tmp_path: Path) -> None:
    """`MODE_*=profiles PROFILES=a,b`: the runner's `profiles` step with the list, under the tree check. Control: a
    list that is not profile names is refused before any step runs."""
    printed = _print(root, "MODE_H200=profiles", "MODE_H100=profiles", "PROFILES=cuda_bf16_sm90,cuda_bf16")
    assert printed.returncode == 0, printed.stdout
    rc, out, called = _run_on_device(root, tmp_path, printed.stdout)
    assert "args profiles" in called and "profiles cuda_bf16_sm90,cuda_bf16" in called, out
    bad = _print(root, "MODE_H200=profiles", "MODE_H100=profiles", "PROFILES=cuda_bf16_sm90,").stdout
    rc, out, called = _run_on_device(root, tmp_path, bad)
    assert called == "" and "PROFILES must be profile names" in out


@pytest.mark.parametrize(
    ("args", "dirty", "says"),
    [
        (["MODE_H200=merged"], True, "uncommitted changes"),
        (["MERGED_CPU=out/cpu-x"], False, "give the mode"),
        (["MODE_H200=merged; rm -rf /"], False, "is not NAME=VALUE"),
        (["merged"], False, "is not NAME=VALUE"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(root: Path, args: list[str], dirty: bool, says: str) -> None:
    if dirty:
        (root / "ci" / "device_session.sh").write_text("# edited\n")
    proc = _print(root, *args)
    assert proc.returncode == 2 and says in proc.stdout and proc.stdout.count("\n") == 1, proc.stdout
