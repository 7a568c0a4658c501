"""The merged verdict over the CPU, sm86 and sm90 shards: pick every shard under the given folders, merge, gate.

    python ci/merged_gate.py EVIDENCE_DIR [EVIDENCE_DIR ...] [--expect PROFILE@ARCH[:TIER+TIER] ...] [--no-venv]
        [--dry-run]

A shard is picked when it is a finalised evidence file (matrix or chain) of a gated profile at full widths: the
stock baseline (`native_torch`, recorded, expected red) and the reduced-width shards (tiers `short@tiny`...) stay
out, and so do partial files, reports, and a session's merge of its own shards (the shards beside it are picked:
a merge of merges is refused). The picked files go to `nox -s gate` (merge, report, `gate --full`),
with every `--expect`: the run's plan, so that a shard that never arrived is red rather than silently absent.
The GPU workflows call this in their final job on the downloaded artifacts; it runs the same by hand.
Exit: nox's (0 pass, non-zero otherwise); 2 with one line when nothing can be picked.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

BASELINES = frozenset({"native_torch"})


def shard_of(path: Path) -> bool:
    """Whether `path` is a finalised full-width evidence shard of a gated profile."""
    if path.suffix != ".json" or path.name.endswith(".partial.json"):
        return False
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(doc, dict) or doc.get("finalised") is not True or "axes" not in doc:
        return False
    if doc.get("shards"):  # a session's own merge of its shards: the shards themselves are picked
        return False
    profiles = [p.split("@", 1)[0] for p in doc["axes"].get("profiles", [])]
    profiles += [c.get("profile", "").split("@", 1)[0] for c in doc.get("chain_cells", [])]
    if not profiles or any(p in BASELINES for p in profiles):
        return False
    return not any("@" in t for t in doc["axes"].get("tiers", []))


def pick(folders: list[Path]) -> list[Path]:
    return sorted({p for f in folders for p in f.rglob("*.json") if shard_of(p)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--expect", action="append", default=[], metavar="PROFILE@ARCH[:TIER+TIER]")
    ap.add_argument("--dry-run", action="store_true", help="print the nox command instead of running it")
    ap.add_argument(
        "--no-venv", action="store_true", help="nox --no-venv: the machine's own packages (offline)"
    )
    args = ap.parse_args(argv)
    missing = [str(f) for f in args.folders if not f.is_dir()]
    if missing:
        print(f"merged_gate: not a folder: {missing[0]}", file=sys.stderr)
        return 2
    shards = pick(args.folders)
    if not shards:
        print(
            f"merged_gate: no finalised full-width shard under {', '.join(map(str, args.folders))}",
            file=sys.stderr,
        )
        return 2
    cmd = [
        sys.executable,
        "-m",
        "nox",
        *(["--no-venv"] if args.no_venv else []),
        "-s",
        "gate",
        "--",
        *map(str, shards),
    ]
    cmd += [a for e in args.expect for a in ("--expect", e)]
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    return subprocess.run(cmd, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
