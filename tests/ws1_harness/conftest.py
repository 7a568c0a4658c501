"""Synthetic evidence for the harness tests, built through the real EvidenceWriter (never hand-written JSON).

The axes are small; every expected count in the tests is derived from them through
ws1_harness.verdict.cells.expected_cells, never hard-coded. The evidence names the shipped contract and manifest (the
gate refuses any other), its operator specs are the manifest's, and each green cell carries the passing checks
the gate re-judges it from: one per manifest layout its judgment compares, with the contract's thresholds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ws1_harness.verdict.cells import Cell, CellKey, ExpectedCell, LayoutResult, check_record, expected_cells
from ws1_harness.verdict.evidence import Axes, EvidenceHeader, EvidenceWriter, WorkloadRef
from ws1_harness.verdict.inventory import DIRECT_ITEMS, node_verdicts
from ws1_harness.verdict.rejudge import shipped_reference

JUDGMENTS = ("forward_accuracy", "forward_invariance", "gradient_accuracy", "gradient_invariance")

# Operators of each kind the manifest distinguishes (required, optional, layout-only), with its own specs.
OPERATOR_SPECS = {
    name: shipped_reference().manifest.operators[name].to_json()
    for name in ("rms_norm", "det_gemm", "linear_logp", "pack")
}


# the tests write their synthetic evidence on the host, so the cells say they ran there (the gate checks it)
SYNTH_DEVICE = {"type": "cpu", "name": "cpu", "capability": None}


def fingerprint(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


StatusFn = Callable[[ExpectedCell], "tuple[str, str | None] | None"]


def default_status(exp: ExpectedCell) -> tuple[str, str | None]:
    """What a healthy run reports: green, or na with the reason the cell demands."""
    return ("na", exp.na_reason) if exp.na_reason else ("green", None)


@dataclass
class Synth:
    """Parameters of one synthetic run."""

    profiles: tuple[str, ...] = ("portable_cpu",)
    operators: tuple[str, ...] = tuple(OPERATOR_SPECS)
    tiers: tuple[str, ...] = ("short", "primary")
    judgments: tuple[str, ...] = JUDGMENTS
    # None: the shipped manifest and contract; a string: a made-up one of that name (the gate refuses it)
    workload: str | None = None
    contract: str | None = None
    shard: str | None = None
    overrides: dict[CellKey, tuple[str, str | None] | None] = field(default_factory=dict)
    only: Iterable[CellKey] | None = None
    inventory: bool = True
    inventory_verdicts: dict[str, str] = field(default_factory=dict)

    def axes(self) -> Axes:
        return Axes.build(self.profiles, self.operators, self.tiers, self.judgments, OPERATOR_SPECS)

    def expected(self) -> dict[CellKey, ExpectedCell]:
        return expected_cells(self.profiles, self.operators, self.tiers, self.judgments, OPERATOR_SPECS)


def passing_layouts(key: CellKey) -> tuple[LayoutResult, ...]:
    """What a green cell records: a passing check per tensor on every layout the manifest makes its judgment
    compare, in the mode and with the thresholds the shipped contract gives it."""
    ref = shipped_reference()
    op_class = OPERATOR_SPECS[key.operator]["op_class"]
    if op_class is None:
        return ()  # a layout-only operator: nothing to compare (a green one is red at the gate)
    mode, atol, rtol = ref.rule(key.judgment, op_class)
    tensors = ("output",) if key.judgment.startswith("forward") else ("d_x", "d_weight")
    compared = ref.manifest.compared_layouts(key.judgment)
    figures = {"n_total": 64, "n_mismatch": 0, "n_non_finite_mismatch": 0, "atol": atol, "rtol": rtol}
    comparison = {"passed": True, "reason_code": None, "diagnostics": figures}
    return tuple(
        LayoutResult(lay.name, True, None, {}, tuple(check_record(t, mode, comparison) for t in tensors))
        for lay in ref.manifest.layouts
        if lay.name in compared
    )


def write_synth(
    path: Path, synth: Synth, *, finalise: bool = True
) -> tuple[EvidenceWriter, dict[CellKey, ExpectedCell]]:
    """Run a fake matrix through EvidenceWriter. `overrides[key] = None` leaves that cell out."""
    ref = shipped_reference()
    if synth.workload is None:
        man = ref.manifest
        workload = WorkloadRef(man.workload_id, man.fingerprint, man.revision)
    else:
        workload = WorkloadRef(
            synth.workload, fingerprint(synth.workload), int(synth.workload.rsplit(".r", 1)[1])
        )
    header = EvidenceHeader(
        workload=workload,
        contract_fingerprint=(
            ref.contract.fingerprint if synth.contract is None else fingerprint(synth.contract)
        ),
        command="ws1 matrix --profile synthetic",
        axes=synth.axes(),
        shard=synth.shard,
    )
    writer = EvidenceWriter(path, header, argv=["ws1", "matrix", "--profile", "synthetic"])
    expected = synth.expected()
    keys = list(expected) if synth.only is None else list(synth.only)
    for key in keys:
        exp = expected[key]
        outcome = synth.overrides.get(key, default_status(exp))
        if outcome is None:
            continue
        status, reason = outcome
        writer.write_cell(
            Cell(
                key=key,
                status=status,
                reason_code=reason,
                required=exp.required,
                diagnostics={"note": "synthetic"},
                observed_kernels=("ws1.synthetic.kernel",) if status == "green" else (),
                wall_s=0.01,
                layouts=passing_layouts(key) if status == "green" else (),
                device=SYNTH_DEVICE,
            )
        )
    if synth.inventory and finalise:
        writer.set_inventory(
            [
                {
                    "profile": profile,
                    "item": item,
                    "verdict": synth.inventory_verdicts.get(item, "pass"),
                    "source": "direct",
                    "detail": "synthetic",
                }
                for profile in synth.profiles
                for item in DIRECT_ITEMS
            ]
            # the chain-node items are what the cells say, as the matrix writer derives them (the gate checks it)
            + [
                {"profile": profile, **verdict.to_json()}
                for profile in synth.profiles
                for verdict in node_verdicts(writer.cells, profile).values()
            ]
        )
    if finalise:
        writer.finalise()
    else:
        writer.close()
    return writer, expected


@pytest.fixture
def evidence_dir(tmp_path: Path) -> Path:
    d = tmp_path / "evidence"
    d.mkdir()
    return d


@dataclass(frozen=True)
class Factory:
    """The helpers above, handed to tests as a fixture (no `import conftest`, which is ambiguous)."""

    dir: Path
    Synth: type = Synth
    judgments: tuple[str, ...] = JUDGMENTS
    operator_specs: dict = field(default_factory=lambda: OPERATOR_SPECS)

    def write(self, name: str, synth: Synth | None = None, *, finalise: bool = True):
        return write_synth(self.dir / f"{name}.json", synth or Synth(), finalise=finalise)

    @staticmethod
    def fingerprint(text: str) -> str:
        return fingerprint(text)

    @staticmethod
    def redigest(doc: dict) -> dict:
        """Recompute every cells digest of an edited document, as a forger covering an edit would."""
        from ws1_harness.verdict.evidence import cells_digest, shard_cells

        doc["cells_digest"] = cells_digest(doc["cells"])
        for i, entry in enumerate(doc["shards"]):
            entry["cells_digest"] = cells_digest(shard_cells(doc["cells"], i))
        return doc


@pytest.fixture
def factory(evidence_dir: Path) -> Factory:
    return Factory(evidence_dir)


@pytest.fixture(scope="session")
def contract():
    from ws1_contract import load_contract

    return load_contract()


@pytest.fixture(scope="session")
def forward_spec(contract):
    """Thresholds come only from the contract's resolver (no test-private tolerance)."""
    return contract.resolve("forward_accuracy", "elementwise", "bf16")


@pytest.fixture(scope="session")
def bitwise_spec(contract):
    return contract.resolve("forward_invariance", "elementwise", "bf16")


from commit_support import REAL_COMMIT, stated_commit  # noqa: E402


@pytest.fixture(scope="session")
def real_evidence(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real finalised evidence file, written once per session by `ws1 matrix` in this process: portable_cpu,
    tiny widths, rms_norm and det_gemm, default tiers (16 green cells), from a clean tree at REAL_COMMIT."""

    from ws1_harness import cli

    out = tmp_path_factory.mktemp("real_evidence")
    with stated_commit(REAL_COMMIT):
        argv = [
            "matrix",
            "--profile",
            "portable_cpu",
            "--model",
            "tiny",
            "--op",
            "rms_norm",
            "--op",
            "det_gemm",
        ]
        code = cli.main([*argv, "--in-process", "--out", str(out)])
    path = out / "portable_cpu.json"
    assert code == 0 and path.is_file(), code
    return path
