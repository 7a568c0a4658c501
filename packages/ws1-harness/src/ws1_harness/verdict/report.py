"""Human views of an evidence file: a Markdown table and a heatmap picture, written beside the JSON (and, for a
merged file of two or more arches, one heatmap panel per arch side by side).

Rows are (profile, operator), columns (tier, judgment); each cell shows a status glyph and the reason code.
Cells the expected set demands but the file lacks are shown as missing, so an incomplete matrix is visible at
a glance. The report starts with the gate verdict and the provenance, so a picture is never read without the
verdict and the commit it belongs to; an `error` cell shows the candidate's own message and where it was raised,
and a merged file names its shards. The heatmap does not rely on hue alone (red and green once differed only
by hue): a colour-blind-safe palette (Okabe and Ito), a glyph in every cell, outlined and hatched missing cells,
and the count of each status in the legend. The views are for people; the gate reads only the JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ws1_harness.verdict.cells import CellKey, cell_key_of, split_arch
from ws1_harness.verdict.evidence import (
    ARCH_HEATMAP_SUFFIX,
    HEATMAP_SUFFIX,
    PARTIAL_SUFFIX,
    REPORT_SUFFIX,
    EvidenceError,
    check_outside_checkout,
    read_evidence,
)
from ws1_harness.verdict.gate import GateResult, gate, parse_expect, planned_out

GLYPH = {
    "green": "✅",
    "red": "❌",
    "error": "💥",
    "na": "➖",
    "pending_arch": "⏳",
    "missing": "⬜",
}
# Okabe-Ito colours, told apart by the common colour-vision deficiencies; the glyph carries the status as well.
COLOUR = {
    "green": "#009E73",  # bluish green
    "red": "#D55E00",  # vermillion
    "error": "#000000",  # black
    "na": "#DDDDDD",  # light grey
    "pending_arch": "#56B4E9",  # sky blue
    "missing": "#FFFFFF",  # white, hatched and outlined
}
# One glyph per status in the picture (characters the default DejaVu Sans font has; the Markdown uses GLYPH).
PLOT_GLYPH = {"green": "✓", "red": "✗", "error": "!", "na": "–", "pending_arch": "…", "missing": "?"}
_DARK = frozenset({"red", "error"})  # statuses whose colour needs a white glyph
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


def _txt(value: Any, none: str = "none") -> str:
    """A value for people: never Python's `None`."""
    return none if value is None else str(value)


def commit_label(prov: Mapping[str, Any]) -> str:
    """`commit 3f2c1a9b0d4e (dirty)`, or a plain statement that no commit was recorded and why."""
    commit = prov["git_commit"]
    if commit == "unknown":
        return "commit unknown (the code did not run from a git checkout; see docs/evidence.md, Provenance)"
    return f"commit {commit[:12]}" + (" (dirty)" if prov["git_dirty"] else "")


def _shards_section(doc: Mapping[str, Any]) -> list[str]:
    """A merged file names the shards it was made of."""
    if not doc["shards"]:
        return []
    out = [
        "## Shards",
        "",
        "| # | file | shard | commit | device | cells | command |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, entry in enumerate(doc["shards"]):
        prov = entry["provenance"]
        device = (
            prov["device"] if prov["device"] == "cpu" else f"{prov['device_name']} {_txt(prov['capability'])}"
        )
        out.append(
            f"| {i} | {entry['file']} | {_txt(entry['shard'], 'whole run')} | {commit_label(prov)} | {device} | "
            f"{entry['counts']['total']} | `{entry['command']}` |"
        )
    out.append("")
    return out


def error_details(doc: Mapping[str, Any]) -> list[dict[str, str]]:
    """Every unit with `error` cells, once, with the candidate's message (`why`) and location (`at`)."""
    out: dict[tuple[str, str, str], dict[str, str]] = {}
    for c in doc["cells"]:
        if c["status"] != "error":
            continue
        diag = c.get("diagnostics") or {}
        key = (c["profile"], c["operator"], c["tier"])
        out.setdefault(
            key,
            {
                "profile": c["profile"],
                "operator": c["operator"],
                "tier": c["tier"],
                "why": _txt(diag.get("why"), c["reason_code"] or "error"),
                "at": _txt(diag.get("at"), "-"),
            },
        )
    return list(out.values())


def _errors_section(doc: Mapping[str, Any]) -> list[str]:
    rows = error_details(doc)
    if not rows:
        return []
    out = ["## Errors", "", "| profile | operator | tier | message | raised at |", "|---|---|---|---|---|"]
    for r in rows:
        why = r["why"].replace("|", "\\|")
        out.append(f"| {r['profile']} | {r['operator']} | {r['tier']} | {why} | `{r['at']}` |")
    out.append("")
    return out


def render_markdown(
    doc: Mapping[str, Any],
    source: str = "evidence",
    expect_profiles: Sequence[str] = (),
    verdict: GateResult | None = None,
) -> str:
    """The Markdown report: verdict (under the run's plan, `expect_profiles`; `verdict` when the caller has it
    already), provenance, counts, legend, and the profile×operator table."""
    if verdict is None:
        verdict = gate(doc, source=source, expect_profiles=expect_profiles)
    prov = doc["provenance"]
    # a merged file's provenance is the merge's own (the machine that ran `ws1 merge`): said so, since each shard's
    # device and versions are in the shard list, and a reader took the merging host's CPU for where cells ran
    where = "merged on: " if doc["shards"] else ""
    rows, cols, cells = _grid(doc)
    out = [f"# ws1 evidence report: {source}", ""]
    out += ["```", *verdict.lines[:4], "```", ""]
    out += [
        f"- {commit_label(prov)}, from {prov['git_source']}"
        + ("" if prov["git_commit"] == "unknown" else f": `{prov['git_commit']}`"),
        f"- {where}device {prov['device']} `{prov['device_name']}` capability {_txt(prov['capability'], '-')} "
        f"driver {_txt(prov['driver'])}"
        + (" (each shard's own device: the shard list below)" if where else ""),
        f"- {where}torch {prov['torch']}, triton {prov['triton']}, CUDA {_txt(prov['cuda'], 'none (CPU build)')}, "
        f"python {prov['python']}",
        f"- workload `{doc['workload']['id']}` {doc['workload']['fingerprint']}",
        f"- contract {doc['contract']['fingerprint']}",
        f"- command `{doc['command']}`" + (f" shard {doc['shard']}" if doc["shard"] else ""),
        f"- merged from {len(doc['shards'])} shards (listed below)" if doc["shards"] else "- single run",
        "",
        "Legend: " + ", ".join(f"{GLYPH[s]} {s}" for s in ORDER),
        "",
    ]
    if verdict.problems:
        out += ["## Problems", "", "```", *verdict.lines[4 : 4 + _MAX_PROBLEMS], "```", ""]
        if len(verdict.lines) > 4 + _MAX_PROBLEMS:
            out += [f"({len(verdict.lines) - 4 - _MAX_PROBLEMS} more: run `ws1 gate` for the full list)", ""]
    out += _errors_section(doc)
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
    out += _arch_section(doc)
    out += _chain_section(doc)
    out += _margin_section(doc)
    out += _mismatch_section(doc)
    out += _time_section(doc)
    out += _shards_section(doc)
    return "\n".join(out)


CHAIN_SHORT = {
    "parity": "parity",
    "logprob_accuracy": "logp acc",
    "gradient_invariance": "grad inv",
    "gradient_accuracy": "grad acc",
    "op_watch": "op watch",
}


def _chain_glyph(ok: bool | None, judged: bool = True) -> str:
    if ok is None:
        return "·"
    return ("✅" if ok else "❌") + ("" if judged else " (recorded)")


def _chain_section(doc: Mapping[str, Any]) -> list[str]:
    """Per chain cell: the verdict, a table of training layouts × judgments (the judgments that compare
    layouts; the others in the `packed` row), the aggregates, and the first divergence."""
    from ws1_harness.verdict.chain_rejudge import divergence_text
    from ws1_harness.verdict.evidence import chain_label

    chain = doc.get("chain_cells") or []
    if not chain:
        return []
    out = ["## Chain", ""]
    for cell in chain:
        js = {j["name"]: j for j in cell["judgments"]}
        out.append(
            f"### {chain_label(cell)}: {GLYPH.get(cell['status'], cell['status'])} {cell['status']}"
            + (f" (failed: {', '.join(cell['failed'])})" if cell["failed"] else "")
        )
        out.append("")
        parity = js.get("parity", {}).get("detail", {}).get("layouts", {})
        inv = js.get("gradient_invariance", {}).get("detail", {}).get("layouts", {})
        names = list(parity) or ["packed"]
        header = ["layout", *(CHAIN_SHORT.get(n, n) for n in js)]
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        for i, layout in enumerate(names):
            row = [layout]
            for name, j in js.items():
                if name == "parity":
                    row.append(_chain_glyph(parity.get(layout, {}).get("passed")))
                elif name == "gradient_invariance":
                    flags = inv.get(layout, {}).get("bits_equal")
                    row.append(
                        "packed is the reference" if flags is None else _chain_glyph(all(flags.values()))
                    )
                else:
                    row.append(_chain_glyph(j["passed"], j["judged"]) if i == 0 else "")
            out.append("| " + " | ".join(row) + " |")
        out.append("")
        for name in ("parity", "logprob_accuracy"):
            det = js.get(name, {}).get("detail", {})
            rows = det.get("layouts", {"packed": det}) if name == "parity" else {"packed": det}
            for layout, r in rows.items():
                figures = ", ".join(
                    f"{a} {r[a]:.3g}" for a in ("max_abs_dlogp", "approx_kl0", "clipfrac0") if a in r
                )
                out.append(
                    f"- {name} {layout}: {r.get('tokens')} tokens, {figures or r.get('why', 'no aggregate')}"
                )
        where = divergence_text(cell)
        out += [f"- {where}" if where else "- no divergence", ""]
    return out


def accuracy_margins(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """How close each accuracy comparison came to its threshold, worst first: the largest
    `|c - r| / (atol + rtol * |r|)` over its elements (1.0 is the threshold) where the comparison recorded it
    (`max_rule_ratio`), else `max_abs / atol`, which ignores the rtol part. A green cell once showed no margin
    at all. Diagnostics only: the verdict is the rule's."""
    out: list[dict[str, Any]] = []
    for cell in doc["cells"]:
        if not str(cell["judgment"]).endswith("accuracy"):
            continue
        for tensor, comp in (cell.get("diagnostics") or {}).items():
            diag = comp.get("diagnostics") if isinstance(comp, Mapping) else None
            if not isinstance(diag, Mapping):
                continue
            max_abs, atol = diag.get("max_abs"), diag.get("atol")
            if not isinstance(max_abs, (int, float)) or not isinstance(atol, (int, float)) or atol <= 0:
                continue
            rule = diag.get("max_rule_ratio")
            ratio = float(rule) if isinstance(rule, (int, float)) else float(max_abs) / float(atol)
            out.append(
                {
                    "profile": cell["profile"],
                    "operator": cell["operator"],
                    "tier": cell["tier"],
                    "judgment": cell["judgment"],
                    "status": cell["status"],
                    "tensor": tensor,
                    "max_abs": float(max_abs),
                    "atol": float(atol),
                    "ratio": ratio,
                    "of_rule": isinstance(rule, (int, float)),
                }
            )
    return sorted(out, key=lambda r: -r["ratio"])


def _margin_section(doc: Mapping[str, Any], limit: int = 40) -> list[str]:
    rows = accuracy_margins(doc)
    if not rows:
        return []
    out = [
        "## Accuracy margins",
        "",
        "How close each accuracy comparison came to the contract's rule, worst first: the largest "
        "`|candidate - reference| / (atol + rtol * |reference|)` over its elements (1.00 is the threshold; an "
        "older file without that figure shows `max abs / atol`, marked *).",
        "",
        "| profile | operator | tier | judgment | tensor | status | max abs | atol | margin used |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows[:limit]:
        star = "" if r["of_rule"] else " *"
        out.append(
            f"| {r['profile']} | {r['operator']} | {r['tier']} | {r['judgment']} | {r['tensor']} | "
            f"{GLYPH.get(r['status'], r['status'])} | {r['max_abs']:.3g} | {r['atol']:.3g} | {r['ratio']:.2f}{star} |"
        )
    if len(rows) > limit:
        out.append(f"| ... {len(rows) - limit} more | | | | | | | | |")
    out.append("")
    return out


def mismatches(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every failed per-layout comparison behind a red invariance cell, with its first mismatching logical key.

    For the stock baseline this is the list of batch-variant stock ops the run found, and where.
    """
    out: list[dict[str, Any]] = []
    for cell in doc["cells"]:
        for lr in cell.get("layouts", ()):
            if lr["passed"]:
                continue
            for name, comp in lr.get("diagnostics", {}).items():
                if not isinstance(comp, Mapping) or comp.get("passed", True):
                    continue
                # comparisons are named `<layout>` (the forward output) or `<layout>.<tensor>` (a gradient);
                # the table once showed the layout name in its tensor column
                tensor = name.split(".", 1)[1] if "." in name else "output"
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
            f"{r['tensor']} | {_txt(r['n_mismatch'], '-')}/{_txt(r['n_total'], '-')} | {_txt(r['first_key'], '-')} |"
        )
    if len(rows) > 200:
        out.append(f"| ... {len(rows) - 200} more | | | | | | | |")
    out.append("")
    return out


def arch_disagreements(doc: Mapping[str, Any]) -> tuple[dict[str, list[str]], list[dict[str, Any]]]:
    """Where one profile's shards on different arches (`cuda_bf16@sm90`, `cuda_bf16@sm86-proxy`) give a cell
    different statuses: ({profile: [its arches]} for profiles seen on two or more, [one entry per such cell])."""
    arches: dict[str, list[str]] = {}
    for label in doc["axes"]["profiles"]:
        base, panel = panel_of(label)  # an arch-less shard is the `cpu` panel here as in the heatmap
        arches.setdefault(base, []).append(panel)
    multi = {base: sorted(a) for base, a in arches.items() if len(a) > 1}
    by_cell: dict[tuple[str, str, str, str], dict[str, str]] = {}
    for cell in doc["cells"]:
        base, panel = panel_of(cell["profile"])
        if base in multi:
            key = (base, cell["operator"], cell["tier"], cell["judgment"])
            by_cell.setdefault(key, {})[panel] = cell["status"]
    out = [
        {
            "profile": k[0],
            "operator": k[1],
            "tier": k[2],
            "judgment": k[3],
            "statuses": dict(sorted(v.items())),
        }
        for k, v in sorted(by_cell.items())
        if len(set(v.values())) > 1 or len(v) < len(multi[k[0]])
    ]
    return multi, out


def _arch_section(doc: Mapping[str, Any]) -> list[str]:
    multi, cells = arch_disagreements(doc)
    if not multi:
        return []
    out = ["## Where the arches disagree", ""]
    for base, archs in multi.items():
        n = sum(c["profile"] == base for c in cells)
        out.append(
            f"- `{base}` on {', '.join(archs)}: " + ("every cell agrees" if not n else f"{n} cells differ")
        )
    if cells:
        out += ["", "| profile | operator | tier | judgment | status per arch |", "|---|---|---|---|---|"]
        for c in cells[:_MAX_PROBLEMS]:
            per = ", ".join(f"{a}: {s}" for a, s in c["statuses"].items())
            out.append(f"| {c['profile']} | {c['operator']} | {c['tier']} | {c['judgment']} | {per} |")
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


def status_counts(doc: Mapping[str, Any]) -> dict[str, int]:
    """How many cells of the grid have each status, `missing` included (the heatmap legend shows them)."""
    rows, cols, cells = _grid(doc)
    counts = dict.fromkeys(ORDER, 0)
    for p, o in rows:
        for t, j in cols:
            counts[_status_at(cells, CellKey(p, o, t, j))[0]] += 1
    return counts


_BLANK = "blank"  # a place of the picture that holds no cell: a matrix column of a chain row, and the reverse


def _heatmap_grid(
    doc: Mapping[str, Any],
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[list[str]]]:
    """Rows, columns and statuses of the picture: the matrix cells, then one row per chain run
    (`<profile> / chain <model> L<layers>`) with one column per chain tier. A chain-only file once drew an
    empty frame, and chain cells never appeared in a heatmap."""
    rows, cols, cells = _grid(doc)
    statuses = [[_status_at(cells, CellKey(p, o, t, j))[0] for t, j in cols] for p, o in rows]
    chain = doc.get("chain_cells") or []
    if not chain:
        return rows, cols, statuses
    runs = sorted({(c["profile"], f"chain {c['model']} L{c['layers']}") for c in chain})
    tiers = list(dict.fromkeys(c["tier"] for c in chain))
    found = {
        ((c["profile"], f"chain {c['model']} L{c['layers']}"), c["tier"]): c["status"]
        if c["status"] in ORDER
        else "error"
        for c in chain
    }
    statuses = [row + [_BLANK] * len(tiers) for row in statuses]
    statuses += [[_BLANK] * len(cols) + [found.get((run, t), "missing") for t in tiers] for run in runs]
    return rows + runs, cols + [(t, "chain") for t in tiers], statuses


def _draw_grid(
    axis: Any,
    rows: list[tuple[str, str]],
    cols: list[tuple[str, str]],
    statuses: list[list[str]],
    *,
    row_labels: bool = True,
) -> None:
    """One grid into `axis`: a colour and a glyph per cell, missing cells hatched, `_BLANK` places left empty."""
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Rectangle

    shades = (*ORDER, _BLANK)
    index = {s: i for i, s in enumerate(shades)}
    data = [[index[st] for st in row] for row in statuses] or [[index["missing"]]]
    cmap = ListedColormap([COLOUR.get(s, "#FFFFFF") for s in shades])
    norm = BoundaryNorm([i - 0.5 for i in range(len(shades) + 1)], len(shades))
    axis.imshow(data, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    for y, row in enumerate(statuses):
        for x, st in enumerate(row):
            if st == _BLANK:
                continue
            axis.text(
                x,
                y,
                PLOT_GLYPH[st],
                ha="center",
                va="center",
                fontsize=7,
                color="white" if st in _DARK else "black",
            )
            if st == "missing":  # a gap must be seen, not read as a pale colour
                axis.add_patch(
                    Rectangle(
                        (x - 0.5, y - 0.5), 1, 1, fill=False, hatch="///", edgecolor="#555555", linewidth=0.8
                    )
                )
    axis.set_xticks(range(len(cols)))
    axis.set_xticklabels([f"{t}\n{JUDGMENT_SHORT.get(j, j)}" for t, j in cols], fontsize=7, rotation=90)
    axis.set_yticks(range(len(rows)))
    axis.set_yticklabels([f"{p} / {o}" for p, o in rows], fontsize=7)
    if not row_labels:  # a panel beside another with the same rows: the labels once, on the leftmost
        axis.tick_params(axis="y", which="major", labelleft=False)
    axis.set_xticks([x - 0.5 for x in range(1, len(cols))], minor=True)
    axis.set_yticks([y - 0.5 for y in range(1, len(rows))], minor=True)
    axis.grid(which="minor", color="#888888", linewidth=0.6)
    axis.tick_params(which="minor", length=0)


def _status_patches(suffix: Mapping[str, str]) -> list[Any]:
    """One legend patch per status, colour, hatch and glyph as drawn; `suffix[status]` follows its name."""
    from matplotlib.patches import Patch

    return [
        Patch(
            facecolor=COLOUR[s],
            edgecolor="black",
            hatch="///" if s == "missing" else None,
            label=f"{PLOT_GLYPH[s]} {s}{suffix.get(s, '')}",
        )
        for s in ORDER
    ]


def heatmap_figure(doc: Mapping[str, Any], title: str = "ws1 matrix") -> Any:
    """The heatmap as a matplotlib Figure (Agg canvas, no global pyplot state): colour, glyph, legend counts."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows, cols, statuses = _heatmap_grid(doc)
    width = max(6.0, 0.55 * len(cols) + 3.5)
    height = max(3.0, 0.32 * len(rows) + 2.0)
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    axis = fig.add_subplot(1, 1, 1)
    _draw_grid(axis, rows, cols, statuses)
    axis.set_title(title, fontsize=9)
    counts = status_counts(doc)
    fig.legend(
        handles=_status_patches({s: f" ({counts[s]})" for s in ORDER}),
        loc="lower center",
        ncol=len(ORDER),
        fontsize=7,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


#: the panel of the profiles without an arch label (a CPU shard's `portable_cpu`): the merged run's CPU part
CPU_PANEL = "cpu"


def panel_of(label: str) -> tuple[str, str]:
    """(profile without its arch, panel): `cuda_bf16@sm90` -> (`cuda_bf16`, `sm90`); `portable_cpu` ->
    (`portable_cpu`, `cpu`)."""
    base, arch = split_arch(label)
    return base, (arch if arch is not None else CPU_PANEL)


def evidence_arches(doc: Mapping[str, Any]) -> list[str]:
    """The panels of the file: the arches its profiles are labelled with (`sm86-proxy`, `sm90`), sorted, then
    `cpu` when a profile carries none (a CPU shard)."""
    arches = {panel_of(p)[1] for p in doc["axes"]["profiles"]}
    return sorted(arches - {CPU_PANEL}) + ([CPU_PANEL] if CPU_PANEL in arches else [])


def arch_heatmap_grids(
    doc: Mapping[str, Any], plans: Mapping[str, Sequence[str]] | None = None
) -> tuple[list[str], list[tuple[str, str]], list[tuple[str, str]], dict[str, list[list[str]]]]:
    """The per-arch panels' data: (arches, rows, columns, {arch: statuses}).

    Every panel has the same rows and columns, in the order of the file's axes: rows are (profile without its
    arch, operator) for every profile that ran on some arch, columns (tier, judgment). A place holds the cell's
    status on that arch (`missing` when the arch ran the profile but the cell is absent) and `_BLANK` when the
    arch did not run the profile at all, so a profile run on one arch only is not counted missing on another.
    Profiles without an arch (a CPU shard) make the `cpu` panel. `plans` (profile label -> tiers, the run's
    `--expect PROFILE:TIER+TIER`): an absent cell of a tier its profile's plan leaves out is blank, not missing.
    Matrix cells only: chain cells are in the single heatmap.
    """
    plans = plans or {}
    arches = evidence_arches(doc)
    label_of = {panel_of(p): p for p in doc["axes"]["profiles"]}
    bases = list(dict.fromkeys(panel_of(p)[0] for p in doc["axes"]["profiles"]))
    _, cols, cells = _grid(doc)
    rows = [(b, o) for b in bases for o in doc["axes"]["operators"]]
    grids: dict[str, list[list[str]]] = {}
    for arch in arches:
        grids[arch] = [
            [
                _planned_status(cells, CellKey(label_of[(b, arch)], o, t, j), plans)
                if (b, arch) in label_of
                else _BLANK
                for t, j in cols
            ]
            for b, o in rows
        ]
    return arches, rows, cols, grids


def _planned_status(cells: Mapping[CellKey, Any], key: CellKey, plans: Mapping[str, Sequence[str]]) -> str:
    """The cell's status, or blank for an absent cell of a tier the profile's plan leaves out (`planned_out`)."""
    return _BLANK if planned_out(key, plans, cells) else _status_at(cells, key)[0]


def grid_counts(statuses: list[list[str]]) -> dict[str, int]:
    """How many places of a grid hold each status (`_BLANK` places are no cell and count for nothing)."""
    counts = dict.fromkeys(ORDER, 0)
    for row in statuses:
        for st in row:
            if st != _BLANK:
                counts[st] += 1
    return counts


def arch_panel_title(arch: str, statuses: list[list[str]]) -> str:
    """`sm90: 132 cells` then the count of each status (green and red always, the others when present)."""
    counts = grid_counts(statuses)
    shown = [f"{PLOT_GLYPH[s]} {counts[s]} {s}" for s in ORDER if s in ("green", "red") or counts[s]]
    return f"{arch}: {sum(counts.values())} cells\n" + ", ".join(shown)


def arch_heatmap_figure(
    doc: Mapping[str, Any], title: str = "ws1 matrix", plans: Mapping[str, Sequence[str]] | None = None
) -> Any:
    """One heatmap panel per arch, side by side, with the same rows and columns in every panel (the row
    labels on the leftmost), each titled with its arch and its counts. For a file with two or more arches."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    arches, rows, cols, grids = arch_heatmap_grids(doc, plans)
    if len(arches) < 2:
        raise ValueError(f"a per-arch heatmap needs two or more arches, the file has {arches or 'none'}")
    panel = max(3.0, 0.55 * len(cols) + 0.8)
    width = 3.5 + panel * len(arches)
    height = max(3.0, 0.32 * len(rows) + 2.4)
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    for i, arch in enumerate(arches):
        axis = fig.add_subplot(1, len(arches), i + 1)
        _draw_grid(axis, rows, cols, grids[arch], row_labels=i == 0)
        axis.set_title(arch_panel_title(arch, grids[arch]), fontsize=8)
    fig.suptitle(f"{title}: per arch", fontsize=9)
    fig.legend(
        handles=[
            *_status_patches({}),
            Patch(
                facecolor="#FFFFFF", edgecolor="#BBBBBB", label="blank: not run on this arch, or planned out"
            ),
        ],
        loc="lower center",
        ncol=len(ORDER) + 1,
        fontsize=7,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def _save_png(fig: Any, png_path: Path) -> Path:
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=120)
    return png_path


def render_arch_heatmap(
    doc: Mapping[str, Any],
    png_path: Path,
    title: str = "ws1 matrix",
    plans: Mapping[str, Sequence[str]] | None = None,
) -> Path:
    """Write the per-arch heatmap PNG (two or more arches)."""
    return _save_png(arch_heatmap_figure(doc, title, plans), png_path)


def render_heatmap(doc: Mapping[str, Any], png_path: Path, title: str = "ws1 matrix") -> Path:
    """Write the heatmap PNG."""
    return _save_png(heatmap_figure(doc, title), png_path)


def heatmap_title(doc: Mapping[str, Any], name: str, verdict: str) -> str:
    """`<file>: <VERDICT>, commit <sha> [(dirty)]`; a merged file says how many shards it holds."""
    merged = f", merged from {len(doc['shards'])} shards" if doc["shards"] else ""
    commit = doc["provenance"] if not doc["shards"] else doc["shards"][0]["provenance"]
    label = commit_label(commit)
    if commit["git_commit"] == "unknown":
        label = "commit unknown (not run from a git checkout)"
    return f"{name}: {verdict}, {label}{merged}"


def report_stem(path: Path) -> str:
    """`name` for `name.json`, `name.partial` for `name.partial.jsonl`: the report of an interrupted run's
    partial file never overwrites the report of the complete file beside it."""
    name = path.name
    if name.endswith(PARTIAL_SUFFIX):
        return name[: -len(PARTIAL_SUFFIX)] + ".partial"
    if name.endswith(".json"):
        return name[: -len(".json")]
    return name


def write_report(
    path: str | Path,
    out_dir: str | Path | None = None,
    *,
    allow_in_checkout: bool = False,
    expect_profiles: Sequence[str] = (),
) -> tuple[Path, Path]:
    """Write `<stem>.report.md` and `<stem>.heatmap.png` beside the evidence (or into `out_dir`), and, when the
    file's profiles ran on two or more arches, `<stem>.arch-heatmap.png` (one panel per arch; an older one is
    removed when the file has fewer arches, so it never describes other cells: `arch_heatmap_path`).
    `expect_profiles`: the run's plan, as `ws1 gate --expect` takes it, so the report's verdict is the gate's.

    Like every evidence output, a report inside the git checkout (and not ignored by git) is refused unless
    `allow_in_checkout`: it would leave untracked files there. Works on partial files too (a torn last line is
    skipped), so a crashed run can still be looked at.
    """
    p = Path(path)
    doc = read_evidence(p, tolerate_torn_tail=True)
    directory = Path(out_dir) if out_dir is not None else p.parent
    stem = report_stem(p)
    md = directory / (stem + REPORT_SUFFIX)
    png = directory / (stem + HEATMAP_SUFFIX)
    if not allow_in_checkout:
        check_outside_checkout(md)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EvidenceError(
            f"report: cannot create {directory} ({exc.strerror or type(exc).__name__})"
        ) from None
    result = gate(doc, source=p.name, expect_profiles=expect_profiles)  # once: the Markdown and the pictures
    md.write_text(render_markdown(doc, p.name, verdict=result), encoding="utf-8")
    # the picture carries the gate line's qualifier: a reduced PASS once read as a plain "PASS" in the PNG
    verdict = result.verdict + (f" (reduced: {', '.join(result.reduced)})" if result.reduced else "")
    verdict += f" (planned: {'; '.join(result.planned)})" if result.planned else ""
    title = heatmap_title(doc, p.name, verdict)
    render_heatmap(doc, png, title=title)
    per_arch = arch_heatmap_path(png)
    if len(evidence_arches(doc)) >= 2:
        render_arch_heatmap(doc, per_arch, title=title, plans=parse_expect(expect_profiles)[0])
    else:
        per_arch.unlink(missing_ok=True)
    return md, png


def arch_heatmap_path(png: Path) -> Path:
    """`<stem>.arch-heatmap.png` beside `<stem>.heatmap.png`: what `write_report` writes for two or more arches."""
    name = png.name[: -len(HEATMAP_SUFFIX)] if png.name.endswith(HEATMAP_SUFFIX) else png.stem
    return png.with_name(name + ARCH_HEATMAP_SUFFIX)
