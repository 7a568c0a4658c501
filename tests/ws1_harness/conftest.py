"""Synthetic evidence for the harness tests, built through the real EvidenceWriter (never hand-written JSON).

The axes and operator specs are small and synthetic; every expected count in the tests is derived from them
through ws1_harness.cells.expected_cells, never hard-coded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ws1_harness.cells import Cell, CellKey, ExpectedCell, expected_cells
from ws1_harness.evidence import Axes, EvidenceHeader, EvidenceWriter, WorkloadRef
from ws1_harness.inventory import DIRECT_ITEMS

JUDGMENTS = ("forward_accuracy", "forward_invariance", "gradient_accuracy", "gradient_invariance")

# One operator of each kind the expected set distinguishes.
OPERATOR_SPECS = {
    "rms_norm": {"op_class": "reduction", "differentiable": True, "optional": False, "layout_only": False},
    "det_gemm": {"op_class": "gemm", "differentiable": True, "optional": False, "layout_only": False},
    "argmax": {"op_class": "reduction", "differentiable": False, "optional": False, "layout_only": False},
    "linear_logp": {"op_class": "logprob", "differentiable": True, "optional": True, "layout_only": False},
    "pack": {"op_class": None, "differentiable": False, "optional": False, "layout_only": True},
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
    workload: str = "synthetic.r1"
    contract: str = "contract-a"
    shard: str | None = None
    overrides: dict[CellKey, tuple[str, str | None] | None] = field(default_factory=dict)
    only: Iterable[CellKey] | None = None
    inventory: bool = True
    inventory_verdicts: dict[str, str] = field(default_factory=dict)

    def axes(self) -> Axes:
        return Axes.build(self.profiles, self.operators, self.tiers, self.judgments, OPERATOR_SPECS)

    def expected(self) -> dict[CellKey, ExpectedCell]:
        return expected_cells(self.profiles, self.operators, self.tiers, self.judgments, OPERATOR_SPECS)


def write_synth(
    path: Path, synth: Synth, *, finalise: bool = True
) -> tuple[EvidenceWriter, dict[CellKey, ExpectedCell]]:
    """Run a fake matrix through EvidenceWriter. `overrides[key] = None` leaves that cell out."""
    header = EvidenceHeader(
        workload=WorkloadRef(
            synth.workload, fingerprint(synth.workload), int(synth.workload.rsplit(".r", 1)[1])
        ),
        contract_fingerprint=fingerprint(synth.contract),
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
