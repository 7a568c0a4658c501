"""The workflows (`.github/workflows/`) and the scripts they call (`ci/`): the project's rules hold for the
committed files, and each rule fails on a workflow broken on purpose (ci/check_workflows.py); the merged-gate
script picks exactly the gated full-width shards (ci/merged_gate.py); the arch assertion refuses without a GPU
(ci/assert_gpu_arch.sh)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from repo_scripts import ROOT, load_repo_script

check = load_repo_script("ci/check_workflows.py", "check_workflows")
merged_gate = load_repo_script("ci/merged_gate.py", "merged_gate")
WORKFLOWS = ROOT / ".github" / "workflows"
SM90 = (WORKFLOWS / "gpu_sm90.yml").read_text()
GPU = (WORKFLOWS / "gpu.yml").read_text()


def test_the_committed_workflows_keep_every_rule() -> None:
    assert check.main([str(WORKFLOWS)]) == 0
    assert {p.name for p in WORKFLOWS.glob("*.yml")} >= {"cpu.yml", "gpu.yml", "gpu_sm86.yml", "gpu_sm90.yml"}


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        (
            "sm90",
            SM90.replace("persist-credentials: false", "persist-credentials: true"),
            "persist-credentials",
        ),
        ("sm90", SM90.replace("timeout-minutes: 60", ""), "no timeout-minutes"),
        ("sm90", SM90.replace("contents: read", "contents: write"), "read-only"),
        (
            "sm90",
            SM90.replace("  workflow_dispatch:", "  workflow_dispatch:\n  pull_request_target:"),
            "pull_request_target",
        ),
        ("sm90", SM90.replace("bash ci/assert_gpu_arch.sh 9.0", "echo skipped"), "assert_gpu_arch"),
        (
            "sm90",
            SM90.replace("    if: github.repository_owner", "    if: true || github.x"),
            "same-repository",
        ),
        ("sm90", SM90.replace("ci/assert_gpu_arch.sh", "ci/no_such_script.sh"), "does not exist"),
        ("sm90", SM90 + "# see trap 25\n", "numbered note"),
        (
            "gpu",
            GPU.replace("needs: [cpu_shard, sm86, sm90]", "needs: [cpu_shard, sm90]"),
            "must need every shard",
        ),
    ],
    ids=["credentials", "timeout", "token", "prt", "arch", "guard", "script", "note", "needs"],
)
def test_a_workflow_broken_on_purpose_is_caught(name: str, text: str, needle: str) -> None:
    assert text != (SM90 if name == "sm90" else GPU), "the mutation did not apply"
    found = check.problems_of(name, text)
    assert any(needle in p for p in found), found


def test_building_before_the_arch_assertion_is_caught() -> None:
    swapped = SM90.replace(
        "      - name: Assert the GPU arch before building\n        run: bash ci/assert_gpu_arch.sh 9.0\n", ""
    ).replace(
        "        run: python3 -m nox --no-venv -s gpu_sm90\n",
        "        run: python3 -m nox --no-venv -s gpu_sm90\n      - run: bash ci/assert_gpu_arch.sh 9.0\n",
    )
    assert any("before asserting" in p for p in check.problems_of("sm90", swapped))


def _shard(
    path: Path, profiles: list[str], tiers: list[str], finalised: bool = True, merged_from: int = 0
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"finalised": finalised, "axes": {"profiles": profiles, "tiers": tiers}, "chain_cells": []}
    doc["shards"] = [{"file": f"part-{i}.json"} for i in range(merged_from)]
    path.write_text(json.dumps(doc))
    return path


def test_merged_gate_picks_gated_full_width_shards_only(tmp_path: Path) -> None:
    good = [
        _shard(tmp_path / "cpu" / "portable_cpu.json", ["portable_cpu"], ["short", "primary", "long"]),
        _shard(tmp_path / "sm90" / "cuda_bf16" / "cuda_bf16.sm90.json", ["cuda_bf16@sm90"], ["short"]),
    ]
    _shard(tmp_path / "cpu" / "native_torch.json", ["native_torch"], ["short"])  # the baseline
    _shard(tmp_path / "sm90" / "cuda_bf16-tiny" / "cuda_bf16.sm90.json", ["cuda_bf16@sm90"], ["short@tiny"])
    _shard(tmp_path / "sm90" / "x.partial.json", ["cuda_bf16@sm90"], ["short"])
    _shard(tmp_path / "sm90" / "crashed.json", ["cuda_bf16@sm90"], ["short"], finalised=False)
    (tmp_path / "sm90" / "report.json").write_text("[1, 2]")
    assert merged_gate.pick([tmp_path]) == sorted(good)


def test_merged_gate_picks_a_sessions_shards_not_its_merge_of_them(tmp_path: Path) -> None:
    """A session that ran a matrix in shards merges them for its own verdict; the merged gate must take the
    shards (a merge of a merge is refused), and the control: the same file without `shards` is picked."""
    parts = [
        _shard(
            tmp_path / "t" / f"triton_cuda_bf16.sm90.shard-{i}-of-2.json",
            ["triton_cuda_bf16@sm90"],
            ["short"],
        )
        for i in range(2)
    ]
    merged = _shard(tmp_path / "t" / "merged" / "triton_cuda_bf16.sm90.json", ["triton_cuda_bf16@sm90"], ["short"],
                    merged_from=2)  # fmt: skip
    assert merged_gate.pick([tmp_path]) == sorted(parts)
    _shard(merged, ["triton_cuda_bf16@sm90"], ["short"])
    assert merged in merged_gate.pick([tmp_path])


def test_merged_gate_with_nothing_to_pick_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert merged_gate.main([str(tmp_path)]) == 2
    assert merged_gate.main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "not a folder" in err


def test_merged_gate_passes_the_expectations_to_the_gate_session(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    _shard(tmp_path / "a" / "cuda_bf16.sm90.json", ["cuda_bf16@sm90"], ["short"])
    assert merged_gate.main([str(tmp_path), "--expect", "cuda_bf16@sm90", "--dry-run"]) == 0
    cmd = capsys.readouterr().out
    assert "-s gate --" in cmd and cmd.rstrip().endswith("--expect cuda_bf16@sm90")


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_arch_assertion_refuses_without_a_usable_gpu() -> None:
    """This CPU host has no CUDA device: the assertion must refuse (exit 2, one line), never pass."""
    for args in (["9.0"], ["8.6", "--proxy-on", "9.0"], []):
        proc = subprocess.run(
            ["bash", str(ROOT / "ci" / "assert_gpu_arch.sh"), *args], capture_output=True, text=True
        )
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (args, proc.stderr)
