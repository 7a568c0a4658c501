"""The committed GPU evidence is evidence the shipped gate accepts, one current bundle per (profile, arch).

Evidence that the code no longer reads (another workload or contract revision, another schema) says nothing
about the code that ships; this test runs the shipped `ws1 gate` over every matrix file under `docs/evidence/`
on every CI run, so such a bundle fails CI and gets replaced (older runs stay in git history, named in
docs/evidence/README.md). The native baseline must stay red with a verdict (it is the gate's negative control:
a gate call that could only pass would prove nothing).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
from evidence_files import (
    CHAIN_COMPANIONS,
    CHAIN_ONLY,
    EVIDENCE,
    MATRIX_NAME,
    SHARD_NAME,
    MatrixSet,
    current_set,
    matrix_sets,
    set_file,
)

from ws1_harness import cli

#: Profiles recorded as a baseline, never gated: expected red.
BASELINES = frozenset({"native_torch"})


def _sets() -> list[MatrixSet]:
    """Every committed matrix run, single file or sharded (`evidence_files.matrix_sets`)."""
    return matrix_sets()


def _label(s: MatrixSet) -> str:
    return s.label


def test_there_is_committed_gpu_evidence() -> None:
    assert [s for s in _sets() if s.arch != "cpu"], "no GPU matrix evidence under docs/evidence"


@pytest.mark.parametrize("matrix", _sets(), ids=_label)
def test_every_committed_matrix_gets_the_verdict_it_claims(matrix: MatrixSet, tmp_path: Path) -> None:
    """Each single file, and each sharded run's shards merged as the merged gate merges them."""
    path = set_file(matrix, tmp_path)
    code = cli.main(["gate", str(path)])
    if matrix.profile in BASELINES:
        assert code == 1, f"{matrix.label}: the baseline must gate red with a verdict (exit 1), got {code}"
    else:
        assert code == 0, (
            f"{matrix.label}: the shipped gate refuses committed evidence (exit {code}); replace the bundle"
        )


def test_a_sharded_run_missing_a_shard_is_named(tmp_path: Path) -> None:
    """A committed sharded run must hold all its shards; the control: a complete run has none missing."""
    sharded = [s for s in _sets() if s.shards]
    assert sharded, "no sharded run is committed: the sets above never merged shards"
    whole = sharded[0]
    assert whole.missing_shards() == []
    lost = MatrixSet(whole.profile, whole.arch, whole.files[1:], whole.shards)
    assert lost.missing_shards() == [0]
    with pytest.raises(AssertionError, match="shards \\[0\\] are not committed"):
        set_file(lost, tmp_path)


def test_the_matrix_name_pattern_takes_proxy_shards_and_nothing_else() -> None:
    """A proxy shard once escaped this test because the pattern had no room for its label."""
    assert MATRIX_NAME.match("cuda_bf16.sm86-proxy.json") and MATRIX_NAME.match("cuda_bf16.sm90.json")
    for name in (
        "chain-triton_cuda_bf16.sm90-L36.json",
        "bench-cuda_bf16-cuda.json",
        "cuda_bf16.sm90.partial.json",
        "cuda_bf16.sm90.shard-0-of-2.json",
    ):
        assert not MATRIX_NAME.match(name), name
    assert SHARD_NAME.match("cuda_bf16.sm86-proxy.shard-1-of-2.json")
    for name in ("cuda_bf16.sm90.shard-0-of-2.partial.json", "cuda_bf16.sm90.json"):
        assert not SHARD_NAME.match(name), name


@pytest.mark.parametrize(
    "matrix",
    [s for s in _sets() if not s.tiny and s.arch != "cpu" and s.profile not in BASELINES],
    ids=_label,
)
def test_every_full_width_bundle_passes_the_full_gate(matrix: MatrixSet, tmp_path: Path) -> None:
    """`--full` demands every operator at every tier at full widths: what the bundle index claims."""
    assert cli.main(["gate", "--full", str(set_file(matrix, tmp_path))]) == 0, matrix.label


def test_one_current_bundle_per_profile_and_arch() -> None:
    """Two folders holding a full-width matrix of the same (profile, arch) would leave the current one unclear;
    a sharded run counts once."""
    seen: dict[tuple[str, str], str] = {}
    for matrix in _sets():
        if matrix.tiny or matrix.bundle in CHAIN_COMPANIONS:
            continue
        other = seen.setdefault((matrix.profile, matrix.arch), matrix.label)
        assert other == matrix.label, f"{matrix.profile}@{matrix.arch} in both {other} and {matrix.label}"


def _all_chain_bundles() -> list[str]:
    return sorted(
        {p.relative_to(EVIDENCE).parts[0] for p in EVIDENCE.rglob("chain-triton_cuda_bf16.*-L36.json")}
    )


def _chain_bundles() -> list[str]:
    """The bundles whose 36-layer chain is merged with a matrix of its run (CHAIN_ONLY's have none)."""
    return [b for b in _all_chain_bundles() if b not in CHAIN_ONLY]


@pytest.mark.parametrize("folder", sorted(CHAIN_ONLY))
def test_a_chain_only_bundle_passes_its_own_gate(folder: str) -> None:
    """A chain run alone (no matrix of its commit) still passes `ws1 gate` on its own cells (reduced)."""
    chains = sorted((EVIDENCE / folder).rglob("chain-triton_cuda_bf16.*-L36.json"))
    assert chains, f"{folder}: no 36-layer chain: take it off CHAIN_ONLY"
    for path in chains:
        assert cli.main(["gate", str(path)]) == 0, path


def test_the_control_an_edited_chain_is_refused(tmp_path: Path) -> None:
    """The gate call above can fail: a chain-only bundle's chain with its first tier's parity turned false."""
    import json

    folder = sorted(CHAIN_ONLY)[0]
    path = sorted((EVIDENCE / folder).rglob("chain-triton_cuda_bf16.*-L36.json"))[0]
    doc = json.loads(path.read_text())
    doc["chain_cells"][0]["judgments"][0]["passed"] = False
    bad = tmp_path / path.name
    bad.write_text(json.dumps(doc))
    assert cli.main(["gate", str(bad)]) != 0


def test_the_36_layer_chain_passes_full_with_its_own_runs_matrix(tmp_path: Path) -> None:
    """The 36-layer chain and the full-width triton matrix of the same bundle (one run, one commit) merge and pass
    `gate --full --require-chain`."""
    bundles = _chain_bundles()
    assert len(bundles) == 1, f"expected one bundle with the 36-layer chain, found {bundles}"
    bundle = EVIDENCE / bundles[0]
    chains = sorted(bundle.rglob("chain-triton_cuda_bf16.*-L36.json"))
    matrices = [
        s for s in _sets() if s.bundle == bundles[0] and s.profile == "triton_cuda_bf16" and not s.tiny
    ]
    assert len(matrices) == 1, f"{bundle}: expected one full-width triton matrix beside the chain"
    merged = tmp_path / "merged.json"
    assert cli.main(["merge", "--out", str(merged), *map(str, matrices[0].files), *map(str, chains)]) == 0
    assert cli.main(["gate", "--full", "--require-chain", str(merged)]) == 0
    # negative control: without the chain shards, --require-chain refuses the same matrix
    alone = set_file(matrices[0], tmp_path / "alone")
    assert cli.main(["gate", "--full", "--require-chain", str(alone)]) != 0


def _companion_problems(
    companions: Iterable[str], chain_bundles: list[str], sets: list[MatrixSet]
) -> list[str]:
    """Why a listed chain companion should come off the list: no chain beside it, no matrix left, or it holds
    the only full-width matrix of a (profile, arch) (then it is the current bundle, not a companion)."""
    problems = []
    for folder in companions:
        if folder not in chain_bundles:
            problems.append(f"{folder}: no 36-layer chain: take it off CHAIN_COMPANIONS")
        kept = [s for s in sets if s.bundle == folder and not s.tiny]
        if not kept:
            problems.append(f"{folder}: no matrix left: take it off CHAIN_COMPANIONS")
        for matrix in kept:
            others = [
                s
                for s in sets
                if (s.profile, s.arch) == (matrix.profile, matrix.arch) and not s.tiny and s.bundle != folder
            ]
            if not others:
                problems.append(f"{folder}: it holds the only {matrix.profile}@{matrix.arch} matrix")
    return problems


def test_a_chain_companion_holds_a_chain_and_is_not_the_current_matrix() -> None:
    """A companion stays only while it has a reason: a chain beside it, and a newer current matrix elsewhere
    (else it is simply the current bundle and belongs off the list)."""
    assert _companion_problems(CHAIN_COMPANIONS, _chain_bundles(), _sets()) == []


def test_a_companion_without_a_reason_is_named() -> None:
    """Negative controls on the real sets: the current Triton bundle listed as a companion is named twice over, for
    holding the only matrix of its (profile, arch), and, once its chain is left out, for having no chain."""
    sets, chains = _sets(), _chain_bundles()
    current = current_set("triton_cuda_bf16", "sm90").bundle
    assert any("holds the only" in p for p in _companion_problems([current], chains, sets))
    without_chain = [c for c in chains if c != current]
    assert any("no 36-layer chain" in p for p in _companion_problems([current], without_chain, sets))
    # control: a bundle off the list with a chain and a newer matrix elsewhere would raise nothing
    assert _companion_problems([], chains, sets) == []


def test_a_committed_file_with_one_edited_verdict_is_refused(tmp_path: Path) -> None:
    """Negative control: the gate call above can fail; a copy of a passing file with one cell edited is refused."""
    src = set_file(current_set("triton_cuda_bf16", "sm90"), tmp_path / "current")
    copy = tmp_path / src.name
    text = src.read_text()
    assert '"green"' in text
    copy.write_text(text.replace('"green"', '"red"', 1))
    assert cli.main(["gate", str(src)]) == 0
    assert cli.main(["gate", str(copy)]) != 0


@pytest.mark.parametrize(
    "path", [s.files[0] for s in matrix_sets() if s.arch == "cpu"], ids=lambda p: str(p.relative_to(EVIDENCE))
)
def test_the_committed_cpu_shard_passes_on_its_plan(path: Path, capsys: pytest.CaptureFixture) -> None:
    """The CPU shard of the merged run passes the shipped gate; `--full` finds exactly one gap, the tier the CPU
    session's plan leaves out (the control: the full gate is not silently satisfied by a CPU shard)."""
    assert cli.main(["gate", str(path)]) == 0, path
    capsys.readouterr()
    assert cli.main(["gate", "--full", str(path)]) == 1
    problems = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  [red]")]
    assert problems == ["  [red] --full: not the complete cell set: tiers 2/3"], problems


def test_there_is_a_committed_cpu_shard() -> None:
    cpu = [s.label for s in matrix_sets() if s.arch == "cpu"]
    assert len(cpu) == 1, cpu
