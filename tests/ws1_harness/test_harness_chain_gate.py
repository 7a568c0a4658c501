"""Chain cells in the evidence, the gate and the report (docs/gate.md, "Chain cells"; docs/evidence.md).

Real chain files (the tiny model, one layer, the short tier; written once per module and profile from a clean tree
at the same commit as the session's real matrix file), one per profile the registry knows: every batch-invariant
profile must gate PASS, every stock baseline must be red with its first diverging node named. A profile refused here
for hardware alone is skipped with the registry's reason. Every edit test re-digests what it edits, as a forger
would, so what refuses it is the re-judgment, not the digest.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from commit_support import REAL_COMMIT, stated_commit  # noqa: E402
from profiles_support import BATCH_INVARIANT_PROFILES, STOCK_PROFILES, skip_unless_runs_on  # noqa: E402

from ws1_harness.cli import main  # noqa: E402
from ws1_harness.run.chain import Chain, ChainSettings, output_path, run_chain, write_result  # noqa: E402
from ws1_harness.verdict.evidence import cells_digest, load_evidence, write_evidence_json  # noqa: E402
from ws1_harness.verdict.gate import EXIT_BAD_INPUT, EXIT_PASS, EXIT_RED, gate  # noqa: E402
from ws1_harness.verdict.merge import merge  # noqa: E402
from ws1_harness.verdict.report import render_markdown  # noqa: E402
from ws1_kernels import registry  # noqa: E402


@pytest.fixture(scope="module")
def chain_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Path]]:
    """The chain file of a profile, run the first time a test asks for it (skipped where it needs other hardware)."""
    out = tmp_path_factory.mktemp("chain_gate")
    files: dict[str, Path] = {}

    def get(profile: str) -> Path:
        if profile not in files:
            skip_unless_runs_on(profile, registry.preferred_device(profile, "attention"))
            with stated_commit(REAL_COMMIT):
                chain = Chain(ChainSettings(profile=profile, model="tiny", layers=1, tiers=("short",)))
                path = output_path(out, chain.profile_label, "tiny", 1)
                argv = ["ws1", "chain", "--profile", profile]
                files[profile] = write_result(run_chain(chain), path, argv=argv)
        return files[profile]

    yield get


@pytest.fixture(params=BATCH_INVARIANT_PROFILES)
def green_file(request: pytest.FixtureRequest, chain_file: Callable[[str], Path]) -> Path:
    """The chain file of a profile that promises batch invariance: it must gate PASS."""
    return chain_file(request.param)


@pytest.fixture(params=STOCK_PROFILES)
def red_file(request: pytest.FixtureRequest, chain_file: Callable[[str], Path]) -> Path:
    """The chain file of a stock baseline (batch-variant by design): it must be red."""
    return chain_file(request.param)


def _doc(path: Path) -> dict[str, Any]:
    return copy.deepcopy(json.loads(path.read_text()))


def _redigest(doc: dict[str, Any]) -> dict[str, Any]:
    doc["chain_cells_digest"] = cells_digest(doc["chain_cells"])
    return doc


def _judgment(cell: dict[str, Any], name: str) -> dict[str, Any]:
    return next(j for j in cell["judgments"] if j["name"] == name)


def _codes(result) -> set[str]:  # type: ignore[no-untyped-def]
    return {p.code for p in result.problems}


def test_a_batch_invariant_chain_file_gates_pass(green_file):
    doc = load_evidence(green_file)
    assert doc["cells"] == [] and [c["status"] for c in doc["chain_cells"]] == ["green"]
    result = gate(green_file, require_chain=True)
    assert result.exit_code == EXIT_PASS, result.lines
    assert "chain green=1 red=0" in result.lines[2]
    assert "chain tiny L1" in result.reduced  # never passed off as the full model


def test_a_red_chain_cell_flipped_green_is_refused_by_rejudgment(red_file):
    doc = _doc(red_file)
    assert _codes(gate(copy.deepcopy(doc))) == {"chain_red", "no_green"}  # as written: red, not a mismatch
    cell = doc["chain_cells"][0]
    cell.update(status="green", failed=[], first_divergence=None)
    for j in cell["judgments"]:
        j["passed"] = True
    result = gate(_redigest(doc))
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result), result.lines


def test_a_parity_row_with_a_nonzero_aggregate_is_refused(green_file):
    doc = _doc(green_file)
    assert gate(copy.deepcopy(doc)).exit_code == EXIT_PASS  # negative control: unedited
    row = next(iter(_judgment(doc["chain_cells"][0], "parity")["detail"]["layouts"].values()))
    row["max_abs_dlogp"] = 1e-3  # within the contract's bf16 bound, but parity must be exactly zero
    result = gate(_redigest(doc))
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result), result.lines


def test_a_gradient_flag_set_false_turns_the_cell_red(green_file):
    doc = _doc(green_file)
    rows = _judgment(doc["chain_cells"][0], "gradient_invariance")["detail"]["layouts"]
    flags = next(iter(rows.values()))["bits_equal"]
    flags[next(iter(flags))] = False
    result = gate(_redigest(doc))
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result), result.lines


def _over_gradient_threshold(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Raise one parameter's rel_l2 to twice the contract's chain gradient threshold; (cell, judgment)."""
    cell = doc["chain_cells"][0]
    grad = _judgment(cell, "gradient_accuracy")
    row = next(iter(grad["detail"]["parameters"].values()))
    row["rel_l2"] = 2 * grad["detail"]["thresholds"]["grad_rel_l2"]
    return cell, grad


def test_a_gradient_figure_over_the_threshold_with_passed_kept_is_refused(green_file):
    doc = _doc(green_file)
    _over_gradient_threshold(doc)
    result = gate(_redigest(doc))
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result), result.lines


def test_a_cell_over_the_chain_gradient_thresholds_is_red(green_file):
    doc = _doc(green_file)
    assert gate(copy.deepcopy(doc)).exit_code == EXIT_PASS  # within the thresholds: green
    cell, grad = _over_gradient_threshold(doc)
    name, row = next(iter(grad["detail"]["parameters"].items()))
    row["passed"] = False
    grad["detail"].update(failed=[name], n_failed=1)  # the list the parameters now give
    grad["passed"] = False
    cell.update(
        status="red",
        failed=["gradient_accuracy"],
        first_divergence={"judgment": "gradient_accuracy", "node": None, "note": "whole chain"},
    )
    result = gate(_redigest(doc))
    assert result.exit_code == EXIT_RED and "chain_red" in _codes(result), result.lines
    assert "verdict_mismatch" not in _codes(result)  # consistent records: red on the figures themselves


def test_a_gradient_thresholds_edit_is_refused(green_file):
    doc = _doc(green_file)
    _judgment(doc["chain_cells"][0], "gradient_accuracy")["detail"]["thresholds"]["grad_rel_l2"] = 1.0
    result = gate(_redigest(doc))
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result), result.lines


def test_a_thresholds_edit_is_refused(green_file):
    doc = _doc(green_file)
    _judgment(doc["chain_cells"][0], "logprob_accuracy")["detail"]["thresholds"]["max_abs_dlogp"] = 10.0
    result = gate(_redigest(doc))
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result), result.lines


def test_a_stock_chain_cell_is_red_and_names_its_first_diverging_node(red_file):
    doc = load_evidence(red_file)
    node = doc["chain_cells"][0]["first_divergence"]["node"]
    assert node  # localised
    result = gate(red_file)
    assert result.exit_code == EXIT_RED
    red = [p.message for p in result.problems if p.code == "chain_red"]
    assert len(red) == 1 and node in red[0] and "layer 0" in red[0], red
    md = render_markdown(doc, source="stock")
    assert "## Chain" in md and node in md


def test_the_report_shows_the_chain_table(green_file):
    md = render_markdown(load_evidence(green_file), source="invariant")
    table = md.split("## Chain", 1)[1]
    assert "| packed |" in table and "✅" in table


def test_a_matrix_shard_and_a_chain_shard_merge_and_gate(chain_file, real_evidence, tmp_path):
    (profile,) = load_evidence(real_evidence)["axes"][
        "profiles"
    ]  # the chain shard of the matrix shard's profile
    merged = merge([real_evidence, chain_file(profile)])
    path = write_evidence_json(merged, tmp_path / "all.json")
    doc = load_evidence(path)
    assert [c["shard"] for c in doc["chain_cells"]] == [1]
    assert gate(path, require_chain=True).exit_code == EXIT_PASS
    # negative control: the matrix shard alone has no chain cell for its profile
    alone = gate(real_evidence, require_chain=True)
    assert alone.exit_code == EXIT_RED and "chain_missing" in _codes(alone)


def test_a_merged_chain_cell_edited_is_refused(red_file, real_evidence):
    merged = merge([real_evidence, red_file])
    assert gate(copy.deepcopy(merged)).exit_code == EXIT_RED
    merged["chain_cells"][0]["status"] = "green"
    assert gate(merged).exit_code == EXIT_BAD_INPUT  # the merged digest no longer matches


def test_a_schema_invalid_chain_cell_is_bad_input(green_file, tmp_path, capsys):
    doc = _doc(green_file)
    del doc["chain_cells"][0]["stock"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_redigest(doc)))
    assert main(["gate", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "chain_cells" in err[0], err


def test_a_run_short_of_a_tier_it_names_is_red(green_file):
    """A tier's cell deleted (digest recomputed): the run's own settings still name it, so the file is red."""
    assert gate(_doc(green_file)).exit_code == EXIT_PASS  # the control: one tier named, one held
    doc = _doc(green_file)
    doc["chain_cells"][0]["settings"]["tiers"] = ["short", "primary"]
    result = gate(_redigest(doc))
    assert result.exit_code == EXIT_RED and "chain_incomplete" in _codes(result)
    assert any("names tiers ['short', 'primary']" in p.message for p in result.problems)


@pytest.mark.parametrize("judgment", ["parity", "logprob_accuracy"])
def test_a_deleted_within_contract_flag_is_refused(green_file, judgment):
    doc = _doc(green_file)
    detail = _judgment(doc["chain_cells"][0], judgment)["detail"]
    row = detail["layouts"]["packed"] if judgment == "parity" else detail
    del row["within_contract"]
    result = gate(_redigest(doc))
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result)


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda d: d.update(failed=["model.norm.weight"]), id="failed-list"),
        pytest.param(lambda d: d.update(n_failed=1), id="n_failed"),
        pytest.param(lambda d: d.pop("failed"), id="failed-deleted"),
    ],
)
def test_a_gradient_failed_list_that_contradicts_the_parameters_is_refused(green_file, edit):
    doc = _doc(green_file)
    edit(_judgment(doc["chain_cells"][0], "gradient_accuracy")["detail"])
    result = gate(_redigest(doc))
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result)
