"""Where the committed GPU evidence is and how its files are named: one place for the tests that read it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EVIDENCE = REPO / "docs" / "evidence"
#: Matrix evidence files are named `<profile>.<arch>.json`, the arch a proxy label where one ran
#: (`cuda_bf16.sm86-proxy.json`); chain files `chain-<profile>.<arch>-L<layers>.json`, bench files `bench-...`.
MATRIX_NAME = re.compile(r"^([a-z0-9_]+)\.sm\d+[a-z]?(-proxy)?\.json$")
#: a CPU shard carries no arch in its name (the committed CPU shard of the merged run)
CPU_MATRIX_NAME = re.compile(r"^(portable_cpu|native_torch)\.json$")
CHAIN_NAME = re.compile(r"^chain-([a-z0-9_]+)\.sm\d+[a-z]?(-proxy)?-L\d+\.json$")


def matrix_files() -> list[Path]:
    return sorted(p for p in EVIDENCE.rglob("*.json") if MATRIX_NAME.match(p.name))


def evidence_files() -> list[tuple[Path, str, bool]]:
    """(path, profile, is a chain file) of every matrix and chain file."""
    out = []
    for path in sorted(EVIDENCE.rglob("*.json")):
        m = MATRIX_NAME.match(path.name) or CPU_MATRIX_NAME.match(path.name)
        c = CHAIN_NAME.match(path.name)
        if m or c:
            out.append((path, (m or c).group(1), bool(c)))  # type: ignore[union-attr]
    return out


#: the committed cuda_bf16 shards of sm90 and of the sm86 proxy (the merge, environment and per-arch report tests)
CUDA_SM90 = sorted(EVIDENCE.glob("cuda-sm90-*/cuda_bf16/cuda_bf16.sm90.json"))
CUDA_PROXY = sorted(EVIDENCE.glob("cuda-sm86proxy-*/cuda_bf16/cuda_bf16.sm86-proxy.json"))


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


def _merged(first: Path, second: Path, tmp: Path) -> Path:
    """`first` and `second` merged by `ws1 merge` into `tmp/merged.json` (which must succeed)."""
    from ws1_harness.cli import main

    out = tmp / "merged.json"
    assert main(["merge", str(first), str(second), "--out", str(out)]) == 0
    return out


def cuda_shard_pair(tmp: Path) -> tuple[Path, Path]:
    """The committed sm90 and sm86-proxy cuda_bf16 shards as one commit's pair (`same_commit`)."""
    assert len(CUDA_SM90) == 1 and len(CUDA_PROXY) == 1, (CUDA_SM90, CUDA_PROXY)
    return CUDA_SM90[0], same_commit(CUDA_SM90[0], CUDA_PROXY[0], tmp)


def merged_cuda_pair(tmp: Path) -> Path:
    """The pair of `cuda_shard_pair` merged into `tmp/merged.json`."""
    return _merged(*cuda_shard_pair(tmp / "pair"), tmp)


#: the committed CPU shard of the merged run (portable_cpu at full widths, the CPU session's short and primary tiers)
CPU_PORTABLE = sorted(EVIDENCE.glob("cpu-portable-*/portable_cpu.json"))


def merged_cpu_gpu(tmp: Path) -> Path:
    """The committed CPU shard and the sm90 cuda_bf16 shard (`same_commit` as the CPU one) merged into
    `tmp/merged.json`."""
    assert len(CPU_PORTABLE) == 1 and len(CUDA_SM90) == 1, (CPU_PORTABLE, CUDA_SM90)
    cpu = CPU_PORTABLE[0]
    return _merged(cpu, same_commit(cpu, CUDA_SM90[0], tmp), tmp)
