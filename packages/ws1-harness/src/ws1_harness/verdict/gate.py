"""The gate: one verdict and one exit code for an evidence file.

Exit codes: 0 pass, 1 red, 2 bad input, 3 pending only.

What makes it fail closed:
- An empty or truncated file once passed an earlier gate. Unreadable, malformed, truncated or schema-invalid
  input is exit 2; a partial (not finalised) file is red; the exact expected cell set is required (a missing
  required cell and any extra cell are red); at least one executed green required cell is required.
- An earlier gate counted only one failing verdict kind. Here every status other than green is open: red and
  error are red, `na` passes only with the reason the expected cell set demands, `pending_arch` is pending
  (exit 3) unless explicitly allowed.
- Tests once hard-coded cell counts. The expected set is derived from the evidence's own axes and operator
  specs (ws1_harness.verdict.cells), or passed in by the caller; no count is hard-coded.
- Evidence once came from an older commit. `expect_commit` and `require_clean` check the commit and dirty flag
  of the code that produced the cells.
- The gate once trusted what it should check: a red cell edited to green passed while its own per-layout
  results said `passed: false`, and a zeroed contract fingerprint passed. Every cell is re-judged from its own
  checks against the contract the gate is given (ws1_harness.verdict.rejudge), the recorded contract and workload
  fingerprints and operator specs must be the given contract's and manifest's (default: the shipped ones), the
  cells digest is recomputed on every read (ws1_harness.verdict.evidence), and a profile that is not built in must
  record its plug-in's source.
- `--model tiny` and `--op` subsets once passed as if they were the run. A run short of the complete cell set
  says so in its verdict line (`PASS (reduced: model tiny, operators 2/12, tiers 2/3)`); `full=True`
  (`ws1 gate --full`) makes every gap red.
- Chain cells (`ws1 chain`, the whole model: rollout against trainer) are re-judged from their own aggregates
  and flags (ws1_harness.verdict.chain_rejudge) whenever they are present; `require_chain=True` (`ws1 gate
  --require-chain`) makes a profile without one red. A red chain cell's problem line names its first diverging
  node, layer and logical token.
No torch is imported here.
"""

from __future__ import annotations

import re
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ws1_harness.verdict import cells as _cells
from ws1_harness.verdict import chain_rejudge as _chain
from ws1_harness.verdict import inventory as _inventory
from ws1_harness.verdict import rejudge as _rejudge
from ws1_harness.verdict.cells import CellError, CellKey, ExpectedCell, cell_key_of
from ws1_harness.verdict.environments import environment_lines
from ws1_harness.verdict.evidence import (
    DigestError,
    EvidenceError,
    chain_label,
    read_evidence,
    validate_evidence,
)
from ws1_harness.verdict.rejudge import GateReference, GateReferenceError, load_reference
from ws1_harness.verdict.status import NA_REASONS, CellStatus, ReasonCode

EXIT_PASS = 0
EXIT_RED = 1
EXIT_BAD_INPUT = 2
EXIT_PENDING = 3
_MAX_PROBLEM_LINES = 200
VERDICTS = {EXIT_PASS: "PASS", EXIT_RED: "RED", EXIT_BAD_INPUT: "BAD INPUT", EXIT_PENDING: "PENDING"}


@dataclass(frozen=True)
class Problem:
    """One reason the gate did not pass: `kind` is "red" or "pending"; `code` is machine-readable."""

    kind: str
    code: str
    message: str


@dataclass(frozen=True)
class GateResult:
    """The verdict: exit code, human summary lines, and the machine-readable problems behind it."""

    exit_code: int
    lines: tuple[str, ...]
    problems: tuple[Problem, ...] = ()
    # how the run falls short of the complete cell set (empty for a full run); shown in the verdict line
    reduced: tuple[str, ...] = ()
    # what the run's tier plans left out (`--expect PROFILE:TIER+TIER`), one entry per profile; shown there too
    planned: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.exit_code == EXIT_PASS

    @property
    def verdict(self) -> str:
        """PASS, RED, BAD INPUT or PENDING."""
        return VERDICTS[self.exit_code]


def source_commit(doc: Mapping[str, Any]) -> tuple[list[str], bool]:
    """(commits, dirty) of the code that produced the cells: every shard's for a merge, else the writer's."""
    provs = [s["provenance"] for s in doc["shards"]] if doc["shards"] else [doc["provenance"]]
    commits = sorted({p["git_commit"] for p in provs})
    return commits, any(p["git_dirty"] for p in provs)


def device_contradictions(doc: Mapping[str, Any]) -> list[str]:
    """Cells whose recorded device contradicts the provenance of the shard that wrote them.

    Each cell records the device its tensors lived on (read from the candidate's outputs); the shard's provenance
    names the device of the process. A GPU cell carries its arch in the profile label (`native_torch@sm90`, or
    `...@sm86-proxy` when the shard declares a PTX proxy). Evidence that says "H200" while its cells ran on the
    host, or the reverse, is refused: its verdict would describe another run.
    """
    shards = doc.get("shards") or []
    out: list[str] = []
    for i, prov in enumerate([doc["provenance"], *(s["provenance"] for s in shards)]):
        if prov["device"] != "cuda" and prov["capability"] is not None:
            where = "provenance" if i == 0 else f"shards[{i - 1}].provenance"
            out.append(f"{where}: device {prov['device']} with CUDA capability {prov['capability']}")
    for cell in [*doc["cells"], *doc["chain_cells"]]:
        where = chain_label(cell) if "layers" in cell else cell_key_of(cell).label()
        idx = cell.get("shard")
        prov = (
            shards[idx]["provenance"]
            if shards and idx is not None and idx < len(shards)
            else doc["provenance"]
        )
        dev = cell.get("device")
        label = cell["profile"].split("@", 1)[1] if "@" in cell["profile"] else None
        if dev is None:
            if cell["status"] == CellStatus.GREEN.value:
                out.append(f"{where}: green but records no device")
            continue
        if dev["type"] != prov["device"]:
            out.append(f"{where}: ran on {dev['type']} but the shard's provenance names {prov['device']}")
            continue
        if dev["type"] != "cuda":
            if label is not None:
                out.append(f"{where}: ran on {dev['type']} but its profile is labelled with arch {label!r}")
            elif dev.get("capability") is not None:
                out.append(f"{where}: ran on {dev['type']} but records CUDA capability {dev['capability']}")
            continue
        if dev["capability"] != prov["capability"]:
            out.append(
                f"{where}: ran on {dev['capability']} but the shard's provenance names {prov['capability']}"
            )
        elif label is None:
            out.append(f"{where}: ran on CUDA {dev['capability']} but its profile carries no arch label")
        elif label.endswith("-proxy"):
            if not prov.get("arch_proxy"):
                out.append(f"{where}: labelled {label!r} but the shard declares no arch proxy")
            else:
                why = proxy_unproven(label, prov, cell)
                if why is not None:
                    out.append(f"{where}: labelled {label!r} but {why}")
        elif label != dev["capability"].replace("_", ""):
            out.append(f"{where}: labelled {label!r} but ran on {dev['capability']}")
        else:
            why = unlabelled_proxy(label, prov, cell)
            if why is not None:
                out.append(f"{where}: labelled {label!r} (the device's own arch) but {why}")
    return out


def unlabelled_proxy(label: str, prov: Mapping[str, Any], cell: Mapping[str, Any]) -> str | None:
    """Why a cell labelled with the device's own arch was in fact a proxy run, or None.

    A proxy run must say so in its label (`@sm86-proxy`): a shard that declares an arch proxy, or whose CUDA
    extension's code objects come from another arch's PTX while the cell ran the extension's kernels, would
    otherwise read as a run of the device's own code."""
    if prov.get("arch_proxy"):
        return f"the shard declares an arch proxy ({prov['arch_proxy']}): label it '<arch>-proxy'"
    ran_extension = any(str(k).startswith(PROXY_KERNELS) for k in cell.get("observed_kernels") or ())
    other = foreign_ptx(prov, label.removeprefix("sm"))
    if ran_extension and other:
        return f"its shard's code objects come from PTX {', '.join(other)}: an unlabelled proxy run"
    return None


#: kernel ids of the ws1 CUDA extension (csrc/), the only code whose arch a proxy run can choose
PROXY_KERNELS = "ws1.cuda."


def proxy_unproven(label: str, prov: Mapping[str, Any], cell: Mapping[str, Any]) -> str | None:
    """Why a proxy-labelled cell is not shown to have run the named arch's code, or None.

    A proxy run (sm86 PTX JIT-compiled on an sm_90 card) is only a proxy when that code ran. The shard must record
    the code objects the runtime loaded (`provenance.code_objects`, read off the device) and every one of them
    must come from the named arch's PTX; a cell that launched any kernel that is not the ws1 CUDA extension's is
    refused outright (Triton and torch's stock kernels are compiled for the device's own arch, whatever the
    label says).
    """
    arch = label.split("-", 1)[0].removeprefix("sm")
    foreign = sorted(
        {str(k) for k in cell.get("observed_kernels") or () if not str(k).startswith(PROXY_KERNELS)}
    )
    if foreign:
        kind = "Triton kernels" if any(k.startswith("triton:") for k in foreign) else "kernels"
        return (
            f"it ran {kind} other than the ws1 CUDA extension's ({foreign[0]}), compiled for the device's own "
            f"arch, not sm{arch}"
        )
    objs = prov.get("code_objects") or []
    if not objs:
        return "its shard records no code object, so nothing shows that sm" + arch + " code ran"
    other = foreign_ptx(prov, arch)
    if other:
        return f"its shard's code objects come from PTX {', '.join(other)}, not sm{arch} code"
    return None


def foreign_ptx(prov: Mapping[str, Any], arch: str) -> list[str]:
    """The PTX versions among the shard's code objects other than `arch` (`"86"`, `"90"`), sorted."""
    return sorted({str(o["ptx_version"]) for o in prov.get("code_objects") or []} - {arch})


def error_detail(raw: Mapping[str, Any]) -> str:
    """`: <message> (at <file:line>)` of an `error` cell (the candidate's own exception), else ""."""
    if raw["status"] != CellStatus.ERROR.value:
        return ""
    diag = raw.get("diagnostics") or {}
    why, at = diag.get("why"), diag.get("at")
    return (f": {why}" if why else "") + (f" (at {at})" if at else "")


def _judge_cell(raw: Mapping[str, Any], exp: ExpectedCell, allow_pending_arch: bool) -> Problem | None:
    key = exp.key.label()
    status = CellStatus(raw["status"])
    reason = raw["reason_code"]
    if exp.na_reason is not None:
        if status is CellStatus.NA and reason == exp.na_reason:
            return None
        if status is CellStatus.PENDING_ARCH:
            pass  # judged below like any pending cell
        elif status in (CellStatus.RED, CellStatus.ERROR):
            return Problem("red", status.value, f"{key}: {status.value} ({reason}){error_detail(raw)}")
        else:
            return Problem(
                "red", "expected_na", f"{key}: {status.value} ({reason}) but must be na ({exp.na_reason})"
            )
    if status is CellStatus.GREEN:
        return None
    if status in (CellStatus.RED, CellStatus.ERROR):
        return Problem("red", status.value, f"{key}: {status.value} ({reason}){error_detail(raw)}")
    if status is CellStatus.NA:
        if reason == ReasonCode.OPTIONAL_NOT_PROVIDED.value and not exp.required:
            return None
        why = "not an na reason" if reason not in NA_REASONS else "does not apply to this cell"
        return Problem("red", "unexplained_na", f"{key}: na ({reason}) {why}")
    if status is CellStatus.PENDING_ARCH:
        if allow_pending_arch:
            return None
        return Problem("pending", "pending_arch", f"{key}: pending_arch ({reason})")
    return Problem("red", "unknown_status", f"{key}: unknown status {status!r}")  # pragma: no cover


def _inventory_problems(doc: Mapping[str, Any]) -> list[Problem]:
    """Inventory: every profile on the axes needs every item, each with verdict `pass`; anything else is open.

    Items that are chain nodes are re-derived from the cells here, so a stored `pass` cannot outvote a red cell;
    and the stored entry of a node item must be exactly the derived one (the writer and `ws1 merge` derive it from
    the same cells), so an entry edited, moved to another profile or deleted is red `inventory_mismatch`: the cells
    are covered by their digest, the inventory by this re-derivation.
    """
    problems: list[Problem] = []
    stored = {(i["profile"], i["item"]): i for i in doc.get("inventory", [])}
    known = {(p, item) for p in doc["axes"]["profiles"] for item in _inventory.ITEMS}
    for profile, item in sorted(set(stored) - known):
        problems.append(
            Problem(
                "red",
                "inventory_mismatch",
                f"inventory {profile}/{item}: an entry for a profile or item the run does not have",
            )
        )
    for profile in doc["axes"]["profiles"]:
        derived = _inventory.node_verdicts(doc["cells"], profile)
        for item in _inventory.ITEMS:
            entry: Mapping[str, Any] | None = stored.get((profile, item))
            if item in _inventory.NODE_ITEMS:
                want = {"profile": profile, **derived[item].to_json()}
                if entry != want:
                    problems.append(
                        Problem(
                            "red",
                            "inventory_mismatch",
                            f"inventory {profile}/{item}: the stored entry is not what the cells say "
                            f"({'absent' if entry is None else entry.get('verdict')} stored, "
                            f"{want['verdict']} derived)",
                        )
                    )
                if item not in doc["axes"]["operators"]:
                    continue  # a run restricted to other operators: the node's own cells are not on the axes
                entry = want
            if entry is None:
                problems.append(
                    Problem("red", "inventory_missing", f"inventory {profile}/{item}: no verdict")
                )
            elif entry["verdict"] != "pass":
                problems.append(
                    Problem(
                        "red",
                        "inventory_open",
                        f"inventory {profile}/{item}: {entry['verdict']} ({entry['detail']})",
                    )
                )
    return problems


def _bad_input(code: str, message: str) -> GateResult:
    line = f"ws1 gate: {VERDICTS[EXIT_BAD_INPUT]}: {message.splitlines()[0] if message else code}"
    return GateResult(EXIT_BAD_INPUT, (line,), (Problem("bad_input", code, line),))


def gate(
    evidence: Mapping[str, Any] | str | Path,
    expected_cells: Mapping[CellKey, ExpectedCell] | None = None,
    *,
    allow_pending_arch: bool = False,
    expect_commit: str | None = None,
    require_clean: bool = False,
    source: str | None = None,
    full: bool = False,
    reference: GateReference | None = None,
    contract: str | Path | None = None,
    manifest: str | Path | None = None,
    require_chain: bool = False,
    expect_profiles: Sequence[str] = (),
) -> GateResult:
    """Judge an evidence document (or file). `expected_cells` overrides the set derived from the axes.

    The evidence is judged against `reference`, else the contract and manifest files given (None: the shipped
    ones). `full` requires the complete cell set (every operator and tier of the manifest at the full model's
    widths, every judgment, no shard, no absent optional cell). Chain cells present are always judged;
    `require_chain` makes every profile on the axes (or, in a file without matrix axes, the file) need one.
    `expect_profiles` (`profile@arch`, e.g. `cuda_bf16@sm86-proxy`, or a bare profile for a CPU shard) names what the run's plan promised: one that
    no shard holds is red, so a merge that lost a shard cannot pass on the shards it kept. `profile:short+primary`
    also says which tiers the plan ran it on (`apply_tier_plans`): the absent cells of its other tiers are not
    expected, and the verdict line says so.
    """
    if source is None:
        source = str(evidence) if isinstance(evidence, (str, Path)) else "evidence"
    if expect_commit is not None:
        expect_commit = expect_commit.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{7,40}", expect_commit):  # `zzz` was once red (exit 1), not bad input
            return _bad_input(
                "bad_input",
                f"--expect-commit {expect_commit!r}: not a commit (7 to 40 hex digits, as git prints)",
            )
    plans, problem = parse_expect(expect_profiles)
    if problem is not None:
        return _bad_input("bad_input", problem)
    try:
        ref = reference if reference is not None else load_reference(contract, manifest)
    except GateReferenceError as exc:
        return _bad_input("bad_reference", str(exc))
    problem = unknown_plan_tier(plans, ref.manifest.tiers)
    if problem is not None:
        return _bad_input("bad_input", problem)
    loaded = _load(evidence, expected_cells, source)
    if isinstance(loaded, GateResult):
        return loaded
    doc, expected = loaded
    expected, planned_out = apply_tier_plans(expected, doc, plans)

    problems, commits, dirty = _provenance_problems(doc, ref, expect_commit, require_clean)
    matrix = _matrix_problems(doc, expected, ref, allow_pending_arch)
    problems += matrix.problems
    chain_problems, n_chain = _chain_problems(doc, ref, require_chain)
    problems += chain_problems
    if matrix.n_green_required == 0 and n_chain["green"] == 0:
        problems.append(Problem("red", "no_green", "no executed green required cell"))
    problems += _inventory_problems(doc)
    present = set(doc["axes"]["profiles"]) | {
        c.get("profile") for c in doc["chain_cells"] if c.get("profile")
    }
    for want in expect_profiles:
        name = want.split(":", 1)[0]
        if name not in present:
            problems.append(
                Problem(
                    "red",
                    "expected_missing",
                    f"--expect {name}: no shard holds it (present: {sorted(present)})",
                )
            )

    if not doc["axes"]["operators"] and doc["chain_cells"]:
        matrix_gaps = ["no matrix cell"]  # a `ws1 chain` file: the chain alone, said once
    else:
        matrix_gaps = _rejudge.full_run_gaps(doc, ref, matrix.n_missing_optional)
    gaps = tuple(matrix_gaps + _chain.chain_gaps(doc, ref))
    if full:
        for gap in gaps:
            problems.append(Problem("red", "not_full", f"--full: not the complete cell set: {gap}"))

    n_red = sum(p.kind == "red" for p in problems)
    n_pending = sum(p.kind == "pending" for p in problems)
    code = EXIT_RED if n_red else (EXIT_PENDING if n_pending else EXIT_PASS)
    verdict = VERDICTS[code] + (f" (reduced: {', '.join(gaps)})" if gaps else "")
    planned = tuple(
        f"{p} tiers {'+'.join(plans[p])}, {n} cells not run" for p, n in sorted(planned_out.items())
    )
    if planned:  # what the plan left out is said in the verdict line itself, never only in a log
        verdict += f" (planned: {'; '.join(planned)})"

    counts = doc["counts"]
    lines = [
        f"ws1 gate: {verdict} (exit {code}): {source}",
        f"commit {', '.join(commits)} dirty={str(dirty).lower()} workload {doc['workload']['id']} "
        f"contract {doc['contract']['fingerprint'][:19]} finalised={str(doc['finalised']).lower()}",
        "cells: "
        + " ".join(f"{s.value}={counts[s.value]}" for s in CellStatus)
        + f" total={counts['total']} expected={len(expected)} green_required={matrix.n_green_required}"
        + (f" optional_absent={matrix.n_missing_optional}" if matrix.n_missing_optional else "")
        + (" pending_arch_allowed" if allow_pending_arch else "")
        + (f" chain green={n_chain['green']} red={n_chain['red']}" if doc["chain_cells"] else ""),
        f"problems: red={n_red} pending={n_pending}",
    ]
    for p in problems[:_MAX_PROBLEM_LINES]:
        lines.append(f"  [{p.kind}] {p.message}")
    if len(problems) > _MAX_PROBLEM_LINES:
        lines.append(f"  ... and {len(problems) - _MAX_PROBLEM_LINES} more")
    lines += environment_lines(doc)
    return GateResult(code, tuple(lines), tuple(problems), gaps, planned)


def parse_expect(values: Sequence[str]) -> tuple[dict[str, tuple[str, ...]], str | None]:
    """(the tier plan of each `--expect` value that names one, why a value is malformed or None). The tiers are
    checked against the manifest by `gate`, which has it."""
    plans: dict[str, tuple[str, ...]] = {}
    for want in values:
        m = _EXPECT.fullmatch(want)
        if m is None:
            return plans, (
                f"--expect {want!r}: not profile@arch[:tier+tier] (e.g. cuda_bf16@sm90; a CPU shard planned on two "
                "tiers: portable_cpu:short+primary)"
            )
        if m.group(2):
            plans[m.group(1)] = tuple(m.group(2).split("+"))
    return plans, None


def unknown_plan_tier(plans: Mapping[str, Sequence[str]], tiers: Sequence[str]) -> str | None:
    """Why a plan names a tier the manifest lacks (one line), or None. `gate` and `ws1 report` both ask, so a
    plan the gate refuses as bad input never becomes a report."""
    for profile, planned in plans.items():
        unknown = [t for t in planned if t not in tiers]
        if unknown:
            return (
                f"--expect {profile}:{'+'.join(planned)}: tier {unknown[0]!r} is not in the manifest "
                f"({', '.join(tiers)})"
            )
    return None


#: `--expect profile[@arch][:tier+tier]`
_EXPECT = re.compile(r"([a-z0-9_]+(?:@[a-z0-9_-]+)?)(?::([a-z0-9_]+(?:\+[a-z0-9_]+)*))?")


def apply_tier_plans(
    expected: Mapping[CellKey, ExpectedCell], doc: Mapping[str, Any], plans: Mapping[str, Sequence[str]]
) -> tuple[dict[CellKey, ExpectedCell], dict[str, int]]:
    """The expected set without the absent cells of tiers a profile's plan leaves out; how many per profile.

    Why: a merged run joins sessions with different plans. The CPU session runs its profile on the short and primary
    tiers (at full widths on two cores its long tier's det_gemm unit alone took 342 s), the GPU sessions on every tier, and the merged
    axes are the product of all. A plan only excuses absence: a cell that is present is judged whatever its tier, so
    a plan can never hide a red cell. The verdict line names every profile so planned and the cells it left out."""
    if not plans:
        return dict(expected), {}
    present = {cell_key_of(c) for c in doc.get("cells", [])}
    out: dict[CellKey, ExpectedCell] = {}
    dropped: dict[str, int] = {}
    for key, cell in expected.items():
        if planned_out(key, plans, present):
            dropped[key.profile] = dropped.get(key.profile, 0) + 1
            continue
        out[key] = cell
    return out, dropped


def planned_out(key: CellKey, plans: Mapping[str, Sequence[str]], present: Container[CellKey]) -> bool:
    """Whether `key` is an absent cell of a tier its profile's plan leaves out (the one rule: the gate drops such a
    cell from the expected set, the per-arch heatmap draws it blank)."""
    tiers = plans.get(key.profile)
    return tiers is not None and key.tier not in tiers and key not in present


def _load(
    evidence: Mapping[str, Any] | str | Path,
    expected: Mapping[CellKey, ExpectedCell] | None,
    source: str,
) -> tuple[dict[str, Any], Mapping[CellKey, ExpectedCell]] | GateResult:
    """The validated evidence document and its expected cell set, or the bad-input result that refuses it."""
    try:
        if isinstance(evidence, (str, Path)):
            doc = read_evidence(evidence)
        else:
            doc = dict(evidence)
            validate_evidence(doc, source)
        if expected is None:
            ax = doc["axes"]
            expected = _cells.expected_cells(
                ax["profiles"], ax["operators"], ax["tiers"], ax["judgments"], ax["operator_specs"]
            )
    except DigestError as exc:
        return _bad_input("digest_mismatch", str(exc))
    except (EvidenceError, CellError) as exc:
        return _bad_input("bad_input", str(exc) or type(exc).__name__)
    contradictions = device_contradictions(doc)
    if contradictions:
        return _bad_input(
            "device_mismatch",
            f"{source}: {len(contradictions)} cell(s) contradict the provenance, first: {contradictions[0]}",
        )
    return doc, expected


def _provenance_problems(
    doc: Mapping[str, Any], ref: GateReference, expect_commit: str | None, require_clean: bool
) -> tuple[list[Problem], list[str], bool]:
    """Finalised, judged against the same contract and manifest, one commit (the expected one), clean if asked."""
    problems: list[Problem] = []
    if not doc["finalised"]:
        problems.append(Problem("red", "not_finalised", "evidence is not finalised (partial or crashed run)"))
    for problem_code, message in _rejudge.reference_mismatches(doc, ref) + _rejudge.plugin_problems(doc, ref):
        problems.append(Problem("red", problem_code, message))
    commits, dirty = source_commit(doc)
    if len(commits) != 1:
        problems.append(
            Problem("red", "commit_mismatch", f"shards from several commits: {', '.join(commits)}")
        )
    # an abbreviated sha names the commit whose full sha it starts (e6b4420 was once red against its own sha)
    if expect_commit is not None and not (len(commits) == 1 and commits[0].startswith(expect_commit)):
        problems.append(
            Problem(
                "red", "commit_mismatch", f"evidence commit {', '.join(commits)} != expected {expect_commit}"
            )
        )
    if require_clean and dirty:
        problems.append(Problem("red", "dirty_tree", "evidence was produced from a dirty or unknown tree"))
    return problems, commits, dirty


@dataclass(frozen=True)
class _MatrixFindings:
    problems: list[Problem]
    n_green_required: int
    n_missing_optional: int


def _matrix_problems(
    doc: Mapping[str, Any],
    expected: Mapping[CellKey, ExpectedCell],
    ref: GateReference,
    allow_pending_arch: bool,
) -> _MatrixFindings:
    """Every matrix cell against the expected set, re-judged from its own records."""
    problems: list[Problem] = []
    present: dict[CellKey, Mapping[str, Any]] = {cell_key_of(c): c for c in doc["cells"]}
    op_classes = _rejudge.op_classes(doc)
    for key in sorted(set(present) - set(expected)):
        problems.append(Problem("red", "extra_cell", f"{key.label()}: cell not in the expected set"))
    tensor_faults = _rejudge.tensor_disagreements(doc["cells"])
    mismatched = {key for key, _ in tensor_faults}
    for key, message in tensor_faults:
        problems.append(Problem("red", "verdict_mismatch", f"{key.label()}: {message}"))
    n_green_required = 0
    n_missing_optional = 0
    for key in sorted(expected):
        exp = expected[key]
        raw = present.get(key)
        if raw is None:
            if exp.required:
                problems.append(
                    Problem("red", ReasonCode.NOT_RUN.value, f"{key.label()}: required cell missing")
                )
            else:
                n_missing_optional += 1
            continue
        cell_ok = key not in mismatched
        if raw["required"] != exp.required:
            cell_ok = False
            problems.append(
                Problem(
                    "red",
                    "required_mismatch",
                    f"{key.label()}: records required={str(raw['required']).lower()} but the operator spec "
                    f"makes it {'required' if exp.required else 'optional'}",
                )
            )
        disagreement = _rejudge.cell_disagreement(raw, op_classes.get(key.operator), ref)
        if disagreement is not None:
            cell_ok = False
            problems.append(Problem("red", "verdict_mismatch", f"{key.label()}: {disagreement}"))
        problem = _judge_cell(raw, exp, allow_pending_arch)
        if problem is not None:
            problems.append(problem)
        elif raw["status"] == CellStatus.GREEN.value and exp.required and cell_ok:
            n_green_required += 1
    return _MatrixFindings(problems, n_green_required, n_missing_optional)


def _chain_problems(
    doc: Mapping[str, Any], ref: GateReference, require_chain: bool
) -> tuple[list[Problem], dict[str, int]]:
    """Every chain cell re-judged, every tier it names present, and a chain per profile when required."""
    problems: list[Problem] = []
    n_chain = {"green": 0, "red": 0}
    for raw in doc["chain_cells"]:
        label = chain_label(raw)
        disagreement = _chain.chain_disagreement(raw, ref)
        if disagreement is not None:
            problems.append(Problem("red", "verdict_mismatch", f"{label}: {disagreement}"))
        if raw["status"] != "green":
            where = _chain.divergence_text(raw)
            problems.append(
                Problem(
                    "red",
                    "chain_red",
                    f"{label}: red ({', '.join(raw['failed'])})" + (f"; {where}" if where else ""),
                )
            )
        elif disagreement is None:
            n_chain["green"] += 1
            continue
        n_chain["red"] += 1
    for line in _chain.missing_tiers(doc["chain_cells"]):
        problems.append(Problem("red", "chain_incomplete", line))
    if require_chain:
        with_chain = {c["profile"] for c in doc["chain_cells"]}
        for profile in doc["axes"]["profiles"]:
            if profile not in with_chain:
                problems.append(Problem("red", "chain_missing", f"{profile}: --require-chain: no chain cell"))
        if not doc["axes"]["profiles"] and not doc["chain_cells"]:
            problems.append(Problem("red", "chain_missing", "--require-chain: no chain cell"))
    return problems, n_chain
