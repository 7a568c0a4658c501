"""Merge refuses shards that cannot belong together (other commit, contract or workload; overlapping
cells) and records where each cell came from."""

from __future__ import annotations

import json

import pytest

from ws1_harness.verdict.evidence import EvidenceError, write_evidence_json
from ws1_harness.verdict.gate import EXIT_PASS, EXIT_RED, gate
from ws1_harness.verdict.merge import MergeError, merge


def _split(expected):
    keys = list(expected)
    return keys[: len(keys) // 2], keys[len(keys) // 2 :]


def _shards(factory, monkeypatch, a_kwargs=None, b_kwargs=None, a_env=None, b_env=None):
    """Two shards of the same synthetic matrix, cells split in half."""
    base = factory.Synth()
    first, second = _split(base.expected())
    paths = []
    for name, keys, kwargs, env in (("a", first, a_kwargs, a_env), ("b", second, b_kwargs, b_env)):
        for var, value in {"WS1_SOURCE_COMMIT": "d" * 40, "WS1_SOURCE_DIRTY": "0", **(env or {})}.items():
            monkeypatch.setenv(var, value)
        writer, _ = factory.write(name, factory.Synth(only=keys, **(kwargs or {})))
        paths.append(writer.path)
    return paths


def test_merge_of_complementary_shards_passes(factory, monkeypatch, tmp_path) -> None:
    paths = _shards(factory, monkeypatch)
    for path in paths:
        assert gate(path).exit_code == EXIT_RED  # each shard alone is incomplete
    merged = merge(paths, command="ws1 merge a b")
    assert merged["finalised"] is True
    assert [s["file"] for s in merged["shards"]] == [p.name for p in paths]
    assert {c["shard"] for c in merged["cells"]} == {0, 1}
    assert merged["counts"]["total"] == len(factory.Synth().expected())
    out = write_evidence_json(merged, tmp_path / "merged.json")
    result = gate(out, expect_commit="d" * 40, require_clean=True)
    assert result.exit_code == EXIT_PASS, result.lines


@pytest.mark.parametrize(
    ("a_env", "b_env", "b_kwargs", "what"),
    [
        ({}, {"WS1_SOURCE_COMMIT": "e" * 40}, None, "git commit"),
        ({}, {"WS1_SOURCE_DIRTY": "1"}, None, "dirty flag"),
        ({}, {}, {"contract": "contract-b"}, "contract fingerprint"),
        ({}, {}, {"workload": "synthetic.r2"}, "workload"),
    ],
)
def test_merge_refuses_disagreeing_shards(factory, monkeypatch, a_env, b_env, b_kwargs, what) -> None:
    paths = _shards(factory, monkeypatch, b_kwargs=b_kwargs, a_env=a_env, b_env=b_env)
    with pytest.raises(MergeError, match=what):
        merge(paths)


def test_merge_refuses_overlap(factory, monkeypatch) -> None:
    monkeypatch.setenv("WS1_SOURCE_COMMIT", "d" * 40)
    a, _ = factory.write("a")
    b, _ = factory.write("b")
    with pytest.raises(MergeError, match="overlap"):
        merge([a.path, b.path])


def test_merge_refuses_schema_version_mismatch(factory, monkeypatch) -> None:
    paths = _shards(factory, monkeypatch)
    doc = json.loads(paths[1].read_text())
    doc["schema_version"] = 99
    paths[1].write_text(json.dumps(doc))
    with pytest.raises(EvidenceError, match="schema_version"):
        merge(paths)


def test_merge_refuses_unfinalised_and_merged_shards(factory, monkeypatch, tmp_path) -> None:
    paths = _shards(factory, monkeypatch)
    partial, _ = factory.write("p", factory.Synth(only=[]), finalise=False)
    with pytest.raises(EvidenceError):
        merge([paths[0], partial.partial_path])
    merged = write_evidence_json(merge(paths), tmp_path / "m.json")
    with pytest.raises(MergeError, match="already a merged"):
        merge([merged])
    with pytest.raises(MergeError):
        merge([])
