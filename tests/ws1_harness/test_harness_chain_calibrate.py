"""ci/calibrate_chain.py: the calibration of the contract's chain thresholds (docs/chain.md, "Calibration").

In process, on the tiny model's short tier (one layer, one seed) for the measurement, and on hand-made figures for
the contract writer: a run short of the contract's rule for a calibrated record must leave the contract unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from repo_scripts import load_repo_script

pytest.importorskip("transformers")

from ws1_contract import load_contract  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _script():
    return load_repo_script("ci/calibrate_chain.py", "calibrate_chain_under_test")


CAL = _script()
FIGURES = {
    "max_abs_dlogp": 0.04,
    "approx_kl0": 5e-5,
    "clipfrac0": 0.0,
    "grad_rel_l2": 0.03,
    "grad_rel_max_abs": 0.06,
}


@pytest.fixture
def contract_copy(tmp_path: Path) -> Path:
    target = tmp_path / "tolerance.json"
    shutil.copy(ROOT / "contracts" / "tolerance.json", target)
    return target


def test_measurement_records_every_aggregate_and_parameter(tmp_path):
    m = CAL.measure(["portable_cpu"], "tiny", 1, ["short"], 1, None)
    assert set(m["pooled"]) == {*CAL.LOGPROB, *CAL.GRADIENT}
    (run,) = m["runs"]
    assert run["active_tokens"] == m["active_tokens"] > 0
    assert len(m["pooled"]["grad_rel_l2"]) == len(run["gradients"]) > 0  # one figure per parameter
    summary = CAL.summarise(m["pooled"])
    for key, entry in summary.items():
        assert entry["median"] <= entry["p99"] <= entry["max"], key
        assert entry["threshold"] >= min(1.0, CAL.multiple(key) * entry["max"]), key


def test_write_contract_calibrates_with_enough_tokens_and_seeds(contract_copy):
    CAL.write_contract(contract_copy, FIGURES, "test source", "2026-12-03", 4096, 3)
    th = load_contract(contract_copy).aggregates("bf16")
    assert (th.max_abs_dlogp, th.grad_rel_l2, th.grad_rel_max_abs) == (0.04, 0.03, 0.06)
    assert th.calibration is not None and th.calibration.status == "calibrated"
    assert (th.calibration.active_tokens, th.calibration.seeds) == (4096, 3)


@pytest.mark.parametrize("tokens, seeds", [(4095, 3), (4096, 2)])
def test_write_contract_refuses_a_short_run(contract_copy, tokens, seeds, capsys):
    before = contract_copy.read_bytes()
    with pytest.raises(SystemExit) as exc:
        CAL.write_contract(contract_copy, FIGURES, "test source", "2026-12-03", tokens, seeds)
    assert exc.value.code == 2 and "short of a calibrated record" in capsys.readouterr().err
    assert contract_copy.read_bytes() == before


def test_write_contract_refuses_figures_the_contract_cannot_hold(contract_copy, capsys):
    before = contract_copy.read_bytes()
    with pytest.raises(SystemExit) as exc:
        CAL.write_contract(contract_copy, {**FIGURES, "clipfrac0": 2.0}, "s", "2026-12-03", 5000, 4)
    assert exc.value.code == 2 and "would be invalid" in capsys.readouterr().err
    assert contract_copy.read_bytes() == before


def test_combine_takes_the_loosest_figure(tmp_path, contract_copy):
    files = []
    for i, scale in enumerate((1.0, 2.0)):
        doc = {
            "command": f"run {i}",
            "date": "2026-12-03",
            "device": {"name": f"dev{i}"},
            "active_tokens": 2500,
            "seeds": 4,
            "summary": {k: {"max": v * scale / CAL.multiple(k)} for k, v in FIGURES.items()},
        }
        files.append(tmp_path / f"c{i}.json")
        files[-1].write_text(json.dumps(doc))
    assert CAL.combine(files, contract_copy) == 0
    th = load_contract(contract_copy).aggregates("bf16")
    assert th.grad_rel_l2 == 0.06 and th.calibration.active_tokens == 5000


def test_write_contract_caps_max_abs_dlogp_at_the_clip_interval(contract_copy):
    """4x the measured figure may exceed ln(1.2): the bound is capped there (and says so), never written above."""
    CAL.write_contract(contract_copy, {**FIGURES, "max_abs_dlogp": 0.26}, "src", "2026-12-03", 5000, 4, 0.064)
    th = load_contract(contract_copy).aggregates("bf16")
    assert th.max_abs_dlogp == 0.18 and "capped at 0.18" in th.calibration.source


def test_write_contract_refuses_a_correct_chain_that_already_clips(contract_copy, capsys):
    before = contract_copy.read_bytes()
    with pytest.raises(SystemExit) as exc:
        CAL.write_contract(contract_copy, {**FIGURES, "max_abs_dlogp": 0.9}, "s", "2026-12-03", 5000, 4, 0.2)
    assert exc.value.code == 2 and "clip interval allows" in capsys.readouterr().err
    assert contract_copy.read_bytes() == before


def test_gradient_figures_take_the_smaller_multiple():
    """One value per run and parameter: twice the largest, so a gradient 10 % off stays above the bound."""
    assert CAL.threshold([0.0488], "grad_rel_l2") == 0.098 < 0.1
    assert CAL.threshold([0.0488], "max_abs_dlogp") == 0.2
