"""One unit of matrix work, runnable in this process or in a worker: resolve, execute, judge.

A task names (profile, operator, tier, model); its result is one record per judgment, plain JSON so that it
crosses a process boundary. Everything a task needs is loaded from the manifest and contract by name, so a
task run alone sees exactly the data it sees inside the full sweep; nothing depends on its position in a list.
"""

from __future__ import annotations

import traceback
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

from ws1_contract import Contract, load_contract
from ws1_harness.run.adapters import OperatorAdapter, build_adapters
from ws1_harness.run.unit import JUDGMENTS, CandidateUnderTest, run_unit
from ws1_kernels import reference, registry
from ws1_workload import Manifest, build_fixture, load_manifest

FULL_MODEL = "qwen3-8b"


@dataclass(frozen=True)
class UnitTask:
    """The coordinates of one unit and where its inputs come from."""

    profile: str
    operator: str
    tier: str
    model: str = FULL_MODEL
    candidates: str | None = None  # plug-in spec "module:attr"
    manifest_path: str | None = None
    contract_path: str | None = None
    device: str = (
        "auto"  # "auto" (the candidate's device; CUDA for device-agnostic ones when present), "cpu", "cuda"
    )
    arch_label: str | None = (
        None  # "sm90", "sm86-proxy": labels the profile of a GPU run (`native_torch@sm90`)
    )

    @property
    def profile_label(self) -> str:
        """The profile as evidence names it: with its arch on a GPU, so shards of two archs never collide."""
        return self.profile if self.arch_label is None else f"{self.profile}@{self.arch_label}"

    @property
    def tier_label(self) -> str:
        """Reduced widths are their own tier: `primary` at full width, `primary@tiny` otherwise."""
        return self.tier if self.model == FULL_MODEL else f"{self.tier}@{self.model}"

    @property
    def case_id(self) -> str:
        return f"{self.operator}/{self.tier}/{self.model}"

    @property
    def param_case(self) -> str:
        """Parameters belong to the model, not to the tier: one weight per (operator, model)."""
        return f"{self.operator}/{self.model}"


@dataclass
class TaskRecord:
    """One judgment's outcome, ready for the evidence writer."""

    profile: str
    operator: str
    tier: str
    judgment: str
    status: str
    reason_code: str | None
    diagnostics: dict[str, Any]
    observed_kernels: list[str]
    observed_ops: list[str]
    wall_s: float
    layouts: list[dict[str, Any]] = field(default_factory=list)
    device: dict[str, Any] | None = None


@lru_cache(maxsize=4)
def _manifest(path: str | None) -> Manifest:
    return load_manifest(path)


@lru_cache(maxsize=4)
def _contract(path: str | None) -> Contract:
    return load_contract(path)


@lru_cache(maxsize=8)
def _adapters(manifest_path: str | None, model: str) -> dict[str, OperatorAdapter]:
    return build_adapters(_manifest(manifest_path).model(model))


_loaded_plugins: set[str] = set()


def load_plugin(spec: str | None) -> None:
    """Register a plug-in profile once per process (the worker and the parent each load it).

    A plug-in that calls `sys.exit` on import is a broken plug-in, reported as such (RuntimeError, which every
    caller turns into one bad-input line): it once made `ws1 matrix` exit 3, "pending only", silently."""
    if spec and spec not in _loaded_plugins:
        try:
            registry.load_spec(spec)
        except SystemExit as exc:
            raise RuntimeError(f"the module called sys.exit({exc.code!r}) on import") from None
        _loaded_plugins.add(spec)


def _records(
    task: UnitTask, status: str, reason: str, diagnostics: dict[str, Any], wall: float = 0.0
) -> list[TaskRecord]:
    return [
        TaskRecord(
            task.profile_label,
            task.operator,
            task.tier_label,
            j,
            status,
            reason,
            dict(diagnostics),
            [],
            [],
            wall,
        )
        for j in JUDGMENTS
    ]


def run_device(task: UnitTask) -> str:
    """The device a unit executes on: the one the run names, else the candidate's own (registry)."""
    if task.device != "auto":
        return task.device
    return registry.preferred_device(task.profile, task.operator)


def execute_task(task: UnitTask) -> list[dict[str, Any]]:
    """Run one unit; never raises for a candidate's failure: that is a red or error record."""
    manifest = _manifest(task.manifest_path)
    contract = _contract(task.contract_path)
    load_plugin(task.candidates)
    op_spec = manifest.operators[task.operator]
    if op_spec.layout_only:
        return [
            asdict(r) for r in _records(task, "na", "layout_only", {"why": "layout helper, no arithmetic"})
        ]
    device = run_device(task)
    try:
        cand = registry.resolve(task.profile, task.operator, device=device)
    except registry.CandidateUnavailable as exc:
        if exc.hardware_only:
            status, reason = "pending_arch", "arch_unavailable"
        elif op_spec.optional and task.operator not in registry.candidates(task.profile):
            # an optional node (linear_logp) the profile registers no candidate for: an explained na; a
            # candidate that exists but cannot run stays red below
            status, reason = "na", "optional_not_provided"
        else:
            status, reason = "red", "candidate_unavailable"
        return [asdict(r) for r in _records(task, status, reason, {"why": str(exc)})]
    # the registry's candidate is what runs, so its kernel ids are the declaration
    under_test = CandidateUnderTest(
        candidate_id=cand.candidate_id,
        fn=cand.fn,
        reference=reference.of(task.operator),
        declared_kernels=cand.all_kernel_ids,
        declared_ops=frozenset(cand.declared_ops),
        param_grad_rule=cand.param_grad_rule,
        stock=cand.stock,
    )
    adapter = _adapters(task.manifest_path, task.model)[task.operator]
    fixture = build_fixture(manifest, task.tier, task.model)  # V-1 is the model's last token id
    model = manifest.model(task.model)
    try:
        result = run_unit(
            under_test,
            adapter,
            fixture,
            manifest.layouts,
            contract,
            op_spec.op_class,
            case_id=task.case_id,
            param_case=task.param_case,
            pad_id=model.pad_id,
            differentiable=op_spec.differentiable,
            device=device,
        )
    except Exception as exc:  # a candidate crash is an error cell, and the sweep goes on
        where = traceback.extract_tb(exc.__traceback__)[-1]
        msg = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return [
            asdict(r)
            for r in _records(
                task, "error", "exception", {"why": msg, "at": f"{where.filename}:{where.lineno}"}
            )
        ]
    unit_diag: dict[str, Any] = {"candidate_id": cand.candidate_id}
    if result.peak_device_bytes is not None:
        unit_diag["peak_device_bytes"] = result.peak_device_bytes
    if result.phases_s:
        unit_diag["phases_s"] = dict(result.phases_s)  # free-form, never read by the gate
    records = []
    for j in JUDGMENTS:
        jr = result.judgments[j]
        records.append(
            TaskRecord(
                task.profile_label,
                task.operator,
                task.tier_label,
                j,
                jr.status,
                jr.reason_code,
                {**jr.diagnostics, **unit_diag},
                result.observed_kernels,
                result.observed_ops,
                result.wall_s,
                jr.layouts,
                result.device,
            )
        )
    return [asdict(r) for r in records]


def timeout_records(task: UnitTask, limit_s: float) -> list[dict[str, Any]]:
    """The records of a unit that outlived its time limit: red `timeout`, never a silent gap."""
    return [asdict(r) for r in _records(task, "red", "timeout", {"limit_s": limit_s}, wall=limit_s)]


def crash_records(task: UnitTask, why: str) -> list[dict[str, Any]]:
    """The records of a unit whose worker died (segfault, out of memory): error, counted as red."""
    return [asdict(r) for r in _records(task, "error", "exception", {"why": f"worker died: {why}"})]
