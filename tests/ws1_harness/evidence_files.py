"""Where the committed GPU evidence is and how its files are named: one place for the tests that read it."""

from __future__ import annotations

import functools
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EVIDENCE = REPO / "docs" / "evidence"
#: Matrix evidence files are named `<profile>.<arch>.json`, the arch a proxy label where one ran
#: (`cuda_bf16.sm86-proxy.json`); chain files `chain-<profile>.<arch>-L<layers>.json`, bench files `bench-...`.
MATRIX_NAME = re.compile(r"^([a-z0-9_]+)\.sm\d+[a-z]?(-proxy)?\.json$")
#: a CPU shard carries no arch in its name (the committed CPU shard of the merged run)
CPU_MATRIX_NAME = re.compile(r"^(portable_cpu|native_torch)\.json$")
#: `ws1 chain`'s evidence: `chain-<profile>.<arch>[-<model>]-L<layers>.json` (the model is in the name since the
#: chain took --model: a pattern without it matched no committed chain, so no chain file was judged fresh or stale)
CHAIN_NAME = re.compile(r"^chain-([a-z0-9_]+)\.sm\d+[a-z]?(?:-proxy)?(?:-[a-z0-9][a-z0-9.-]*?)?-L\d+\.json$")
#: one of the shards of a matrix run as `ws1 matrix --shard i/n` (the GPU sessions' full-width matrices):
#: `<profile>.<arch>.shard-<i>-of-<n>.json`, all n of them in one folder
SHARD_NAME = re.compile(r"^([a-z0-9_]+)\.(sm\d+[a-z]?(?:-proxy)?)\.shard-(\d+)-of-(\d+)\.json$")


@dataclass(frozen=True)
class MatrixSet:
    """One matrix run's evidence: a single file, or the n shard files of one sharded run in one folder."""

    profile: str
    arch: str  # "cpu" for a CPU shard, whose name carries no arch
    files: tuple[Path, ...]
    shards: int  # 0: a single file

    @property
    def folder(self) -> Path:
        return self.files[0].parent

    @property
    def bundle(self) -> str:
        """The folder under docs/evidence that holds it."""
        return self.files[0].relative_to(EVIDENCE).parts[0]

    @property
    def tiny(self) -> bool:
        return self.folder.name.endswith("-tiny")

    @property
    def label(self) -> str:
        return str(self.folder.relative_to(EVIDENCE) / f"{self.profile}.{self.arch}")

    def missing_shards(self) -> list[int]:
        """The shard numbers of a sharded run with no file here (a set the merged gate would refuse)."""
        have = {int(SHARD_NAME.match(p.name).group(3)) for p in self.files}  # type: ignore[union-attr]
        return [i for i in range(self.shards) if i not in have]


def matrix_sets() -> list[MatrixSet]:
    """Every committed matrix run: each single file, and each folder's shards of one run grouped into one set."""
    sets: list[MatrixSet] = []
    groups: dict[tuple[Path, str, str, int], list[Path]] = {}
    for path in sorted(EVIDENCE.rglob("*.json")):
        single = MATRIX_NAME.match(path.name)
        if single:
            sets.append(MatrixSet(single.group(1), path.name.split(".")[1], (path,), 0))
        elif CPU_MATRIX_NAME.match(path.name):
            sets.append(MatrixSet(path.name.split(".")[0], "cpu", (path,), 0))
        elif shard := SHARD_NAME.match(path.name):
            key = (path.parent, shard.group(1), shard.group(2), int(shard.group(4)))
            groups.setdefault(key, []).append(path)
    for (_, profile, arch, n), files in groups.items():
        sets.append(MatrixSet(profile, arch, tuple(sorted(files)), n))
    return sorted(sets, key=lambda s: s.label)


def set_file(matrix: MatrixSet, tmp: Path) -> Path:
    """The file the gate reads for a set: the single file, or its shards merged by `ws1 merge` into `tmp`."""
    if not matrix.shards:
        return matrix.files[0]
    assert not matrix.missing_shards(), f"{matrix.label}: shards {matrix.missing_shards()} are not committed"
    tmp.mkdir(parents=True, exist_ok=True)
    return _merge_into(list(matrix.files), tmp / f"{matrix.profile}.{matrix.arch}.json")


def evidence_files() -> list[tuple[Path, str, bool]]:
    """(path, profile, is a chain file) of every matrix file (single, CPU or shard) and chain file."""
    out = []
    for path in sorted(EVIDENCE.rglob("*.json")):
        m = MATRIX_NAME.match(path.name) or CPU_MATRIX_NAME.match(path.name) or SHARD_NAME.match(path.name)
        c = CHAIN_NAME.match(path.name)
        if m or c:
            out.append((path, (m or c).group(1), bool(c)))  # type: ignore[union-attr]
    return out


#: Bundles whose full-width matrix is kept only beside the 36-layer chain of the same run (a chain merges only with
#: a matrix of its own commit), not as the current matrix of its (profile, arch): folder -> why.
CHAIN_COMPANIONS: dict[str, str] = {
    "merged-h200-35ae4ff": (
        "the 36-layer triton_cuda_bf16 chain at 35ae4ff on the H200 and that run's triton matrix, which it merges "
        "with; the current matrices are merged-h100-7ffcc41's (no chain ran at 7ffcc41: no H200 came)"
    ),
}


#: Bundles holding a 36-layer chain with no matrix of its commit beside it (a device call that ran the chain alone):
#: the chain passes its own gate (reduced: no matrix cell) and its freshness is judged, but `--require-chain` needs a
#: matrix of the same commit, so the chain companion above stays the one that is merged and gated in full: folder -> why.
CHAIN_ONLY: dict[str, str] = {
    "steps-h200-1a8e22b": (
        "the 36-layer triton_cuda_bf16 chain at 1a8e22b on the H200 (the long tier finalised; short and primary judged "
        "green in the call before, kept as a partial file the step's time limit cut): no merged run came at 1a8e22b"
    ),
}


def current_set(profile: str, arch: str) -> MatrixSet:
    """The one full-width committed matrix of (profile, arch) (test_committed_evidence holds it to one); a chain
    companion's matrix is not current."""
    found = [
        s
        for s in matrix_sets()
        if (s.profile, s.arch) == (profile, arch) and not s.tiny and s.bundle not in CHAIN_COMPANIONS
    ]
    assert len(found) == 1, (
        f"{profile}@{arch}: expected one current full-width matrix, found {[s.label for s in found]}"
    )
    return found[0]


_CURRENT_DIR = Path(tempfile.mkdtemp(prefix="ws1-current-evidence-"))


@functools.cache
def current_file(profile: str, arch: str) -> Path:
    """`current_set`'s file for the gate: its shards merged once per test process."""
    return set_file(current_set(profile, arch), _CURRENT_DIR / f"{profile}.{arch}")


def cuda_sm90() -> Path:
    """The committed cuda_bf16@sm90 matrix (the merge, environment and per-arch report tests)."""
    return current_file("cuda_bf16", "sm90")


def same_commit(ref: Path, shard: Path, tmp: Path) -> Path:
    """`shard`, or a copy of it in `tmp` carrying `ref`'s commit and dirty flag when the two differ.

    The tests that pair committed shards of different runs are about merging, environments, tier plans and where
    the arches disagree, not about which commit ran (the merge's refusal of two commits has its own tests)."""
    import json

    a, b = json.loads(ref.read_text()), json.loads(shard.read_text())
    if a["provenance"]["git_commit"] == b["provenance"]["git_commit"]:
        return shard
    b["provenance"]["git_commit"] = a["provenance"]["git_commit"]
    b["provenance"]["git_dirty"] = a["provenance"]["git_dirty"]
    tmp.mkdir(parents=True, exist_ok=True)
    copy = tmp / shard.name
    copy.write_text(json.dumps(b), encoding="utf-8")
    return copy


def _merge_into(files: list[Path], out: Path) -> Path:
    """`files` (original shards, never a merged file: the merge refuses those) merged by `ws1 merge` into `out`
    (which must succeed)."""
    from ws1_harness.cli import main

    assert main(["merge", *map(str, files), "--out", str(out)]) == 0, [f.name for f in files]
    return out


def _merged(files: list[Path], tmp: Path) -> Path:
    return _merge_into(files, tmp / "merged.json")


def _one_commit(ref: Path, files: tuple[Path, ...], tmp: Path) -> list[Path]:
    return [same_commit(ref, f, tmp) for f in files]


def merged_cuda_pair(tmp: Path) -> Path:
    """The committed sm90 and sm86-proxy cuda_bf16 matrices (every shard of each) as one commit's files
    (`same_commit`), merged into `tmp/merged.json`."""
    sm90, proxy = current_set("cuda_bf16", "sm90").files, current_set("cuda_bf16", "sm86-proxy").files
    return _merged([*sm90, *_one_commit(sm90[0], proxy, tmp / "pair")], tmp)


def merged_cpu_gpu(tmp: Path) -> Path:
    """The committed CPU shard and the sm90 cuda_bf16 matrix (`same_commit` as the CPU one) merged into
    `tmp/merged.json`."""
    cpu = current_set("portable_cpu", "cpu").files
    return _merged([*cpu, *_one_commit(cpu[0], current_set("cuda_bf16", "sm90").files, tmp / "pair")], tmp)
