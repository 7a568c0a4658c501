"""`ws1 matrix`: run the matrix (profile x operator x tier x judgment) for one profile into evidence.

Inputs are validated up front (unknown profile, operator or tier: exit 2, one line) so no work is wasted on a
typo, and never ends in a traceback. Units run one by one in a worker process with a time limit each, so a
hung kernel cannot block the sweep; every cell is
written to the evidence as soon as it is known, then the file is finalised and a summary table is printed
last, ending with the verdict and the next command. Exit status: 0 when every cell of this run is green or an
expected `na` and (for a run that is not a shard) `ws1 gate` on the file would pass; 1 otherwise (`--op pack`
alone once exited 0 while the gate said RED); 130 when interrupted, naming the partial file it kept.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ws1_contract import load_contract
from ws1_harness.console import EXIT_INTERRUPTED, emit
from ws1_harness.errors import HarnessError
from ws1_harness.run.inventory_checks import inventory
from ws1_harness.run.tasks import FULL_MODEL, UnitTask, execute_task, load_plugin
from ws1_harness.run.unit import JUDGMENTS
from ws1_harness.run.worker import WorkerPool
from ws1_harness.verdict.cells import Cell, CellKey, LayoutResult, expected_cells
from ws1_harness.verdict.evidence import Axes, EvidenceHeader, EvidenceWriter, WorkloadRef
from ws1_harness.verdict.gate import EXIT_PASS, EXIT_PENDING, gate
from ws1_harness.verdict.provenance import portable_path, unknown_commit_hint
from ws1_kernels import registry
from ws1_workload import Manifest, load_manifest

DEFAULT_CELL_TIMEOUT_S = 900.0
CPU_DEFAULT_TIERS = ("short", "primary")


class MatrixInputError(HarnessError, ValueError):
    """Bad matrix arguments: reported as one line, exit 2."""


@dataclass(frozen=True)
class Plan:
    manifest: Manifest
    profile: str
    operators: tuple[str, ...]
    tiers: tuple[str, ...]
    tasks: tuple[UnitTask, ...]
    shard: tuple[int, int] | None
    device: str
    arch_label: str | None

    @property
    def profile_label(self) -> str:
        return self.profile if self.arch_label is None else f"{self.profile}@{self.arch_label}"


def _fail(msg: str) -> MatrixInputError:
    return MatrixInputError(f"ws1 matrix: {msg}")


def plan(args: argparse.Namespace) -> Plan:
    """Validate the arguments against the manifest and registry; derive the units of this (shard of the) run."""
    manifest = load_manifest(None)
    if args.candidates:
        try:
            load_plugin(args.candidates)
        except SystemExit as exc:  # a plug-in that exits on import once made the run exit 3 ("pending only")
            raise _fail(
                f"--candidates {args.candidates}: the module called sys.exit({exc.code!r}) on import"
            ) from None
        except Exception as exc:
            text = str(exc).splitlines()
            raise _fail(
                f"--candidates {args.candidates}: {text[0] if text else type(exc).__name__}"
            ) from None
    known_profiles = set(registry.profiles()) | set(manifest.profiles)
    if args.profile not in known_profiles:
        raise _fail(f"unknown profile {args.profile!r} (known: {', '.join(sorted(known_profiles))})")
    operators = tuple(args.op or manifest.operators)
    unknown_ops = [op for op in operators if op not in manifest.operators]
    if unknown_ops:
        raise _fail(f"unknown operator {unknown_ops[0]!r} (known: {', '.join(manifest.operators)})")
    tiers = tuple(args.tier or CPU_DEFAULT_TIERS)
    unknown_tiers = [t for t in tiers if t not in manifest.tiers]
    if unknown_tiers:
        raise _fail(f"unknown tier {unknown_tiers[0]!r} (known: {', '.join(manifest.tiers)})")
    try:
        manifest.model(args.model)
    except Exception:
        raise _fail(f"unknown model {args.model!r}") from None
    for dup_axis, values in (("--op", operators), ("--tier", tiers)):
        if len(set(values)) != len(values):
            raise _fail(f"{dup_axis} given twice for the same value")
    if all(manifest.operators[op].layout_only for op in operators):
        raise _fail(
            f"--op {' --op '.join(operators)}: layout-only operators have no candidate and no green cell, so "
            "the gate could never pass this run; add an operator with a candidate"
        )
    device = getattr(args, "device", None) or "auto"
    arch_label = run_arch_label(args.profile, operators, device)
    tasks = [
        UnitTask(
            args.profile,
            op,
            tier,
            model=args.model,
            candidates=args.candidates,
            device=device,
            arch_label=arch_label,
        )
        for op in operators
        for tier in tiers
    ]
    if args.shard is not None:
        index, count = args.shard
        if not tasks[index::count]:  # an empty shard once exited 0 with a file of no cells
            raise _fail(
                f"--shard {index}/{count}: holds no unit (the run has {len(tasks)}); use n <= {len(tasks)}"
            )
        tasks = tasks[index::count]
    return Plan(manifest, args.profile, operators, tiers, tuple(tasks), args.shard, device, arch_label)


ARCH_LABEL_RE = re.compile(r"^sm[0-9]{2,3}(-proxy)?$")


def run_arch_label(profile: str, operators: tuple[str, ...], device: str) -> str | None:
    """The arch label of a run's profile: `sm90` when its units execute on an sm_90 device, None on the host.

    `WS1_ARCH_LABEL` overrides the label (the sm86 session on an sm_90 card says `sm86-proxy`); the gate checks
    every label against the capability the cells record.
    """
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise _fail("--device cuda: no CUDA device is visible")
    if device not in ("auto", "cpu", "cuda"):
        raise _fail(f"--device must be auto, cpu or cuda, got {device!r}")
    if device == "cpu" or not torch.cuda.is_available():
        return None  # nothing runs on a GPU: cells of CUDA-only candidates are pending_arch
    if device == "auto" and not any(
        registry.preferred_device(profile, op) == "cuda" for op in operators if op != "pack"
    ):
        return None
    override = os.environ.get("WS1_ARCH_LABEL")
    if override:
        if not ARCH_LABEL_RE.match(override):
            raise _fail(f"WS1_ARCH_LABEL must look like sm90 or sm86-proxy, got {override!r}")
        return override
    major, minor = torch.cuda.get_device_capability()
    return f"sm{major}{minor}"


def _cell(record: dict[str, Any], required: bool) -> Cell:
    layouts = tuple(LayoutResult.from_json(lr) for lr in record.get("layouts", []))
    return Cell(
        key=CellKey(record["profile"], record["operator"], record["tier"], record["judgment"]),
        status=record["status"],
        reason_code=record["reason_code"],
        required=required,
        diagnostics=record["diagnostics"],
        observed_kernels=tuple(record["observed_kernels"]),
        observed_ops=tuple(record["observed_ops"]),
        wall_s=record["wall_s"],
        layouts=layouts,
        device=record.get("device"),
    )


def _progress(done: int, total: int, task: UnitTask, records: list[dict[str, Any]], wall: float) -> None:
    width = 24
    filled = int(width * done / max(total, 1))
    short = {
        "forward_accuracy": "fa",
        "forward_invariance": "fi",
        "gradient_accuracy": "ga",
        "gradient_invariance": "gi",
    }
    states = " ".join(f"{short.get(r['judgment'], r['judgment'])}={r['status']}" for r in records)
    bar = "#" * filled + "." * (width - filled)
    print(
        f"[{bar}] {done}/{total} {task.operator}/{task.tier_label} {wall:6.1f}s  {states}",
        file=sys.stderr,
        flush=True,
    )


def _error_lines(cells: list[dict[str, Any]]) -> list[str]:
    """One line per unit whose cells are `error`: the candidate's own message and where it was raised.

    An error cell once showed only `error:exception`; the message is in the cell's diagnostics (`why`, `at`).
    """
    out: list[str] = []
    seen: set[tuple[str, str, str]] = set()
    for c in cells:
        if c["status"] != "error":
            continue
        diag = c.get("diagnostics") or {}
        text = f"{diag.get('why') or c['reason_code']}" + (f" (at {diag['at']})" if diag.get("at") else "")
        unit = (c["operator"], c["tier"], text)
        if unit in seen:
            continue  # the four judgments of a unit share one error
        seen.add(unit)
        out.append(f"  {c['operator']}/{c['tier']}: {text}")
    return out


def _summary(cells: list[dict[str, Any]]) -> str:
    """A table, one row per (operator, tier), one column per judgment, printed last."""
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for c in cells:
        status = c["status"] if c["status"] == "green" else f"{c['status']}:{c['reason_code']}"
        rows.setdefault((c["operator"], c["tier"]), {})[c["judgment"]] = status
    head = f"{'operator':<12} {'tier':<16} " + " ".join(f"{j:<28}" for j in JUDGMENTS)
    lines = [head, "-" * len(head)]
    for (op, tier), by_j in rows.items():
        lines.append(f"{op:<12} {tier:<16} " + " ".join(f"{by_j.get(j, '-'):<28}" for j in JUDGMENTS))
    counts = Counter(c["status"] for c in cells)
    lines.append(
        "cells: "
        + " ".join(f"{k}={counts.get(k, 0)}" for k in ("green", "red", "na", "pending_arch", "error"))
    )
    errors = _error_lines(cells)
    if errors:
        lines += ["errors:", *errors]
    return "\n".join(lines)


def _next_steps(final: Path, shard: tuple[int, int] | None, verdict: str) -> list[str]:
    """The closing lines: the verdict word and the command to run next."""
    q = shlex.quote(str(final))
    if shard is not None:
        stem = final.name.split(".shard-", 1)[0]
        shards = shlex.quote(str(final.parent)) + f"/{stem}.shard-*-of-{shard[1]}.json"
        return [
            f"verdict: shard {shard[0]}/{shard[1]} done; a shard alone lacks the other shards' cells",
            f"next: ws1 merge {shards} --out ALL.json; ws1 gate ALL.json; ws1 report ALL.json",
        ]
    return [f"verdict: {verdict} (as ws1 gate {q} says)", f"next: ws1 gate {q}; ws1 report {q}"]


def evidence_path(out: Path, profile: str, shard: tuple[int, int] | None) -> Path:
    """`<profile>[.<arch>][.shard-i-of-n].json`: file names stay within letters, digits, '.', '_' and '-'."""
    profile = profile.replace("@", ".")
    name = profile if shard is None else f"{profile}.shard-{shard[0]}-of-{shard[1]}"
    return out / f"{name}.json"


def run_matrix(args: argparse.Namespace) -> int:
    """The `ws1 matrix` command."""
    p = plan(args)
    manifest = p.manifest
    contract = load_contract(None)
    tier_labels = tuple(t if args.model == FULL_MODEL else f"{t}@{args.model}" for t in p.tiers)
    axes = Axes.build([p.profile_label], p.operators, tier_labels, JUDGMENTS, manifest.operators)
    header = EvidenceHeader(
        workload=WorkloadRef(manifest.workload_id, manifest.fingerprint, manifest.revision),
        contract_fingerprint=contract.fingerprint,
        command="ws1 " + " ".join(shlex.quote(portable_path(a)) for a in sys.argv[1:]),
        axes=axes,
        shard=None if p.shard is None else f"{p.shard[0]}/{p.shard[1]}",
    )
    expected = expected_cells([p.profile_label], p.operators, tier_labels, JUDGMENTS, manifest.operators)
    out = Path(args.out)
    path = evidence_path(out, p.profile_label, p.shard)
    limit = args.cell_timeout or DEFAULT_CELL_TIMEOUT_S
    writer = EvidenceWriter(
        path,
        header,
        allow_in_checkout=bool(getattr(args, "allow_in_checkout", False)),
        force=bool(getattr(args, "force", False)),
    )
    pool = None if args.in_process else WorkerPool()
    written: list[dict[str, Any]] = []
    started = time.perf_counter()
    print(
        f"ws1 matrix: {p.profile_label} ({p.device}): {len(p.tasks)} units x {len(JUDGMENTS)} judgments -> {path}",
        file=sys.stderr,
    )
    hint = unknown_commit_hint()
    if hint is not None:
        print(f"ws1 matrix: warning: {hint}", file=sys.stderr)
    try:
        for n, task in enumerate(p.tasks, start=1):
            t0 = time.perf_counter()
            records = execute_task(task) if pool is None else pool.run(task, limit)
            for record in records:
                key = CellKey(record["profile"], record["operator"], record["tier"], record["judgment"])
                cell = _cell(record, expected[key].required)
                writer.write_cell(cell)
                written.append(cell.to_json())
            _progress(n, len(p.tasks), task, records, time.perf_counter() - t0)
        # A model entry without an explicit `bias: false` fails the bias policy item (missing is not "no").
        biases = [bool(m.get("bias", True)) for m in manifest.document["models"].values()]
        items = inventory(written, p.profile_label, biases)
        writer.set_inventory([{"profile": p.profile_label, **item.to_json()} for item in items])
        final = writer.finalise()
    except KeyboardInterrupt:
        writer.close()
        print(
            f"ws1 matrix: interrupted after {len({(c['operator'], c['tier']) for c in written})} of "
            f"{len(p.tasks)} units; the cells written so far are "
            f"kept in {writer.partial_path} (ws1 report {shlex.quote(str(writer.partial_path))} shows them)",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    finally:
        writer.close()
        if pool is not None:
            pool.close()
    # The same judgment `ws1 gate FILE` makes (a shard alone always lacks cells, so only whole runs use it).
    result = gate(final)
    emit(_summary(written))
    inv_open = [f"{i.item}={i.verdict}" for i in items if i.verdict != "pass" and i.source == "direct"]
    if inv_open:
        emit("inventory open: " + ", ".join(inv_open))
    emit(f"ws1 matrix: {final} ({time.perf_counter() - started:.1f}s)")
    emit("\n".join(_next_steps(final, p.shard, result.verdict)))
    bad = [c for c in written if c["status"] not in ("green", "na")]
    gate_open = p.shard is None and result.exit_code not in (EXIT_PASS, EXIT_PENDING)
    return 1 if bad or inv_open or gate_open else 0
