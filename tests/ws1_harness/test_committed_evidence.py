"""The committed GPU evidence is evidence the shipped gate accepts, one current bundle per (profile, arch).

Evidence that the code no longer reads (another workload or contract revision, another schema) says nothing
about the code that ships; this test runs the shipped `ws1 gate` over every matrix file under `docs/evidence/`
on every CI run, so such a bundle fails CI and gets replaced (older runs stay in git history, named in
docs/evidence/README.md). The native baseline must stay red with a verdict (it is the gate's negative control:
a gate call that could only pass would prove nothing).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from evidence_files import CPU_PORTABLE, EVIDENCE, MATRIX_NAME, matrix_files

from ws1_harness import cli

#: Profiles recorded as a baseline, never gated: expected red.
BASELINES = frozenset({"native_torch"})


def _matrix_files() -> list[Path]:
    return matrix_files()


def test_there_is_committed_gpu_evidence() -> None:
    assert _matrix_files(), "no matrix evidence under docs/evidence: the bundle index points at nothing"


@pytest.mark.parametrize("path", _matrix_files(), ids=lambda p: str(p.relative_to(EVIDENCE)))
def test_every_committed_matrix_file_gets_the_verdict_it_claims(path: Path) -> None:
    profile = path.name.split(".", 1)[0]
    code = cli.main(["gate", str(path)])
    if profile in BASELINES:
        assert code == 1, f"{path}: the baseline must gate red with a verdict (exit 1), got {code}"
    else:
        assert code == 0, (
            f"{path}: the shipped gate refuses committed evidence (exit {code}); replace the bundle"
        )


def test_the_matrix_name_pattern_takes_proxy_shards_and_nothing_else() -> None:
    """A proxy shard once escaped this test because the pattern had no room for its label."""
    assert MATRIX_NAME.match("cuda_bf16.sm86-proxy.json") and MATRIX_NAME.match("cuda_bf16.sm90.json")
    for name in (
        "chain-triton_cuda_bf16.sm90-L36.json",
        "bench-cuda_bf16-cuda.json",
        "cuda_bf16.sm90.partial.json",
    ):
        assert not MATRIX_NAME.match(name), name


@pytest.mark.parametrize(
    "path",
    [
        p
        for p in _matrix_files()
        if not p.parent.name.endswith("-tiny") and p.name.split(".")[0] not in BASELINES
    ],
    ids=lambda p: str(p.relative_to(EVIDENCE)),
)
def test_every_full_width_bundle_passes_the_full_gate(path: Path) -> None:
    """`--full` demands every operator at every tier at full widths: what the bundle index claims."""
    assert cli.main(["gate", "--full", str(path)]) == 0, path


def test_one_current_bundle_per_profile_and_arch() -> None:
    """Two folders holding a full-width matrix of the same (profile, arch) would leave the current one unclear."""
    seen: dict[tuple[str, str], Path] = {}
    for path in _matrix_files():
        if path.parent.name.endswith("-tiny"):
            continue
        key = path.name[: -len(".json")].rsplit(".", 1)
        bundle = path.relative_to(EVIDENCE).parts[0]
        other = seen.setdefault((key[0], key[1]), Path(bundle))
        assert other == Path(bundle), f"{key} in both {other} and {bundle}"


def test_the_current_triton_bundle_passes_full_with_its_36_layer_chain(tmp_path: Path) -> None:
    """The full-width matrix and the 36-layer chain shards merge and pass `gate --full --require-chain`."""
    matrices = [
        p
        for p in _matrix_files()
        if p.name.startswith("triton_cuda_bf16.") and p.parent.name == "triton_cuda_bf16"
    ]
    assert len(matrices) == 1, matrices
    bundle = matrices[0].parent.parent
    chains = sorted(bundle.rglob("chain-triton_cuda_bf16.*-L36.json"))
    assert chains, f"{bundle}: no 36-layer chain evidence"
    merged = tmp_path / "merged.json"
    assert cli.main(["merge", "--out", str(merged), str(matrices[0]), *map(str, chains)]) == 0
    assert cli.main(["gate", "--full", "--require-chain", str(merged)]) == 0
    # negative control: without the chain shards, --require-chain refuses the same matrix
    assert cli.main(["gate", "--full", "--require-chain", str(matrices[0])]) != 0


def test_a_committed_file_with_one_edited_verdict_is_refused(tmp_path: Path) -> None:
    """Negative control: the gate call above can fail; a copy of a passing file with one cell edited is refused."""
    src = next(p for p in _matrix_files() if p.name.startswith("triton_cuda_bf16."))
    copy = tmp_path / src.name
    text = src.read_text()
    assert '"green"' in text
    copy.write_text(text.replace('"green"', '"red"', 1))
    assert cli.main(["gate", str(src)]) == 0
    assert cli.main(["gate", str(copy)]) != 0


@pytest.mark.parametrize("path", CPU_PORTABLE, ids=lambda p: str(p.relative_to(EVIDENCE)))
def test_the_committed_cpu_shard_passes_on_its_plan(path: Path, capsys: pytest.CaptureFixture) -> None:
    """The CPU shard of the merged run passes the shipped gate; `--full` finds exactly one gap, the tier the CPU
    session's plan leaves out (the control: the full gate is not silently satisfied by a CPU shard)."""
    assert cli.main(["gate", str(path)]) == 0, path
    capsys.readouterr()
    assert cli.main(["gate", "--full", str(path)]) == 1
    problems = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  [red]")]
    assert problems == ["  [red] --full: not the complete cell set: tiers 2/3"], problems


def test_there_is_a_committed_cpu_shard() -> None:
    assert len(CPU_PORTABLE) == 1, CPU_PORTABLE
