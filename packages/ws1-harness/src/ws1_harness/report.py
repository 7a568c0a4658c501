"""Human views of an evidence file: a Markdown table and a heatmap picture, written beside the JSON.

Rows are (profile, operator), columns (tier, judgment); each cell shows a status glyph and the reason code.
Cells the expected set demands but the file lacks are shown as missing, so an incomplete matrix is visible at
a glance. The report starts with the gate verdict and the provenance, so a picture is never read without the
verdict and the commit it belongs to. The views are for people; the gate reads only the JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ws1_harness.cells import CellKey, cell_key_of
from ws1_harness.evidence import PARTIAL_SUFFIX, read_evidence
from ws1_harness.gate import gate

GLYPH = {
    "green": "✅",
    "red": "❌",
    "error": "💥",
    "na": "➖",
    "pending_arch": "⏳",
    "missing": "⬜",
}
COLOUR = {
    "green": "#2e7d32",
    "red": "#c62828",
    "error": "#6a1b9a",
    "na": "#bdbdbd",
    "pending_arch": "#f9a825",
    "missing": "#ffffff",
}
ORDER = ("green", "red", "error", "na", "pending_arch", "missing")
_MAX_PROBLEMS = 60
JUDGMENT_SHORT = {
    "forward_accuracy": "fwd acc",
    "forward_invariance": "fwd inv",
    "gradient_accuracy": "grad acc",
    "gradient_invariance": "grad inv",
}


def _grid(
    doc: Mapping[str, Any],
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], dict[CellKey, Mapping[str, Any]]]:
    ax = doc["axes"]
    rows = [(p, o) for p in ax["profiles"] for o in ax["operators"]]
    cols = [(t, j) for t in ax["tiers"] for j in ax["judgments"]]
    cells = {cell_key_of(c): c for c in doc["cells"]}
    return rows, cols, cells


def _status_at(cells: Mapping[CellKey, Mapping[str, Any]], key: CellKey) -> tuple[str, str | None]:
    raw = cells.get(key)
    if raw is None:
        return "missing", None
    return raw["status"], raw["reason_code"]


def render_markdown(doc: Mapping[str, Any], source: str = "evidence") -> str:
    """The Markdown report: verdict, provenance, counts, legend, and the profile×operator table."""
    verdict = gate(doc, source=source)
    prov = doc["provenance"]
    rows, cols, cells = _grid(doc)
    out = [f"# ws1 evidence report: {source}", ""]
    out += ["```", *verdict.lines[:4], "```", ""]
    out += [
        f"- commit `{prov['git_commit']}` (dirty: {str(prov['git_dirty']).lower()}, from {prov['git_source']})",
        f"- device {prov['device']} `{prov['device_name']}` capability {prov['capability']} driver {prov['driver']}",
        f"- torch {prov['torch']}, triton {prov['triton']}, CUDA {prov['cuda']}, python {prov['python']}",
        f"- workload `{doc['workload']['id']}` {doc['workload']['fingerprint']}",
        f"- contract {doc['contract']['fingerprint']}",
        f"- command `{doc['command']}`" + (f" shard {doc['shard']}" if doc["shard"] else ""),
        f"- shards merged: {len(doc['shards'])}" if doc["shards"] else "- single run",
        "",
        "Legend: " + ", ".join(f"{GLYPH[s]} {s}" for s in ORDER),
        "",
    ]
    if verdict.problems:
        out += ["## Problems", "", "```", *verdict.lines[4 : 4 + _MAX_PROBLEMS], "```", ""]
        if len(verdict.lines) > 4 + _MAX_PROBLEMS:
            out += [f"({len(verdict.lines) - 4 - _MAX_PROBLEMS} more: run `ws1 gate` for the full list)", ""]
    out += ["## Matrix", ""]
    header = ["profile", "operator"] + [f"{t} {JUDGMENT_SHORT.get(j, j)}" for t, j in cols]
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "---|" * len(header))
    for profile, op in rows:
        entries = []
        for tier, judgment in cols:
            status, reason = _status_at(cells, CellKey(profile, op, tier, judgment))
            entries.append(GLYPH[status] + (f" {reason}" if reason else ""))
        out.append(f"| {profile} | {op} | " + " | ".join(entries) + " |")
    out.append("")
    out += _mismatch_section(doc)
    out += _time_section(doc)
    return "\n".join(out)


def mismatches(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every failed per-layout comparison behind a red invariance cell, with its first mismatching logical key.

    For the stock baseline this is the list of batch-variant stock ops the run found, and where.
    """
    out: list[dict[str, Any]] = []
    for cell in doc["cells"]:
        for lr in cell.get("layouts", ()):
            if lr["passed"]:
                continue
            for tensor, comp in lr.get("diagnostics", {}).items():
                if not isinstance(comp, Mapping) or comp.get("passed", True):
                    continue
                diag = comp.get("diagnostics", {})
                out.append(
                    {
                        "profile": cell["profile"],
                        "operator": cell["operator"],
                        "tier": cell["tier"],
                        "judgment": cell["judgment"],
                        "layout": lr["layout"],
                        "tensor": tensor,
                        "reason": comp.get("reason_code"),
                        "n_mismatch": diag.get("n_mismatch"),
                        "n_total": diag.get("n_total"),
                        "first_key": diag.get("first_mismatch_key")
                        or (
                            f"element {diag['first_mismatch_index']}"
                            if diag.get("first_mismatch_index") is not None
                            else None
                        ),
                    }
                )
    return out


def _mismatch_section(doc: Mapping[str, Any]) -> list[str]:
    rows = mismatches(doc)
    if not rows:
        return []
    out = [
        "## Where the bits differ",
        "",
        "Each failed invariance comparison: the layout, the tensor, how many elements differ and the first "
        "mismatching logical key `(sample_id, position)`.",
        "",
        "| profile | operator | tier | judgment | layout | tensor | mismatched | first key |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows[:200]:
        out.append(
            f"| {r['profile']} | {r['operator']} | {r['tier']} | {r['judgment']} | {r['layout']} | "
            f"{r['tensor']} | {r['n_mismatch']}/{r['n_total']} | {r['first_key']} |"
        )
    if len(rows) > 200:
        out.append(f"| ... {len(rows) - 200} more | | | | | | | |")
    out.append("")
    return out


def _time_section(doc: Mapping[str, Any]) -> list[str]:
    """Wall time per profile: each unit's time once (its four cells carry the same unit time)."""
    units: dict[tuple[str, str, str], float] = {}
    devices: dict[str, set[str]] = {}
    for c in doc["cells"]:
        units[(c["profile"], c["operator"], c["tier"])] = float(c.get("wall_s", 0.0))
        dev = c.get("device")
        if dev:
            where = (
                dev["type"]
                if dev["type"] == "cpu"
                else f"{dev['name']} {dev.get('capability') or ''}".strip()
            )
            devices.setdefault(c["profile"], set()).add(where)
    totals: dict[str, float] = {}
    for (profile, _op, _tier), wall in units.items():
        totals[profile] = totals.get(profile, 0.0) + wall
    out = [
        "## Time and device",
        "",
        "| profile | units | sum of unit wall times (s) | cells ran on |",
        "|---|---|---|---|",
    ]
    for profile, total in totals.items():
        n = sum(1 for k in units if k[0] == profile)
        out.append(
            f"| {profile} | {n} | {total:.1f} | {', '.join(sorted(devices.get(profile, ()))) or '-'} |"
        )
    out.append("")
    return out


def render_heatmap(doc: Mapping[str, Any], png_path: Path, title: str = "ws1 matrix") -> Path:
    """A PNG heatmap of the matrix (Agg canvas, no global pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows, cols, cells = _grid(doc)
    index = {s: i for i, s in enumerate(ORDER)}
    data = [[index[_status_at(cells, CellKey(p, o, t, j))[0]] for t, j in cols] for p, o in rows] or [
        [index["missing"]]
    ]
    cmap = ListedColormap([COLOUR[s] for s in ORDER])
    norm = BoundaryNorm([i - 0.5 for i in range(len(ORDER) + 1)], len(ORDER))
    width = max(6.0, 0.55 * len(cols) + 3.5)
    height = max(3.0, 0.32 * len(rows) + 2.0)
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    axis = fig.add_subplot(1, 1, 1)
    axis.imshow(data, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    axis.set_xticks(range(len(cols)))
    axis.set_xticklabels([f"{t}\n{JUDGMENT_SHORT.get(j, j)}" for t, j in cols], fontsize=7, rotation=90)
    axis.set_yticks(range(len(rows)))
    axis.set_yticklabels([f"{p} / {o}" for p, o in rows], fontsize=7)
    axis.set_xticks([x - 0.5 for x in range(1, len(cols))], minor=True)
    axis.set_yticks([y - 0.5 for y in range(1, len(rows))], minor=True)
    axis.grid(which="minor", color="white", linewidth=0.8)
    axis.tick_params(which="minor", length=0)
    axis.set_title(title, fontsize=9)
    fig.legend(
        handles=[Patch(facecolor=COLOUR[s], edgecolor="black", label=s) for s in ORDER],
        loc="lower center",
        ncol=len(ORDER),
        fontsize=7,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=120)
    return png_path


def report_stem(path: Path) -> str:
    name = path.name
    for suffix in (PARTIAL_SUFFIX, ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def write_report(path: str | Path, out_dir: str | Path | None = None) -> tuple[Path, Path]:
    """Write `<stem>.report.md` and `<stem>.heatmap.png` beside the evidence (or into `out_dir`).

    Works on partial files too (a torn last line is skipped), so a crashed run can still be looked at.
    """
    p = Path(path)
    doc = read_evidence(p, tolerate_torn_tail=True)
    directory = Path(out_dir) if out_dir is not None else p.parent
    directory.mkdir(parents=True, exist_ok=True)
    stem = report_stem(p)
    md = directory / f"{stem}.report.md"
    md.write_text(render_markdown(doc, p.name), encoding="utf-8")
    commit = doc["provenance"]["git_commit"][:12]
    verdict = gate(doc, source=p.name).verdict
    png = render_heatmap(doc, directory / f"{stem}.heatmap.png", title=f"{p.name} @ {commit}: {verdict}")
    return md, png
