"""Check the GitHub workflows for what must hold before they run on self-hosted GPU machines.

    python ci/check_workflows.py [.github/workflows]     # one line per problem; exit 1 if any, 0 if none

actionlint (the lint session, always) checks syntax and expressions; this checks the project's own rules, which no
linter knows: a read-only token and no `pull_request_target`; a timeout on every job; every checkout without
persisted credentials; a self-hosted job guarded to same-repository events that asserts its GPU arch
(`ci/assert_gpu_arch.sh`) before any build or run; every `ci/` script a step names exists; the merged-gate job
needs the shard jobs; no comment points at a numbered entry of a document outside the repository.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
BUILD_OR_RUN = re.compile(r"\bnox\b|setup\.py|ws1 (matrix|chain|bench)")
NUMBERED_NOTE = re.compile(r"#.*\b(trap|note|anchor)s?\s*#?\d+", re.IGNORECASE)


def _triggers(doc: dict[Any, Any]) -> dict[str, Any]:
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads the bare key `on` as True
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return dict.fromkeys(on)
    return dict(on or {})


def _steps_text(job: dict[str, Any]) -> list[str]:
    return [str(s.get("run", "")) + " " + str(s.get("uses", "")) for s in job.get("steps", [])]


def problems_of(name: str, text: str, root: Path = ROOT) -> list[str]:
    """The problems of one workflow file's text (`name` prefixes each line)."""
    out: list[str] = []
    for i, line in enumerate(text.splitlines(), 1):
        if NUMBERED_NOTE.search(line):
            out.append(f"{name}:{i}: a comment points at a numbered note: {line.strip()}")
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict):
        return [*out, f"{name}: not a workflow mapping"]
    triggers = _triggers(doc)
    if "pull_request_target" in triggers:
        out.append(f"{name}: pull_request_target runs fork code with secrets: not allowed")
    perms = doc.get("permissions")
    if not (isinstance(perms, dict) and perms and all(v in ("read", "none") for v in perms.values())):
        out.append(f"{name}: top-level permissions must be read-only (e.g. contents: read), got {perms!r}")
    jobs = doc.get("jobs") or {}
    if not jobs:
        out.append(f"{name}: no jobs")
    for jname, job in jobs.items():
        where = f"{name}: job {jname}"
        if "uses" in job:  # a reusable workflow: its own file is checked
            continue
        if "timeout-minutes" not in job:
            out.append(f"{where}: no timeout-minutes")
        for step in job.get("steps", []):
            checkout = str(step.get("uses", "")).startswith("actions/checkout")
            if checkout and (step.get("with") or {}).get("persist-credentials") is not False:
                out.append(f"{where}: checkout must set persist-credentials: false")
            for script in re.findall(r"(?<![.\w/])ci/[A-Za-z0-9_.-]+", str(step.get("run", ""))):
                if not (root / script).is_file():
                    out.append(f"{where}: names {script}, which does not exist")
        runs_on = job.get("runs-on")
        labels = runs_on if isinstance(runs_on, list) else [runs_on]
        if "self-hosted" in labels:
            guard = str(job.get("if", ""))
            if "repository_owner" not in guard:
                out.append(
                    f"{where}: a self-hosted job needs a same-repository guard (if: ...repository_owner...)"
                )
            texts = _steps_text(job)
            assert_at = next((k for k, t in enumerate(texts) if "ci/assert_gpu_arch.sh" in t), None)
            build_at = next((k for k, t in enumerate(texts) if BUILD_OR_RUN.search(t)), None)
            if assert_at is None:
                out.append(f"{where}: no ci/assert_gpu_arch.sh step")
            elif build_at is not None and build_at < assert_at:
                out.append(f"{where}: builds or runs before asserting the GPU arch")
        if "merged_gate" in jname:
            needs = job.get("needs") or []
            needs = [needs] if isinstance(needs, str) else needs
            shard_jobs = [j for j in jobs if j != jname]
            if sorted(needs) != sorted(shard_jobs):
                out.append(f"{where}: must need every shard job {shard_jobs}, needs {needs}")
            if not any("ci/merged_gate.py" in t for t in _steps_text(job)):
                out.append(f"{where}: does not run ci/merged_gate.py")
    return out


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    folder = Path(args[0]) if args else ROOT / ".github" / "workflows"
    files = sorted(folder.glob("*.yml")) + sorted(folder.glob("*.yaml"))
    if not files:
        print(f"check_workflows: no workflow under {folder}", file=sys.stderr)
        return 2
    found = [p for f in files for p in problems_of(f.name, f.read_text())]
    for line in found:
        print(line)
    print(f"check_workflows: {len(files)} workflows, {len(found)} problems", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
