"""The gate re-judges what it reads instead of trusting it: one property per test, each with the edit that breaks
it and the untouched (or consistently edited) evidence as its negative control.

The real evidence comes from the session fixture `real_evidence` (a tiny in-process `ws1 matrix` run); merged
files from the synthetic factory. Edits that touch cells are re-digested (`factory.redigest`), as a forger
would, so each test exercises the re-judgment and not only the digest.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from commit_support import REAL_COMMIT  # noqa: E402

from ws1_harness import cli
from ws1_harness.verdict.evidence import write_evidence_json
from ws1_harness.verdict.gate import EXIT_BAD_INPUT, EXIT_PASS, EXIT_RED, gate
from ws1_harness.verdict.merge import merge


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _codes(result) -> set[str]:
    return {p.code for p in result.problems}


def _cell(doc: dict, judgment: str) -> dict:
    return next(c for c in doc["cells"] if c["judgment"] == judgment and c["status"] == "green")


def _fail_first_check(cell: dict) -> None:
    """Make the first layout's first check a genuine failure (its figures say so) and the layout with it."""
    layout = cell["layouts"][0]
    check = layout["checks"][0]
    reason = "bits_differ" if check["mode"] == "bitwise" else "tolerance_exceeded"
    check.update(passed=False, reason_code=reason, n_mismatch=3)
    layout.update(passed=False, reason_code=reason)


def _recount(doc: dict) -> None:
    from ws1_harness.verdict.evidence import counts_of

    doc["counts"] = counts_of(doc["cells"])


# ---------------------------------------------------------------------------------------------- re-judgment


def test_real_evidence_passes_as_written(real_evidence: Path) -> None:
    """Negative control for every edit below: the file as `ws1 matrix` wrote it passes."""
    result = gate(real_evidence, expect_commit=REAL_COMMIT, require_clean=True)
    assert result.exit_code == EXIT_PASS, result.lines


@pytest.mark.parametrize("judgment", ["forward_invariance", "gradient_accuracy"])
def test_red_cell_flipped_to_green_is_refused(real_evidence: Path, factory, judgment: str) -> None:
    doc = _load(real_evidence)
    cell = _cell(doc, judgment)
    _fail_first_check(cell)
    cell.update(status="red", reason_code=cell["layouts"][0]["reason_code"])
    _recount(doc)
    honest = gate(factory.redigest(copy.deepcopy(doc)), source="honest")
    assert honest.exit_code == EXIT_RED and "verdict_mismatch" not in _codes(honest), honest.lines

    cell.update(status="green", reason_code=None)  # the forgery: status flipped, counts recomputed
    _recount(doc)
    result = gate(factory.redigest(doc), source="forged")
    assert result.exit_code == EXIT_RED
    key = f"{cell['profile']}/{cell['operator']}/{cell['tier']}/{judgment}"
    assert any(p.code == "verdict_mismatch" and p.message.startswith(key) for p in result.problems)


def test_layout_result_that_contradicts_its_checks_is_refused(real_evidence: Path, factory) -> None:
    doc = _load(real_evidence)
    cell = _cell(doc, "forward_invariance")
    cell["layouts"][0]["checks"][0].update(passed=False, reason_code="bits_differ", n_mismatch=1)
    result = gate(factory.redigest(doc), source="edited")  # the layout and the cell still say passed
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result)


def test_thresholds_other_than_the_contracts_are_refused(real_evidence: Path, factory) -> None:
    doc = _load(real_evidence)
    check = _cell(doc, "forward_accuracy")["layouts"][0]["checks"][0]
    check["atol"] = check["atol"] * 10  # a looser bound than the contract's: the same figures would pass
    result = gate(factory.redigest(doc), source="edited")
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result)
    assert "not the contract's" in "\n".join(result.lines)


def test_green_cell_missing_a_layout_of_the_manifest_is_refused(real_evidence: Path, factory) -> None:
    doc = _load(real_evidence)
    cell = _cell(doc, "forward_invariance")
    dropped = cell["layouts"].pop()["layout"]
    result = gate(factory.redigest(doc), source="edited")
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result)
    assert f"missing {dropped}" in "\n".join(result.lines)


def test_green_cell_without_checks_is_refused(real_evidence: Path, factory) -> None:
    doc = _load(real_evidence)
    _cell(doc, "gradient_accuracy")["layouts"] = []
    result = gate(factory.redigest(doc), source="edited")
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result)


def test_required_flag_is_checked_against_the_spec(real_evidence: Path, factory) -> None:
    doc = _load(real_evidence)
    _cell(doc, "forward_accuracy")["required"] = False
    result = gate(factory.redigest(doc), source="edited")
    assert result.exit_code == EXIT_RED and "required_mismatch" in _codes(result)


def test_flipped_cell_in_a_merged_file_is_refused(factory, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WS1_SOURCE_COMMIT", "d" * 40)
    monkeypatch.setenv("WS1_SOURCE_DIRTY", "0")
    keys = list(factory.Synth().expected())
    paths = [
        factory.write(name, factory.Synth(only=part))[0].path
        for name, part in (("a", keys[: len(keys) // 2]), ("b", keys[len(keys) // 2 :]))
    ]
    merged = merge(paths, command="ws1 merge a b")
    out = write_evidence_json(merged, tmp_path / "merged.json")
    assert gate(out).exit_code == EXIT_PASS  # negative control
    doc = _load(out)
    cell = next(c for c in doc["cells"] if c["shard"] == 1 and c["judgment"] == "gradient_invariance")
    _fail_first_check(cell)  # its records now say red; its status still says green
    result = gate(factory.redigest(doc), source="merged")
    assert result.exit_code == EXIT_RED and "verdict_mismatch" in _codes(result)


# ---------------------------------------------------------------------------------------------- fingerprints


@pytest.mark.parametrize(
    ("field", "code", "words"),
    [
        (("contract", "fingerprint"), "contract_mismatch", "contract fingerprint"),
        (("workload", "fingerprint"), "workload_mismatch", "workload fingerprint"),
    ],
)
def test_zeroed_fingerprint_is_red_and_named(real_evidence: Path, field, code: str, words: str) -> None:
    doc = _load(real_evidence)
    doc[field[0]][field[1]] = "sha256:" + "0" * 64
    result = gate(doc, source="zeroed")
    assert result.exit_code == EXIT_RED and _codes(result) == {code}
    assert words in "\n".join(result.lines)


def test_operator_spec_other_than_the_manifests_is_red(real_evidence: Path) -> None:
    doc = _load(real_evidence)
    doc["axes"]["operator_specs"]["rms_norm"]["op_class"] = "elementwise"
    result = gate(doc, source="edited")
    assert result.exit_code == EXIT_RED and "workload_mismatch" in _codes(result)


def test_gate_options_name_the_contract_and_manifest(real_evidence: Path, tmp_path: Path, capsys) -> None:
    from ws1_harness.verdict.rejudge import packaged_manifest_path

    root = Path(__file__).resolve().parents[2]
    same_contract = tmp_path / "same.json"
    same_contract.write_bytes((root / "contracts" / "tolerance.json").read_bytes())
    same_manifest = tmp_path / "same.yaml"
    same_manifest.write_bytes(packaged_manifest_path().read_bytes())
    args = ["gate", str(real_evidence), "--contract", str(same_contract), "--manifest", str(same_manifest)]
    assert cli.main(args) == EXIT_PASS  # negative control: the same documents, other paths

    other = json.loads(same_contract.read_text())
    other["description"] += " (edited)"
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert cli.main(["gate", str(real_evidence), "--contract", str(tmp_path / "other.json")]) == EXIT_RED
    assert "contract fingerprint" in capsys.readouterr().out

    (tmp_path / "other.yaml").write_text(
        same_manifest.read_text().replace("description:", "description: x", 1)
    )
    assert cli.main(["gate", str(real_evidence), "--manifest", str(tmp_path / "other.yaml")]) == EXIT_RED
    assert "workload fingerprint" in capsys.readouterr().out

    assert (
        cli.main(["gate", str(real_evidence), "--manifest", str(tmp_path / "absent.yaml")]) == EXIT_BAD_INPUT
    )
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "absent.yaml" in err


# ---------------------------------------------------------------------------------------------- duplicate keys


def _with_duplicate_status(text: str) -> str:
    assert text.count('"status": "green"') > 0
    return text.replace('"status": "green"', '"status": "red", "status": "green"', 1)


def test_duplicate_key_in_a_finalised_file_is_bad_input(real_evidence: Path, tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text(real_evidence.read_text())
    assert gate(path).exit_code == EXIT_PASS  # negative control: the same bytes
    path.write_text(_with_duplicate_status(real_evidence.read_text()))
    result = gate(path)
    assert result.exit_code == EXIT_BAD_INPUT and "duplicate key 'status'" in result.lines[0]


def test_duplicate_key_in_a_partial_file_is_bad_input(factory) -> None:
    writer, _ = factory.write("partial", finalise=False)
    text = writer.partial_path.read_text()
    assert gate(writer.partial_path).exit_code == EXIT_RED  # negative control: readable, not finalised
    writer.partial_path.write_text(text.replace('"status":"green"', '"status":"red","status":"green"', 1))
    result = gate(writer.partial_path)
    assert result.exit_code == EXIT_BAD_INPUT and "duplicate key" in result.lines[0]


# ---------------------------------------------------------------------------------------------- digests


def test_cell_edited_after_writing_is_a_digest_mismatch(real_evidence: Path, factory) -> None:
    doc = _load(real_evidence)
    doc["cells"][0]["wall_s"] += 1.0  # an informational field: only the digest can notice
    result = gate(doc, source="edited")
    assert result.exit_code == EXIT_BAD_INPUT and _codes(result) == {"digest_mismatch"}
    assert len(result.lines) == 1 and "cells_digest" in result.lines[0]
    assert gate(factory.redigest(doc), source="redigested").exit_code == EXIT_PASS  # negative control


def test_merged_file_checks_each_shard_digest(factory, monkeypatch, tmp_path: Path) -> None:
    from ws1_harness.verdict.evidence import cells_digest

    monkeypatch.setenv("WS1_SOURCE_COMMIT", "d" * 40)
    keys = list(factory.Synth().expected())
    paths = [
        factory.write(name, factory.Synth(only=part))[0].path
        for name, part in (("a", keys[: len(keys) // 2]), ("b", keys[len(keys) // 2 :]))
    ]
    doc = merge(paths, command="ws1 merge a b")
    assert [s["cells_digest"] for s in doc["shards"]] == [_load(p)["cells_digest"] for p in paths]
    moved = next(c for c in doc["cells"] if c["shard"] == 0)
    moved["shard"] = 1  # a cell credited to the other shard; only the top digest is recomputed
    doc["cells_digest"] = cells_digest(doc["cells"])
    result = gate(doc, source="merged")
    assert result.exit_code == EXIT_BAD_INPUT and _codes(result) == {"digest_mismatch"}
    assert "shards[0]" in result.lines[0]
    moved["shard"] = 0
    doc["cells_digest"] = cells_digest(doc["cells"])
    assert gate(doc, source="merged").exit_code == EXIT_PASS  # negative control


# ---------------------------------------------------------------------------------------------- full runs


def test_reduced_run_says_so_and_fails_full(real_evidence: Path) -> None:
    result = gate(real_evidence)
    assert result.exit_code == EXIT_PASS
    assert result.lines[0].startswith("ws1 gate: PASS (reduced: model tiny, operators 2/")
    full = gate(real_evidence, full=True)
    assert full.exit_code == EXIT_RED and "not_full" in _codes(full)
    assert any("model tiny" in p.message for p in full.problems if p.code == "not_full")


def _all_operators(factory, monkeypatch) -> tuple[str, ...]:
    from ws1_harness.verdict.rejudge import shipped_reference

    man = shipped_reference().manifest
    for name, info in man.operators.items():  # the very dict the synthetic writer reads
        monkeypatch.setitem(factory.operator_specs, name, info.to_json())
    return tuple(man.operators), man.tiers


def test_full_cell_set_passes_full(factory, monkeypatch) -> None:
    operators, tiers = _all_operators(factory, monkeypatch)
    writer, _ = factory.write("full", factory.Synth(operators=operators, tiers=tiers))
    result = gate(writer.path, full=True)
    assert result.exit_code == EXIT_PASS, result.lines
    assert result.reduced == () and "reduced" not in result.lines[0]


@pytest.mark.parametrize("gap", ["optional", "operator", "tier"])
def test_full_refuses_each_gap(factory, monkeypatch, gap: str) -> None:
    operators, tiers = _all_operators(factory, monkeypatch)
    synth = factory.Synth(operators=operators, tiers=tiers)
    if gap == "optional":  # the red cells of the optional operator deleted
        synth.overrides = {k: None for k, e in synth.expected().items() if not e.required}
    elif gap == "operator":  # every cell of an operator deleted and the operator dropped from the axes
        synth.operators = tuple(op for op in operators if op != "rms_norm")
    else:
        synth.tiers = tiers[:-1]
    writer, _ = factory.write("gap_" + gap, synth)
    assert gate(writer.path).exit_code == EXIT_PASS  # without --full: a pass, labelled reduced
    assert "reduced" in gate(writer.path).lines[0]
    result = gate(writer.path, full=True)
    assert result.exit_code == EXIT_RED and _codes(result) == {"not_full"}


def test_nox_gate_session_requires_the_full_cell_set() -> None:
    text = (Path(__file__).resolve().parents[2] / "noxfile.py").read_text()
    body = text[text.index("def gate(session") :]
    assert '"ws1", "gate", "--full"' in body


# ---------------------------------------------------------------------------------------------- plug-ins


def test_builtin_profile_cannot_be_replaced() -> None:
    from ws1_kernels import registry
    from ws1_kernels.errors import RegistryError

    cands = [registry.resolve("portable_cpu", "silu")]
    with pytest.raises(RegistryError, match="built-in"):
        registry.register_profile("portable_cpu", cands, replace=True)
    plugin = [registry.Candidate(**{**_fields(cands[0]), "profile": "trust_plug"})]
    registry.register_profile("trust_plug", plugin, replace=True)  # negative control: a new name registers
    registry.register_profile("trust_plug", plugin, replace=True)  # and a plug-in may replace itself


def _fields(c) -> dict:
    import dataclasses

    return {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}


def test_plugin_evidence_records_its_source(tmp_path: Path, monkeypatch) -> None:
    import hashlib
    import sys

    from ws1_harness.verdict.provenance import collect_provenance

    module = tmp_path / "trust_plugin_mod.py"
    module.write_text(
        "from ws1_kernels import registry\n"
        "base = registry.resolve('portable_cpu', 'silu')\n"
        "def silu(x, ctx):\n    return base.fn(x, ctx)\n"
        "import dataclasses\n"
        "PROFILE = ('trust_spec', [dataclasses.replace(base, profile='trust_spec', fn=silu)])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "trust_plugin_mod", raising=False)
    from ws1_kernels import registry

    assert registry.load_spec("trust_plugin_mod:PROFILE") == "trust_spec"
    entries = [p for p in collect_provenance([]).to_json()["plugins"] if p["profile"] == "trust_spec"]
    assert [e["module"] for e in entries] == ["trust_plugin_mod"]
    assert entries[0]["sha256"] == "sha256:" + hashlib.sha256(module.read_bytes()).hexdigest()
    assert entries[0]["file"].endswith("trust_plugin_mod.py") and str(tmp_path) not in entries[0]["file"]


def test_gate_requires_plugin_sources_for_a_profile_not_built_in(factory) -> None:
    writer, _ = factory.write("plug", factory.Synth(profiles=("trust_gate_plug",)))
    doc = _load(writer.path)
    doc["provenance"]["plugins"] = [
        p for p in doc["provenance"]["plugins"] if p["profile"] != "trust_gate_plug"
    ]
    result = gate(doc, source="plug")
    assert result.exit_code == EXIT_RED and "plugin_unrecorded" in _codes(result)
    doc["provenance"]["plugins"].append(
        {"profile": "trust_gate_plug", "module": "m", "file": "m.py", "sha256": "sha256:" + "1" * 64}
    )
    assert gate(doc, source="plug").exit_code == EXIT_PASS  # negative control: its source is recorded
    doc["provenance"]["plugins"].append(dict(doc["provenance"]["plugins"][-1], profile="portable_cpu"))
    result = gate(doc, source="plug")
    assert result.exit_code == EXIT_RED and "plugin_builtin_name" in _codes(result)


# ---------------------------------------------------------------------------------------------- no torch


def test_verdict_side_imports_no_torch(real_evidence: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from ws1_harness.verdict.gate import gate\n"
        "from ws1_harness.verdict import merge, rejudge, evidence, cells, status\n"
        f"r = gate({str(real_evidence)!r})\n"
        "assert r.exit_code == 0, r.lines\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'triton', 'ws1_kernels', 'ws1_workload'})\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
