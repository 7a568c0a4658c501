#!/usr/bin/env python3
"""Copy the repository's data files into the packages that ship them.

Source of truth: `contracts/*.json` and `manifests/*.yaml` at the repository root. Each installable package ships
a byte-identical copy as package data, so `pip install packages/<dist>` works without the checkout:

    contracts/*.json  -> packages/ws1-contract/src/ws1_contract/data/
    manifests/operators.yaml -> packages/ws1-contract/src/ws1_contract/data/   (the operator spec)
    manifests/*.yaml  -> packages/ws1-workload/src/ws1_workload/data/   (the workloads, not the spec)
    manifests/*.yaml  -> packages/ws1-harness/src/ws1_harness/data/   (the gate reads it without torch)

`python ci/sync_package_data.py` writes changed copies and removes orphan copies (a copy whose source is gone);
`--check` writes nothing and exits 1 when anything is out of sync. `tests/test_package_data_in_sync.py` uses
`plan()` from here, so the mapping lives in one place.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (source directory, glob, destination directory), all relative to the repository root.
MAPPINGS: tuple[tuple[str, str, str], ...] = (
    ("contracts", "*.json", "packages/ws1-contract/src/ws1_contract/data"),
    ("manifests", "operators.yaml", "packages/ws1-contract/src/ws1_contract/data"),
    ("manifests", "*.yaml", "packages/ws1-workload/src/ws1_workload/data"),
    ("manifests", "*.yaml", "packages/ws1-harness/src/ws1_harness/data"),
)
# files a glob matches that are shipped by another package only (the operator spec lives in ws1_contract)
EXCLUDED: frozenset[str] = frozenset({"operators.yaml"})


def _matches(directory: Path, pattern: str) -> list[Path]:
    """The files of `directory` matching `pattern`; a wildcard pattern leaves out the EXCLUDED names."""
    found = sorted(p for p in directory.glob(pattern) if p.is_file())
    return found if "*" not in pattern else [p for p in found if p.name not in EXCLUDED]


@dataclass(frozen=True)
class Pair:
    """One source file and the package-data copy that must equal it byte for byte."""

    source: Path
    copy: Path


def pairs(root: Path = ROOT) -> list[Pair]:
    """Every (source, copy) pair the repository requires."""
    out: list[Pair] = []
    for src_dir, pattern, dst_dir in MAPPINGS:
        for source in _matches(root / src_dir, pattern):
            out.append(Pair(source, root / dst_dir / source.name))
    return out


def orphans(root: Path = ROOT) -> list[Path]:
    """Copies in a package data directory whose source file no longer exists."""
    out: list[Path] = []
    for src_dir, pattern, dst_dir in MAPPINGS:
        for copy in _matches(root / dst_dir, pattern):
            if not (root / src_dir / copy.name).is_file():
                out.append(copy)
    return out


def plan(root: Path = ROOT) -> tuple[list[Pair], list[Pair], list[Path]]:
    """Return (missing copies, differing copies, orphan copies)."""
    missing = [p for p in pairs(root) if not p.copy.is_file()]
    stale = [p for p in pairs(root) if p.copy.is_file() and p.copy.read_bytes() != p.source.read_bytes()]
    return missing, stale, orphans(root)


def rel(path: Path) -> Path:
    """A path relative to the repository root, for messages."""
    return path.relative_to(ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when out of sync")
    args = parser.parse_args(argv)
    missing, stale, orphan = plan()
    if args.check:
        for pair in missing:
            print(f"missing copy: {rel(pair.copy)} (source {rel(pair.source)})")
        for pair in stale:
            print(f"copy differs: {rel(pair.copy)} (source {rel(pair.source)})")
        for path in orphan:
            print(f"orphan copy: {rel(path)} (no source)")
        return 1 if (missing or stale or orphan) else 0
    for pair in missing + stale:
        pair.copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pair.source, pair.copy)
        print(f"copied {rel(pair.source)} -> {rel(pair.copy)}")
    for path in orphan:
        path.unlink()
        print(f"removed orphan {rel(path)}")
    if not (missing or stale or orphan):
        print("package data in sync")
    return 0


if __name__ == "__main__":
    sys.exit(main())
