"""Bench records: rows, the JSON document, its checks, and the Markdown view.

A bench file is JSON with `kind: "bench"` and `schema_version`, so `ws1 report` can tell it from evidence. Every
derived figure (ratio, rates, target verdict) is computed here from the measured times, in one place, so the
JSON and the Markdown can never disagree. Statuses: `ok` (both sides timed), `error` (a side raised: its
message is kept, the other side is still timed), `unavailable` (the registry has no candidate that runs on this
device; one row per operator), `skipped` (a phase the candidate does not have, e.g. no backward).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ws1_harness.errors import HarnessError
from ws1_harness.run.bench.targets import Target, judge

KIND = "bench"
SCHEMA_VERSION = 1
STATUSES = ("ok", "error", "unavailable", "skipped")
_REQUIRED = (
    "kind",
    "schema_version",
    "created",
    "command",
    "profile",
    "model",
    "device",
    "timer",
    "method",
    "provenance",
    "ceilings",
    "targets",
    "rows",
    "counts",
)
_ROW_REQUIRED = ("op", "shape", "m", "phase", "status", "candidate_ms", "peer_ms", "ratio", "target_met")


class BenchInputError(HarnessError):
    """Bad arguments or an unreadable bench file: one line, exit 2."""


@dataclass
class SecondPeer:
    """A second peer timed for a row, beside the one its verdict is judged against (the fp32-accumulating
    backward of a ``sample_blocks_main_grad`` row): a reference figure, never a verdict."""

    peer: str
    ms: float | None = None
    error: str | None = None

    def to_json(self, candidate_ms: float | None) -> dict[str, Any]:
        ratio = self.ms / candidate_ms if self.ms and candidate_ms and candidate_ms > 0 else None
        return {"peer": self.peer, "ms": self.ms, "ratio": ratio, "error": self.error}


@dataclass
class Row:
    """One (op, shape, M, phase) measurement; times in ms, `work` in FLOPs or bytes."""

    op: str
    shape: str
    m: int | None
    phase: str
    status: str
    dims: Mapping[str, Any] = field(default_factory=dict)
    candidate_id: str | None = None
    param_grad_rule: str | None = None
    peer: str | None = None
    metric: str | None = None
    work: float | None = None
    candidate_ms: float | None = None
    peer_ms: float | None = None
    reason: str | None = None
    errors: dict[str, str] = field(default_factory=dict)
    kernels_observed: list[str] = field(default_factory=list)
    peak_mem_bytes: dict[str, int | None] | None = None
    fp32_logits_bytes: int | None = None
    target: Target | None = None
    # train_step / decode_step rows only (bench/steps.py): layers, lengths or cache, the peer's kernels, the
    # path checks; None on operator rows
    step: dict[str, Any] | None = None
    # forward rows at M = 1 (bench/host.py): each side's host figures; None elsewhere
    host: dict[str, Any] | None = None
    # what the candidate side called: "candidate" (the profile's candidate through its layout context) or
    # "step" (the profile's step-path op, what a rollout runs: `OpCase.step`)
    path: str = "candidate"
    # bwd rows of a sample_blocks_main_grad candidate's GEMM: the peer that accumulates into an fp32 main_grad
    peer_main_grad: SecondPeer | None = None
    # the least bytes each side's call must move (bench/roofline.py): "candidate" under the candidate's weight-
    # gradient rule, "peer" under the peer's, "peer_main_grad" under the candidate's; None: no roofline
    traffic_bytes: dict[str, float] | None = None

    @property
    def ratio(self) -> float | None:
        """peer time / candidate time: > 1 means the candidate is faster than stock."""
        if self.candidate_ms and self.peer_ms and self.candidate_ms > 0:
            return self.peer_ms / self.candidate_ms
        return None

    def rate(self, ms: float | None) -> float | None:
        """TFLOP/s (work in FLOPs) or GB/s (work in bytes) of one side."""
        if not ms or not self.work or ms <= 0:
            return None
        return self.work / ms / (1e9 if self.metric == "TFLOP/s" else 1e6)

    def to_json(self, copy_gbs: float | None) -> dict[str, Any]:
        cand_rate = self.rate(self.candidate_ms)
        # only an ok row is judged: an error row may hold two times that do not measure the candidate (a step
        # row whose candidate path ran stock kernels)
        met = (
            judge(self.target, self.ratio, self.candidate_ms, cand_rate, copy_gbs)
            if self.status == "ok"
            else None
        )
        return {
            "op": self.op,
            "shape": self.shape,
            "m": self.m,
            "phase": self.phase,
            "status": self.status,
            "dims": dict(self.dims),
            "candidate_id": self.candidate_id,
            "path": self.path,
            "param_grad_rule": self.param_grad_rule,
            "peer": self.peer,
            "candidate_ms": self.candidate_ms,
            "peer_ms": self.peer_ms,
            "ratio": self.ratio,
            "metric": self.metric,
            "work": self.work,
            "candidate_rate": cand_rate,
            "peer_rate": self.rate(self.peer_ms),
            "target": self.target.to_json() if self.target else None,
            "target_met": met,
            "reason": self.reason,
            "errors": dict(self.errors),
            "kernels_observed": list(self.kernels_observed),
            "peak_mem_bytes": self.peak_mem_bytes,
            "fp32_logits_bytes": self.fp32_logits_bytes,
            "step": self.step,
            "host": self._host_json(),
            "peer_main_grad": (
                self.peer_main_grad.to_json(self.candidate_ms) if self.peer_main_grad is not None else None
            ),
            "traffic_bytes": dict(self.traffic_bytes) if self.traffic_bytes is not None else None,
        }

    def _host_json(self) -> dict[str, Any] | None:
        if self.host is None:
            return None
        from ws1_harness.run.bench import host as H

        cand = self.host["candidate"]
        return {
            "candidate": cand.to_json(),
            "peer": self.host["peer"].to_json(),
            "target_us": H.HOST_TARGET_US,
            "met": H.judge(cand),
        }


def counts(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    out = {s: sum(1 for r in rows if r["status"] == s) for s in STATUSES}
    out["total"] = len(rows)
    out["target_met"] = sum(1 for r in rows if r["target_met"] is True)
    out["target_missed"] = sum(1 for r in rows if r["target_met"] is False)
    return out


# ---------------------------------------------------------------------------------------------- files


def validate(doc: Any, source: str) -> dict[str, Any]:
    """Structural checks of a bench document; BenchInputError (one line) on anything wrong."""
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise BenchInputError(f"{source}: not a bench file (kind != 'bench')")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise BenchInputError(
            f"{source}: bench schema_version {doc.get('schema_version')!r}, expected {SCHEMA_VERSION}"
        )
    missing = [k for k in _REQUIRED if k not in doc]
    if missing:
        raise BenchInputError(f"{source}: bench file lacks {', '.join(missing)}")
    if not isinstance(doc["rows"], list):
        raise BenchInputError(f"{source}: rows is not a list")
    for i, row in enumerate(doc["rows"]):
        if not isinstance(row, dict) or any(k not in row for k in _ROW_REQUIRED):
            raise BenchInputError(f"{source}: row {i} lacks one of {', '.join(_ROW_REQUIRED)}")
        if row["status"] not in STATUSES:
            raise BenchInputError(f"{source}: row {i} has unknown status {row['status']!r}")
    if doc["counts"] != counts(doc["rows"]):
        raise BenchInputError(f"{source}: counts disagree with the rows")
    return doc


def is_bench_file(path: str | Path) -> bool:
    """True when `path` holds a JSON object with `kind: "bench"` (evidence files and partial logs are not)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("kind") == KIND


def read_bench(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BenchInputError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BenchInputError(f"{p}: unreadable bench file ({type(exc).__name__})") from None
    return validate(doc, str(p))


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_bench_report(
    path: str | Path, out_dir: str | Path | None = None, *, allow_in_checkout: bool = False
) -> Path:
    """`ws1 report` on a bench file: `<stem>.report.md` beside it (or in `out_dir`); inside the git checkout
    only with `allow_in_checkout`, like every other ws1 output (it once wrote there unasked)."""
    from ws1_harness.verdict.evidence import check_outside_checkout

    p = Path(path)
    doc = read_bench(p)
    directory = Path(out_dir) if out_dir is not None else p.parent
    stem = p.name[: -len(".json")] if p.name.endswith(".json") else p.name
    md = directory / f"{stem}.report.md"
    if not allow_in_checkout:
        check_outside_checkout(md)
    write_atomic(md, render_markdown(doc, p.name))
    return md


# ---------------------------------------------------------------------------------------------- Markdown


def _f(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if x != 0 and abs(x) < 10**-digits:
        return f"{x:.2e}"
    return f"{x:.{digits}f}"


def _gib(x: int | None) -> str:
    return "-" if x is None else f"{x / 2**30:.3f} GiB"


_MET = {True: "met", False: "**missed**", None: ""}


def render_markdown(doc: Mapping[str, Any], source: str = "bench") -> str:
    """The human view: provenance, ceilings, method, the table, peak memory of linear_logp, problems."""
    prov, ceil, c = doc["provenance"], doc["ceilings"], doc["counts"]
    dev = doc["device"]
    copy, mm = ceil.get("copy", {}), ceil.get("mm", {})
    out = [
        f"# ws1 bench: {source}",
        "",
        f"- profile `{doc['profile']}` at `{doc['model']}` widths on {dev['type']} `{dev['name']}` "
        f"(capability {dev['capability']}, driver {dev['driver']})",
        f"- commit `{prov['git_commit']}` (dirty: {str(prov['git_dirty']).lower()}, from {prov['git_source']})",
        f"- torch {prov['torch']}, triton {prov['triton']}, CUDA {prov['cuda']}, python {prov['python']}",
        f"- command `{doc['command']}`",
        f"- timer `{doc['timer']['name']}` (warmup {doc['timer']['warmup_ms']} ms, rep {doc['timer']['rep_ms']} ms, "
        f"median); L2: {doc['timer']['l2']}",
        f"- ceilings: copy {_f(copy.get('GB_s'), 1)} GB/s (read + written, {_gib(copy.get('bytes'))} buffer)"
        + (f" [error: {copy['error']}]" if copy.get("error") else "")
        + f"; bf16 mm {mm.get('n')}^3 {_f(mm.get('TFLOP_s'), 1)} TFLOP/s"
        + (f" [error: {mm['error']}]" if mm.get("error") else ""),
        f"- rows: {c['total']} ({c['ok']} ok, {c['error']} error, {c['unavailable']} unavailable, "
        f"{c['skipped']} skipped); targets: {c['target_met']} met, {c['target_missed']} missed",
        "",
        "ratio = peer ms / candidate ms: above 1 the candidate is faster than stock. Rates are the same work "
        "(FLOPs or bytes read + written) divided by each side's time.",
        "",
        f"- fwd: {doc['method']['fwd']}",
        f"- bwd: {doc['method']['bwd']}",
        "",
        "## Rows",
        "",
        "| op | shape | M | phase | cand ms | peer ms | ratio | cand rate | peer rate | unit | target | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        if r["status"] in ("unavailable", "skipped"):
            verdict = r["status"]
        elif r["status"] == "error":
            verdict = "💥 error"
        else:
            verdict = _MET[r["target_met"]]
        target = r["target"]["text"] if r["target"] else ""
        if r["target"] and r["target"]["kind"] == "reference_ratio_max":
            ref = r.get("reference")
            if ref is None or not ref.get("candidate_ms") or not r["candidate_ms"]:
                target += ": not judged, the run measured no such row"
            else:
                target += (
                    f": {r['candidate_ms'] / ref['candidate_ms']:.2f}x of {_f(ref['candidate_ms'], 4)} ms"
                )
        out.append(
            f"| {r['op']} | {r['shape']} | {r['m'] if r['m'] is not None else '-'} | {r['phase']} | "
            f"{_f(r['candidate_ms'], 4)} | {_f(r['peer_ms'], 4)} | {_f(r['ratio'], 2)} | "
            f"{_f(r.get('candidate_rate'), 1)} | {_f(r.get('peer_rate'), 1)} | {r.get('metric') or ''} | "
            f"{target} | {verdict} |"
        )
    mem_rows = [r for r in doc["rows"] if r.get("fp32_logits_bytes") is not None and r.get("peak_mem_bytes")]
    if mem_rows:
        out += _table_head(
            "linear_logp peak memory (torch.cuda.max_memory_allocated delta of one call)",
            None,
            ["M", "phase", "candidate", "peer", "fp32 logits [M, V]"],
        )
        for r in mem_rows:
            pm = r["peak_mem_bytes"]
            out.append(
                f"| {r['m']} | {r['phase']} | {_gib(pm.get('candidate'))} | {_gib(pm.get('peer'))} | "
                f"{_gib(r['fp32_logits_bytes'])} |"
            )
    out += _main_grad_section(doc["rows"])
    out += _roofline_section(doc["rows"])
    out += _step_section(doc["rows"])
    out += _host_section(doc["rows"])
    problems = [r for r in doc["rows"] if r["status"] != "ok"]
    if problems:
        out += ["", "## Not measured", ""]
        for r in problems:
            why = r.get("reason") or "; ".join(f"{k}: {v}" for k, v in (r.get("errors") or {}).items())
            where = f"{r['op']} {r['shape']}" + (f" M={r['m']} {r['phase']}" if r["m"] is not None else "")
            out.append(f"- {r['status']}: {where}: {why}")
    out.append("")
    return "\n".join(out)


def _table_head(title: str, note: str | None, columns: Sequence[str]) -> list[str]:
    """A section's heading, its note (if any) and its table's header rows: the shape every table below shares."""
    return [
        "",
        f"## {title}",
        "",
        *([note, ""] if note else []),
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]


def _main_grad_section(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Backward rows with a second, fp32-accumulating peer: both ratios side by side (rows without: none)."""
    rows2 = [r for r in rows if r.get("peer_main_grad")]
    if not rows2:
        return []
    out = _table_head(
        "Backward against a peer that accumulates into fp32 main_grad",
        f"Second peer: {rows2[0]['peer_main_grad']['peer']}. It does the candidate's weight-gradient rule, so "
        "its ratio separates the kernel's shortfall from the rule's bytes; the verdict above stays against the "
        "first peer (a fresh bf16 weight.grad).",
        ["op", "shape", "M", "cand ms", "peer ms", "ratio", "main_grad peer ms", "ratio", "note"],
    )
    for r in rows2:
        pm = r["peer_main_grad"]
        out.append(
            f"| {r['op']} | {r['shape']} | {r['m'] if r['m'] is not None else '-'} | {_f(r['candidate_ms'], 4)} | "
            f"{_f(r['peer_ms'], 4)} | {_f(r['ratio'], 2)} | {_f(pm.get('ms'), 4)} | {_f(pm.get('ratio'), 2)} | "
            f"{('error: ' + pm['error']) if pm.get('error') else ''} |"
        )
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _roofline_section(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Rows with a roofline (bench/roofline.py): each side's floor and the share of it that side reaches."""
    lines = [r for r in rows if r.get("roofline")]
    if not lines:
        return []
    out = _table_head(
        "Roofline (the least time at this run's ceilings)",
        "floor = max(FLOPs / mm ceiling, least bytes / copy ceiling), each side under its own weight-gradient rule "
        "(an fp32 main_grad read and written, or a fresh bf16 weight.grad); % = floor / the side's time; bound = "
        "what sets the candidate's floor.",
        [
            "op",
            "shape",
            "M",
            "phase",
            "bound",
            "cand floor ms",
            "cand",
            "peer floor ms",
            "peer",
            "main_grad peer",
        ],
    )
    for r in lines:
        rl = r["roofline"]
        fl, of = rl["floor_ms"], rl["of_floor"]
        out.append(
            f"| {r['op']} | {r['shape']} | {r['m'] if r['m'] is not None else '-'} | {r['phase']} | "
            f"{rl['bound'] or '-'} | {_f(fl.get('candidate'), 4)} | {_pct(of.get('candidate'))} | "
            f"{_f(fl.get('peer'), 4)} | {_pct(of.get('peer'))} | {_pct(of.get('peer_main_grad'))} |"
        )
    return out


def _step_section(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """train_step / decode_step rows: peak memory per side and what ran on each (rows without `step`: none)."""
    steps = [r for r in rows if r.get("step")]
    if not steps:
        return []
    out = _table_head(
        "Whole-model steps (the profile's drop-in against the stock model, one process)",
        "Peak = `torch.cuda.max_memory_allocated()` over one step after a reset (absolute: weights, the side's "
        "gradient buffers, the KV cache included).",
        ["op", "M", "layers", "cand ms", "peer ms", "ratio", "cand peak", "peer peak", "candidate kernels",
         "peer kernels", "path"],
    )  # fmt: skip
    for r in steps:
        st, pm = r["step"], r.get("peak_mem_bytes") or {}
        problems = [*st["path_problems"]["candidate"], *st["path_problems"]["peer"]]
        out.append(
            f"| {r['op']} | {r['m']} | {st['layers']} | {_f(r['candidate_ms'], 3)} | {_f(r['peer_ms'], 3)} | "
            f"{_f(r['ratio'], 3)} | {_gib(pm.get('candidate'))} | {_gib(pm.get('peer'))} | "
            f"{len(r['kernels_observed'])} | {len(st['peer_kernels_observed'])} | "
            f"{'; '.join(problems) if problems else 'own kernels only'} |"
        )
    out += ["", f"Weights: {steps[0]['step']['weights']}."]
    return out


def _host_section(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Forward rows at M = 1 with host figures: issue / eager / graph-replay microseconds per call, each side."""
    hosts = [r for r in rows if r.get("host")]
    if not hosts:
        return []
    out = _table_head(
        f"Host cost per call (M = 1, forward; target: issue <= {hosts[0]['host']['target_us']:g} us)",
        "issue = wall time to issue one call before any sync (the host's own cost); eager = up to a sync; graph = "
        "the same calls replayed from one CUDA graph (the device's time). A side that cannot be captured shows why.",
        ["op", "shape", "cand issue us", "cand eager us", "cand graph us", "peer issue us", "peer eager us",
         "peer graph us", "verdict"],
    )  # fmt: skip

    def cells(h: Mapping[str, Any]) -> list[str]:
        if h.get("error"):
            return ["error: " + h["error"], "", ""]
        graph = _f(h.get("graph_us"), 1) if h.get("graph_us") is not None else f"({h.get('graph_error')})"
        return [_f(h.get("issue_us"), 1), _f(h.get("eager_us"), 1), graph]

    for r in hosts:
        h = r["host"]
        out.append(
            f"| {r['op']} | {r['shape']} | "
            + " | ".join(cells(h["candidate"]) + cells(h["peer"]))
            + f" | {_MET[h['met']]} |"
        )
    return out
