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


def cuda_shard_pair(tmp: Path) -> tuple[Path, Path]:
    """The committed sm90 and sm86-proxy cuda_bf16 shards as one commit's pair.

    When the current bundles name two commits (one was rerun alone), the proxy shard is copied into `tmp` with the
    sm90 shard's commit: the tests that use the pair are about merging, environments and where the arches disagree,
    not about which commit ran (the merge's refusal of two commits has its own tests)."""
    import json

    assert len(CUDA_SM90) == 1 and len(CUDA_PROXY) == 1, (CUDA_SM90, CUDA_PROXY)
    sm90, proxy = CUDA_SM90[0], CUDA_PROXY[0]
    a, b = json.loads(sm90.read_text()), json.loads(proxy.read_text())
    if a["provenance"]["git_commit"] == b["provenance"]["git_commit"]:
        return sm90, proxy
    b["provenance"]["git_commit"] = a["provenance"]["git_commit"]
    b["provenance"]["git_dirty"] = a["provenance"]["git_dirty"]
    tmp.mkdir(parents=True, exist_ok=True)
    copy = tmp / proxy.name
    copy.write_text(json.dumps(b), encoding="utf-8")
    return sm90, copy


def merged_cuda_pair(tmp: Path) -> Path:
    """The pair of `cuda_shard_pair` merged by `ws1 merge` into `tmp/merged.json` (which must succeed)."""
    from ws1_harness.cli import main

    sm90, proxy = cuda_shard_pair(tmp / "pair")
    out = tmp / "merged.json"
    assert main(["merge", str(sm90), str(proxy), "--out", str(out)]) == 0
    return out


#: the committed CPU shard of the merged run (portable_cpu at full widths, the CPU session's short and primary tiers)
CPU_PORTABLE = sorted(EVIDENCE.glob("cpu-portable-*/portable_cpu.json"))


def merged_cpu_gpu(tmp: Path) -> Path:
    """The committed CPU shard and the sm90 cuda_bf16 shard merged into `tmp/merged.json` (which must succeed).

    The GPU shard is copied with the CPU shard's commit when the two differ: the tests that use the pair are about
    the tier plans of a merged run, not about which commit ran (the merge's refusal of two commits has its own
    tests)."""
    import json

    from ws1_harness.cli import main

    assert len(CPU_PORTABLE) == 1 and len(CUDA_SM90) == 1, (CPU_PORTABLE, CUDA_SM90)
    cpu, gpu = CPU_PORTABLE[0], CUDA_SM90[0]
    a, b = json.loads(cpu.read_text()), json.loads(gpu.read_text())
    tmp.mkdir(parents=True, exist_ok=True)
    if a["provenance"]["git_commit"] != b["provenance"]["git_commit"]:
        b["provenance"]["git_commit"] = a["provenance"]["git_commit"]
        b["provenance"]["git_dirty"] = a["provenance"]["git_dirty"]
        gpu = tmp / gpu.name
        gpu.write_text(json.dumps(b), encoding="utf-8")
    out = tmp / "merged.json"
    assert main(["merge", str(cpu), str(gpu), "--out", str(out)]) == 0
    return out
