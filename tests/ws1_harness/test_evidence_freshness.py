"""Committed GPU evidence cannot go stale unnoticed: a bundle whose profile's sources (its backend, the floors under
every backend, `csrc/` for the CUDA profiles, the drop-in for chain files) changed after the commit it names fails
here, with the file and the commit in the message (ws1_harness.verdict.freshness).

A bundle known to be stale is listed in KNOWN_STALE with the reason; an entry there that is in fact fresh fails
too, so the list cannot outlive the rerun that replaces the bundle.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from evidence_files import EVIDENCE, REPO, evidence_files

from ws1_harness.verdict import freshness

#: bundle folder, or "folder/profile" for one profile's files in it, -> why that evidence is behind the code (to be
#: replaced by the next GPU run); every file a key covers must be stale, and only those files are exempt
KNOWN_STALE: dict[str, str] = {
    "merged-h200-35ae4ff/triton_cuda_bf16": (
        "the 36-layer chain and its companion matrix at 35ae4ff: at 349bad3 the step path's rope became two ops (its "
        "angles once a step, its rotation for q and k of every layer; triton_ops/step_ops.py, native.py, "
        "csrc/launch/ws1_launch.cpp), the same two kernels with the same arguments. The 36-layer chain at 1a8e22b on "
        "the H200 (steps-h200-1a8e22b, a chain-only bundle) is green with parity 0 on every tier, but no Triton matrix "
        "ran at 1a8e22b to merge it with, so this pair stays the one that passes gate --full --require-chain until a "
        "merged run on the H200 brings both"
    ),
}


def _bundles() -> list[tuple[Path, str, bool]]:
    return evidence_files()


def _folder(path: Path) -> str:
    return path.relative_to(EVIDENCE).parts[0]


def _known_stale_key(path: Path, profile: str) -> str | None:
    """The KNOWN_STALE key that covers this file, if any."""
    for key in (_folder(path), f"{_folder(path)}/{profile}"):
        if key in KNOWN_STALE:
            return key
    return None


def test_this_is_a_git_checkout_with_history() -> None:
    """The check needs the history: without it every test below would fail, this says why first."""
    proc = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert proc.returncode == 0, "not a git checkout: evidence freshness cannot be judged"


@pytest.mark.parametrize(
    ("path", "profile", "chain"),
    [b for b in _bundles() if _known_stale_key(b[0], b[1]) is None],
    ids=lambda x: str(x.relative_to(EVIDENCE)) if isinstance(x, Path) else str(x),
)
def test_committed_evidence_is_fresh(path: Path, profile: str, chain: bool) -> None:
    commit = json.loads(path.read_text())["provenance"]["git_commit"]
    staleness = freshness.check(REPO, str(path.relative_to(REPO)), profile, commit, chain=chain)
    assert staleness.changed == (), staleness.message()


@pytest.mark.parametrize("key", sorted(KNOWN_STALE))
def test_a_known_stale_bundle_is_really_stale(key: str) -> None:
    stale = []
    for path, profile, chain in _bundles():
        if _known_stale_key(path, profile) == key:
            commit = json.loads(path.read_text())["provenance"]["git_commit"]
            stale.append(freshness.check(REPO, path.name, profile, commit, chain=chain).changed)
    assert stale and all(stale), f"{key} is fresh (or gone): take it off KNOWN_STALE"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def toy_repo(tmp_path: Path) -> tuple[Path, str]:
    """A git repo holding one CUDA kernel file and one floor module, committed once."""
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@example.invalid")
    _git(tmp_path, "config", "user.name", "t")
    kernel = tmp_path / "csrc" / "kernels" / "norm.cu"
    kernel.parent.mkdir(parents=True)
    kernel.write_text("// v1\n")
    floor = tmp_path / freshness.FLOORS[0]
    floor.parent.mkdir(parents=True)
    floor.write_text("# v1\n")
    (tmp_path / "README.md").write_text("v1\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "v1")
    return tmp_path, _git(tmp_path, "rev-parse", "HEAD")


def test_untouched_sources_are_fresh(toy_repo: tuple[Path, str]) -> None:
    root, commit = toy_repo
    (root / "README.md").write_text("v2\n")  # not a source of the profile
    assert freshness.check(root, "ev.json", "cuda_bf16", commit).changed == ()


def test_a_planted_kernel_edit_is_stale_and_named(toy_repo: tuple[Path, str]) -> None:
    root, commit = toy_repo
    (root / "csrc" / "kernels" / "norm.cu").write_text("// v2\n")
    st = freshness.check(root, "ev.json", "cuda_bf16", commit)
    assert st.changed == ("csrc/kernels/norm.cu",)
    assert "csrc/kernels/norm.cu" in st.message() and commit[:12] in st.message()
    # the same edit does not touch the Triton profile's sources
    assert freshness.check(root, "ev.json", "triton_cuda_bf16", commit).changed == ()


def test_the_step_ops_cpp_path_stales_the_triton_profile_alone(toy_repo: tuple[Path, str]) -> None:
    root, commit = toy_repo
    src = root / "csrc" / "launch" / "ws1_launch.cpp"
    src.parent.mkdir()
    src.write_text("// the C++ step path\n")
    _git(root, "add", "-A")  # a new file counts once it is tracked
    assert freshness.check(root, "ev.json", "triton_cuda_bf16", commit).changed == (
        "csrc/launch/ws1_launch.cpp",
    )
    for profile in ("cuda_bf16", "cuda_bf16_sm90"):  # control: not in either CUDA module
        assert freshness.check(root, "ev.json", profile, commit).changed == ()
    # and a generic kernel stales the Hopper profile, which runs it beside its own
    (root / "csrc" / "kernels" / "norm.cu").write_text("// v2\n")
    assert freshness.check(root, "ev.json", "cuda_bf16_sm90", commit).changed == ("csrc/kernels/norm.cu",)


def test_a_floor_edit_stales_every_profile(toy_repo: tuple[Path, str]) -> None:
    root, commit = toy_repo
    (root / freshness.FLOORS[0]).write_text("# v2\n")
    for profile in ("cuda_bf16", "triton_cuda_bf16", "native_torch"):
        assert freshness.check(root, "ev.json", profile, commit).changed == (freshness.FLOORS[0],)


def test_an_unknown_commit_or_profile_is_an_error_not_a_pass(toy_repo: tuple[Path, str]) -> None:
    root, commit = toy_repo
    with pytest.raises(freshness.FreshnessError, match="not in the history"):
        freshness.check(root, "ev.json", "cuda_bf16", "0" * 40)
    with pytest.raises(freshness.FreshnessError, match="no source list"):
        freshness.check(root, "ev.json", "my_plugin_profile", commit)


def test_the_committed_36_layer_chains_are_judged() -> None:
    """Chain files are named with their model (`chain-<profile>.<arch>-<model>-L36.json`): each committed one is in
    the freshness check. The control: the pattern without the model matched none of them."""
    import re

    chains = sorted(EVIDENCE.rglob("chain-triton_cuda_bf16.*-L36.json"))
    judged = {p for p, _, chain in evidence_files() if chain}
    assert chains and set(chains) <= judged
    old = re.compile(r"^chain-([a-z0-9_]+)\.sm\d+[a-z]?(-proxy)?-L\d+\.json$")
    assert not any(old.match(p.name) for p in chains)
