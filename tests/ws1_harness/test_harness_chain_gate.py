"""Chain cells in the evidence, the gate and the report (docs/gate.md, "Chain cells"; docs/evidence.md).

Two real chain files (the tiny model, one layer, the short tier; written once per module from a clean tree at the
same commit as the session's real matrix file): portable_cpu, which must gate PASS, and native_torch, the stock
baseline, which must be red with its first diverging node named. Every edit test re-digests what it edits, as a
forger would, so what refuses it is the re-judgment, not the digest.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from commit_support import REAL_COMMIT, stated_commit  # noqa: E402

from ws1_harness.chain import Chain, ChainSettings, output_path, run_chain, write_result  # noqa: E402
from ws1_harness.cli import main  # noqa: E402
from ws1_harness.evidence import cells_digest, load_evidence, write_evidence_json  # noqa: E402
from ws1_harness.gate import EXIT_BAD_INPUT, EXIT_PASS, EXIT_RED, gate  # noqa: E402
from ws1_harness.merge import merge  # noqa: E402
from ws1_harness.report import render_markdown  # noqa: E402


@pytest.fixture(scope="module")
def chain_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    out = tmp_path_factory.mktemp("chain_gate")
    with stated_commit(REAL_COMMIT):
        files = {}
        for profile in ("portable_cpu", "native_torch"):
            chain = Chain(ChainSettings(profile=profile, model="tiny", layers=1, tiers=("short",)))
            result = run_chain(chain)
            path = output_path(out, chain.profile_label, "tiny", 1)
            files[profile] = write_result(result, path, argv=["ws1", "chain", "--profile", profile])
    yield files


def _doc(path: Path) -> dict[str, Any]:
    return copy.deepcopy(json.loads(path.read_text()))


def _redigest(doc: dict[str, Any]) -> dict[str, Any]:
    doc["chain_cells_digest"] = cells_digest(doc["chain_cells"])
    return doc


def _judgment(cell: dict[str, Any], name: str) -> dict[str, Any]:
    return next(j for j in cell["judgments"] if j["name"] == name)


def _codes(result) -> set[str]:  # type: ignore[no-untyped-def]
    return {p.code for p in result.problems}


def test_a_passing_portable_chain_file_gates_pass(chain_files):
    doc = load_evidence(chain_files["portable_cpu"])
    assert doc["cells"] == [] and [c["status"] for c in doc["chain_cells"]] == ["green"]
    result = gate(chain_files["portable_cpu"], require_chain=True)
    assert result.exit_code == EXIT_PASS, result.lines
    assert "chain green=1 red=0" in result.lines[2]
    assert "chain tiny L1" in result.reduced  # never passed off as the full model


def test_a_red_chain_cell_flipped_green_is_refused_by_rejudgment(chain_files):
    doc = _doc(chain_files["native_torch"])
    assert _codes(gate(copy.deepcopy(doc))) == {"chain_red", "no_green"}  # as written: red, not a mismatch
    cell = doc["chain_cells"][0]
    cell.update(status="green", failed=[], first_divergence=None)
    for j in cell["judgments"]:
        j["passed"] = True
    result = gate(_redigest(doc))
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result), result.lines


def test_a_parity_row_with_a_nonzero_aggregate_is_refused(chain_files):
    doc = _doc(chain_files["portable_cpu"])
    assert gate(copy.deepcopy(doc)).exit_code == EXIT_PASS  # negative control: unedited
    row = next(iter(_judgment(doc["chain_cells"][0], "parity")["detail"]["layouts"].values()))
    row["max_abs_dlogp"] = 1e-3  # within the contract's bf16 bound, but parity must be exactly zero
    result = gate(_redigest(doc))
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result), result.lines


def test_a_gradient_flag_set_false_turns_the_cell_red(chain_files):
    doc = _doc(chain_files["portable_cpu"])
    rows = _judgment(doc["chain_cells"][0], "gradient_invariance")["detail"]["layouts"]
    flags = next(iter(rows.values()))["bits_equal"]
    flags[next(iter(flags))] = False
    result = gate(_redigest(doc))
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result), result.lines


def test_a_thresholds_edit_is_refused(chain_files):
    doc = _doc(chain_files["portable_cpu"])
    _judgment(doc["chain_cells"][0], "logprob_accuracy")["detail"]["thresholds"]["max_abs_dlogp"] = 10.0
    result = gate(_redigest(doc))
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result), result.lines


def test_a_native_chain_cell_is_red_and_names_its_first_diverging_node(chain_files):
    doc = load_evidence(chain_files["native_torch"])
    node = doc["chain_cells"][0]["first_divergence"]["node"]
    assert node  # localised
    result = gate(chain_files["native_torch"])
    assert result.exit_code == EXIT_RED
    red = [p.message for p in result.problems if p.code == "chain_red"]
    assert len(red) == 1 and node in red[0] and "layer 0" in red[0], red
    md = render_markdown(doc, source="native")
    assert "## Chain" in md and node in md


def test_the_report_shows_the_chain_table(chain_files):
    md = render_markdown(load_evidence(chain_files["portable_cpu"]), source="portable")
    table = md.split("## Chain", 1)[1]
    assert "| packed |" in table and "✅" in table


def test_a_matrix_shard_and_a_chain_shard_merge_and_gate(chain_files, real_evidence, tmp_path):
    merged = merge([real_evidence, chain_files["portable_cpu"]])
    path = write_evidence_json(merged, tmp_path / "all.json")
    doc = load_evidence(path)
    assert [c["shard"] for c in doc["chain_cells"]] == [1]
    assert gate(path, require_chain=True).exit_code == EXIT_PASS
    # negative control: the matrix shard alone has no chain cell for its profile
    alone = gate(real_evidence, require_chain=True)
    assert alone.exit_code == EXIT_RED and "chain_missing" in _codes(alone)


def test_a_merged_chain_cell_edited_is_refused(chain_files, real_evidence):
    merged = merge([real_evidence, chain_files["native_torch"]])
    assert gate(copy.deepcopy(merged)).exit_code == EXIT_RED
    merged["chain_cells"][0]["status"] = "green"
    assert gate(merged).exit_code == EXIT_BAD_INPUT  # the merged digest no longer matches


def test_a_schema_invalid_chain_cell_is_bad_input(chain_files, tmp_path, capsys):
    doc = _doc(chain_files["portable_cpu"])
    del doc["chain_cells"][0]["stock"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_redigest(doc)))
    assert main(["gate", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "chain_cells" in err[0], err
