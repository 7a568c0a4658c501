"""What the gate checks evidence against, and the re-judgment of every cell from its own records.

An earlier version of the gate took each cell's stored `status` on trust: a red cell set to `green` with its
reason nulled and its counts recomputed passed, although the cell's own per-layout results still said
`passed: false`. A fingerprint replaced by zeros passed too, since nothing compared it with anything. Here:

- The gate is given a contract and a manifest (default: the shipped ones; `ws1 gate --contract/--manifest`) and
  refuses evidence that names another contract, another workload, or operator specs the manifest does not hold.
- Each cell's verdict is derived again from what the cell records: one `check` per compared tensor (mode,
  passed, reason, elements compared, mismatch counts, thresholds used) inside one layout result per compared
  layout. A check passes only when it compared something, found no mismatch and, in tolerance mode, used
  exactly the thresholds the contract gives the cell's (judgment, op class, execution dtype). A green cell must
  be backed by passing checks over the full layout set the manifest defines for its judgment; a red cell
  whose reason is a comparison outcome must be backed by a failing check with that reason.
- `full_run_gaps` says how a run falls short of the complete cell set (model widths, operators, tiers,
  judgments, shards, absent optional cells); `ws1 gate --full` makes each gap red.

What this cannot stop: a forger who rewrites every field consistently (checks, layouts, status, counts) and
recomputes the digests. docs/gate.md says so. No torch is imported here: the manifest is read as YAML.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as _field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from ws1_harness.errors import HarnessError
from ws1_harness.verdict.cells import GRADIENT_JUDGMENTS, CellKey, OperatorInfo, cell_key_of, operator_infos
from ws1_harness.verdict.status import CellStatus

PACKAGED_MANIFEST = "qwen3-8b-dense.yaml"
CANONICAL_LAYOUT_TYPE = "packed"
ACCURACY_JUDGMENTS = frozenset({"forward_accuracy", "gradient_accuracy"})
# the reasons a comparison itself produces: a red cell with one of these must show the failing check
COMPARISON_REASONS = frozenset(
    {"bits_differ", "tolerance_exceeded", "non_finite", "shape_mismatch", "dtype_mismatch"}
)
_COUNTED_REASONS = {"bits_differ": "n_mismatch", "tolerance_exceeded": "n_mismatch"}


class GateReferenceError(HarnessError):
    """A contract or manifest the gate was given that cannot be read. One line."""


@dataclass(frozen=True)
class LayoutInfo:
    """A manifest layout as the gate needs it: its name, kind (training/inference) and type."""

    name: str
    kind: str
    type: str


@dataclass(frozen=True)
class ManifestInfo:
    """The parts of a workload manifest the gate checks evidence against (read without torch)."""

    source: str
    workload_id: str
    revision: int
    fingerprint: str
    operators: Mapping[str, OperatorInfo]
    layouts: tuple[LayoutInfo, ...]
    tiers: tuple[str, ...]
    full_models: tuple[str, ...]
    profiles: tuple[str, ...]
    #: the stock baselines: profiles the manifest lets run on any device (their op watch is recorded, not gated)
    stock_profiles: frozenset[str] = frozenset()
    #: layers of each model of the manifest (a chain cell names its model and how many layers ran)
    model_layers: Mapping[str, int] = _field(default_factory=dict)

    @property
    def canonical(self) -> str:
        """The name of the canonical (packed) layout every other layout is compared with."""
        return next(lay.name for lay in self.layouts if lay.type == CANONICAL_LAYOUT_TYPE)

    def compared_layouts(self, judgment: str) -> frozenset[str]:
        """The layouts a green cell of `judgment` must show a result for.

        Accuracy: the canonical layout only. Forward invariance: every other layout. Gradient invariance: every
        other training layout (inference layouts have no backward).
        """
        canon = self.canonical
        if judgment in ACCURACY_JUDGMENTS:
            return frozenset({canon})
        return frozenset(
            lay.name
            for lay in self.layouts
            if lay.name != canon and (judgment not in GRADIENT_JUDGMENTS or lay.kind == "training")
        )


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML would keep the last one)."""


def _mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in out:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def packaged_manifest_path() -> Path:
    """The manifest this package ships (a byte-identical copy of the repository's, kept so by
    ci/sync_package_data.py), read without importing ws1_workload, which would import torch."""
    return Path(__file__).resolve().parent.parent / "data" / PACKAGED_MANIFEST


def load_manifest_info(path: str | Path | None = None) -> ManifestInfo:
    """Read a manifest (None: the packaged one): strict YAML, schema-checked, fingerprinted like ws1_workload."""
    from ws1_contract import ContractError, validate_document
    from ws1_contract import operators as spec

    p = packaged_manifest_path() if path is None else Path(path)
    source = f"<packaged {PACKAGED_MANIFEST}>" if path is None else str(p)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GateReferenceError(f"{source}: cannot read manifest ({type(exc).__name__})") from None
    try:
        doc = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "yaml"
        raise GateReferenceError(
            f"{source}: {where}: invalid YAML: {getattr(exc, 'problem', None) or exc}"
        ) from None
    if not isinstance(doc, dict):
        raise GateReferenceError(f"{source}: a manifest is a mapping at top level")
    try:
        validate_document(doc, "manifest", source)
        fingerprint = spec.workload_fingerprint(doc)
        table = spec.shipped_table()
    except ContractError as exc:
        raise GateReferenceError(str(exc)) from None
    info = ManifestInfo(
        source=source,
        workload_id=doc["workload_id"],
        revision=int(doc["revision"]),
        fingerprint=fingerprint,
        operators=operator_infos(
            {
                name: {
                    "op_class": op.op_class,
                    "differentiable": op.differentiable,
                    "optional": op.optional,
                    "layout_only": op.layout_only,
                }
                for name, op in table.operators.items()
            }
        ),
        layouts=tuple(LayoutInfo(d["name"], d["kind"], d["type"]) for d in doc["layouts"]),
        tiers=tuple(doc["fixtures"]["tiers"]),
        full_models=tuple(name for name, m in doc["models"].items() if m.get("scale") == "full"),
        profiles=tuple(table.profiles),
        stock_profiles=frozenset(name for name, p in table.profiles.items() if p.stock),
        model_layers={name: int(m["num_layers"]) for name, m in doc["models"].items()},
    )
    if sum(lay.type == CANONICAL_LAYOUT_TYPE for lay in info.layouts) != 1:
        raise GateReferenceError(f"{source}: layouts: expected exactly one {CANONICAL_LAYOUT_TYPE!r} layout")
    return info


@dataclass(frozen=True)
class GateReference:
    """The contract and manifest evidence is judged against."""

    contract: Any  # ws1_contract.Contract
    manifest: ManifestInfo

    @property
    def dtype(self) -> str:
        """The execution dtype whose thresholds apply (the contract's policy)."""
        return str(self.contract.policy["execution_dtype"])

    def rule(self, judgment: str, op_class: str | None) -> tuple[str, float | None, float | None]:
        """(mode, atol, rtol) the contract gives a cell; GateReferenceError when it gives none."""
        from ws1_contract import ContractError

        if op_class is None:
            raise GateReferenceError(f"no contract rule for an operator without op class ({judgment})")
        try:
            spec = self.contract.resolve(judgment, op_class, self.dtype)
        except ContractError as exc:
            raise GateReferenceError(str(exc)) from None
        if spec.mode == "bitwise":
            return "bitwise", None, None
        return str(spec.mode), float(spec.atol), float(spec.rtol)


def load_reference(contract: str | Path | None = None, manifest: str | Path | None = None) -> GateReference:
    """The gate's reference: the given contract and manifest files, each None for the shipped one."""
    if contract is None and manifest is None:
        return shipped_reference()
    from ws1_contract import ContractError, load_contract

    try:
        loaded = load_contract(contract)
    except ContractError as exc:
        raise GateReferenceError(f"--contract: {exc}") from None
    return GateReference(loaded, load_manifest_info(manifest))


@lru_cache(maxsize=1)
def shipped_reference() -> GateReference:
    """The shipped contract and the packaged manifest (read once per process)."""
    from ws1_contract import load_contract

    return GateReference(load_contract(None), load_manifest_info(None))


# ---------------------------------------------------------------------------------------------- the run as a whole


def reference_mismatches(doc: Mapping[str, Any], ref: GateReference) -> list[tuple[str, str]]:
    """(code, message) for each way the evidence names another contract or workload than the gate's."""
    out: list[tuple[str, str]] = []
    want = ref.contract.fingerprint
    got = doc["contract"]["fingerprint"]
    if got != want:
        out.append(
            (
                "contract_mismatch",
                f"contract fingerprint {got[:19]}... is not the contract's {want[:19]}... ({ref.contract.source})",
            )
        )
    wl = doc["workload"]
    man = ref.manifest
    for field, value, expected in (
        ("fingerprint", wl["fingerprint"], man.fingerprint),
        ("id", wl["id"], man.workload_id),
        ("revision", wl["revision"], man.revision),
    ):
        if value != expected:
            shown = (
                (f"{str(value)[:19]}...", f"{str(expected)[:19]}...")
                if field == "fingerprint"
                else (value, expected)
            )
            out.append(
                (
                    "workload_mismatch",
                    f"workload {field} {shown[0]} is not the manifest's {shown[1]} ({man.source})",
                )
            )
    for op, spec in doc["axes"]["operator_specs"].items():
        known = man.operators.get(op)
        if known is None:
            out.append(("workload_mismatch", f"operator {op!r} is not in the manifest ({man.source})"))
        elif dict(spec) != known.to_json():
            out.append(
                ("workload_mismatch", f"operator spec of {op!r} differs from the manifest's ({man.source})")
            )
    return out


def _base(label: str) -> tuple[str, str | None]:
    name, _, suffix = label.partition("@")
    return name, suffix or None


def plugin_problems(doc: Mapping[str, Any], ref: GateReference) -> list[tuple[str, str]]:
    """A profile the manifest does not define must come with its plug-in's recorded source, and no plug-in may
    record itself under a name the manifest defines (a built-in profile)."""
    provs = [s["provenance"] for s in doc["shards"]] if doc["shards"] else [doc["provenance"]]
    recorded: dict[str, list[Mapping[str, Any]]] = {}
    for prov in provs:
        for entry in prov.get("plugins", []):
            recorded.setdefault(entry["profile"], []).append(entry)
    out: list[tuple[str, str]] = []
    for name in sorted(recorded):
        if name in ref.manifest.profiles:
            out.append(
                ("plugin_builtin_name", f"a plug-in recorded itself under the built-in profile {name!r}")
            )
    for label in doc["axes"]["profiles"]:
        name = _base(label)[0]
        if name in ref.manifest.profiles:
            continue
        entries = recorded.get(name, [])
        if not entries:
            out.append(
                (
                    "plugin_unrecorded",
                    f"profile {label!r} is not built in and its evidence records no plug-in source",
                )
            )
        elif any(e["sha256"] is None for e in entries):
            out.append(
                ("plugin_unrecorded", f"profile {label!r}: a plug-in module has no source file to digest")
            )
    return out


def full_run_gaps(doc: Mapping[str, Any], ref: GateReference, n_optional_absent: int) -> list[str]:
    """How this run falls short of the complete cell set (empty for a full run): model widths other than the
    full model's, operators or tiers or judgments the manifest has and the axes lack, a shard, absent cells of
    optional operators."""
    ax = doc["axes"]
    man = ref.manifest
    gaps: list[str] = []
    models = sorted({m for m in (_base(t)[1] for t in ax["tiers"]) if m is not None})
    if models:
        gaps.append(f"model {', '.join(models)}")
    ops = [op for op in man.operators if op in ax["operators"]]
    if len(ops) != len(man.operators):
        gaps.append(f"operators {len(ops)}/{len(man.operators)}")
    full_tiers = {t for t in ax["tiers"] if _base(t)[1] is None}
    if not models and len(full_tiers & set(man.tiers)) != len(man.tiers):
        gaps.append(f"tiers {len(full_tiers & set(man.tiers))}/{len(man.tiers)}")
    elif models:
        base_tiers = {_base(t)[0] for t in ax["tiers"]}
        if len(base_tiers & set(man.tiers)) != len(man.tiers):
            gaps.append(f"tiers {len(base_tiers & set(man.tiers))}/{len(man.tiers)}")
    n_judgments = len(ref.contract.judgments)
    if len(set(ax["judgments"])) != n_judgments:
        gaps.append(f"judgments {len(set(ax['judgments']))}/{n_judgments}")
    if not ax["profiles"]:
        gaps.append("no profile")
    if doc["shard"] is not None:
        gaps.append(f"shard {doc['shard']}")
    if n_optional_absent:
        gaps.append(f"optional cells absent {n_optional_absent}")
    return gaps


# ---------------------------------------------------------------------------------------------- one cell


def _check_fault(check: Mapping[str, Any], rule: tuple[str, float | None, float | None]) -> str | None:
    """Why a check's own figures contradict its `passed` flag or the contract's rule; None when they agree."""
    mode, atol, rtol = rule
    if check["mode"] != mode:
        return f"compared in {check['mode']} mode, the contract's rule is {mode}"
    if mode == "tolerance" and (check["atol"] != atol or check["rtol"] != rtol):
        return f"thresholds atol={check['atol']} rtol={check['rtol']} are not the contract's atol={atol} rtol={rtol}"
    if mode == "bitwise" and (
        check["atol"] is not None or check["rtol"] is not None or check["n_non_finite_mismatch"] is not None
    ):
        return "a bitwise check carries tolerance figures"
    if check["passed"]:
        if check["reason_code"] is not None:
            return f"passed with reason {check['reason_code']}"
        if check["n_total"] is None or check["n_total"] < 1:
            return "passed but compared no element"
        if check["n_mismatch"] != 0:
            return f"passed with {check['n_mismatch']} mismatching elements"
        if mode == "tolerance" and check["n_non_finite_mismatch"] != 0:
            return f"passed with {check['n_non_finite_mismatch']} non-finite mismatches"
        return None
    reason = check["reason_code"]
    if reason not in COMPARISON_REASONS:
        return f"failed with {reason}, which is not a comparison outcome"
    counted = _COUNTED_REASONS.get(reason)
    if counted is not None and not (check[counted] or 0) >= 1:
        return f"failed with {reason} but counts no mismatching element"
    if reason == "non_finite" and not (check["n_non_finite_mismatch"] or 0) >= 1:
        return "failed with non_finite but counts no non-finite mismatch"
    return None


@dataclass(frozen=True)
class Rejudged:
    """What a cell's records imply: `faults` (records contradicting themselves or the contract), the reason of
    the first failing check (None when every check passes), and the checks and layouts seen."""

    faults: tuple[str, ...]
    first_failure: str | None
    n_checks: int
    layouts: tuple[str, ...]
    tensors: tuple[frozenset[str], ...]


def rejudge_records(raw: Mapping[str, Any], op_class: str | None, ref: GateReference) -> Rejudged:
    """Re-judge a cell's layout results and checks from their figures alone."""
    faults: list[str] = []
    first_failure: str | None = None
    n_checks = 0
    tensors: list[frozenset[str]] = []
    try:
        rule: tuple[str, float | None, float | None] | None = ref.rule(raw["judgment"], op_class)
        rule_error = None
    except GateReferenceError as exc:
        rule, rule_error = None, str(exc)
    for lr in raw["layouts"]:
        where = lr["layout"]
        checks = lr["checks"]
        names = [c["tensor"] for c in checks]
        tensors.append(frozenset(names))
        if len(set(names)) != len(names):
            faults.append(f"{where}: a tensor is checked twice")
        layout_failure: str | None = None
        for check in checks:
            n_checks += 1
            fault = rule_error if rule is None else _check_fault(check, rule)
            if fault is not None:
                faults.append(f"{where}/{check['tensor']}: {fault}")
            if not check["passed"] and layout_failure is None:
                layout_failure = check["reason_code"]
        if not checks and lr["passed"]:
            faults.append(f"{where}: passed without a check")
        if lr["passed"] != (layout_failure is None) or lr["reason_code"] != layout_failure:
            faults.append(
                f"{where}: records passed={str(lr['passed']).lower()} ({lr['reason_code']}) but its checks "
                f"say {'passed' if layout_failure is None else layout_failure}"
            )
        if first_failure is None:
            first_failure = layout_failure
    if first_failure is None and any(not lr["passed"] for lr in raw["layouts"]):
        first_failure = next(lr["reason_code"] for lr in raw["layouts"] if not lr["passed"])
    layouts = tuple(lr["layout"] for lr in raw["layouts"])
    return Rejudged(tuple(faults), first_failure, n_checks, layouts, tuple(tensors))


def cell_disagreement(raw: Mapping[str, Any], op_class: str | None, ref: GateReference) -> str | None:
    """Why the stored status/reason of a cell disagrees with what its records imply; None when they agree."""
    status = CellStatus(raw["status"])
    reason = raw["reason_code"]
    got = rejudge_records(raw, op_class, ref)
    stored = f"stored {status.value}" + (f" ({reason})" if reason else "")
    if got.faults:
        return f"{stored} but its records contradict themselves or the contract: {got.faults[0]}"
    if status is CellStatus.GREEN:
        if got.first_failure is not None:
            return f"{stored} but its records say red ({got.first_failure})"
        if got.n_checks == 0:
            return f"{stored} but it records no comparison"
        want = ref.manifest.compared_layouts(raw["judgment"])
        if len(set(got.layouts)) != len(got.layouts) or set(got.layouts) != want:
            missing = sorted(want - set(got.layouts))
            extra = sorted(set(got.layouts) - want)
            detail = ", ".join(
                part
                for part in (
                    f"missing {', '.join(missing)}" if missing else "",
                    f"not in the manifest {', '.join(extra)}" if extra else "",
                    "a layout twice" if len(set(got.layouts)) != len(got.layouts) else "",
                )
                if part
            )
            return f"{stored} but its layout results do not cover the manifest's layouts ({detail})"
        if not raw["observed_kernels"]:
            return f"{stored} but it records no kernel launch"
        return None
    if status in (CellStatus.NA, CellStatus.PENDING_ARCH):
        if got.n_checks or raw["layouts"]:
            return f"{stored} but it records comparisons"
        return None
    # red or error: a failure without checks (a timeout, an undeclared kernel) is red whatever it records
    if reason in COMPARISON_REASONS and got.n_checks:
        if got.first_failure is None:
            return f"{stored} but no check of it failed"
        if got.first_failure != reason:
            return f"{stored} but its first failing check says {got.first_failure}"
    return None


def tensor_disagreements(cells: Iterable[Mapping[str, Any]]) -> list[tuple[CellKey, str]]:
    """Within one (profile, operator, tier), the accuracy and invariance cells of one direction must compare
    the same tensors: every invariance layout the accuracy cell's set. A check deleted or renamed in one
    record (then re-digested) shows up here."""
    by_unit: dict[tuple[str, str, str], dict[str, Mapping[str, Any]]] = {}
    for raw in cells:
        by_unit.setdefault((raw["profile"], raw["operator"], raw["tier"]), {})[raw["judgment"]] = raw
    out: list[tuple[CellKey, str]] = []
    for judgments in by_unit.values():
        for acc, inv in (
            ("forward_accuracy", "forward_invariance"),
            ("gradient_accuracy", "gradient_invariance"),
        ):
            a, b = judgments.get(acc), judgments.get(inv)
            if a is None or b is None:
                continue
            a_sets = [frozenset(c["tensor"] for c in lr["checks"]) for lr in a["layouts"] if lr["checks"]]
            b_sets = [
                (lr["layout"], frozenset(c["tensor"] for c in lr["checks"]))
                for lr in b["layouts"]
                if lr["checks"]
            ]
            if not a_sets or not b_sets:
                continue
            want = a_sets[0]
            for name, got in b_sets:
                if got != want:
                    out.append(
                        (
                            cell_key_of(b),
                            f"layout {name} compares {', '.join(sorted(got))} but {acc} compares "
                            f"{', '.join(sorted(want))}",
                        )
                    )
                    break
    return out


def op_classes(doc: Mapping[str, Any]) -> dict[str, str | None]:
    """op class by operator, from the evidence's own operator specs (tied to the manifest by its fingerprint)."""
    return {op: spec.get("op_class") for op, spec in doc["axes"]["operator_specs"].items()}
