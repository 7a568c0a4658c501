"""`provenance.extension_archs`: the arch lists of the loaded CUDA extensions, recorded beside the code objects and
printed among a merged verdict's environments (where the sm86 and sm90 shards' builds differ)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from ws1_harness.verdict import provenance
from ws1_harness.verdict.environments import differences, environment_lines


def _fake(targets: tuple[str, ...] | None) -> SimpleNamespace:
    built = targets is not None
    return SimpleNamespace(extension=lambda: object() if built else None, built_targets=lambda: targets or ())


def test_the_loaded_builds_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ws1_kernels.cuda", _fake(("8.0", "9.0a")))
    monkeypatch.setitem(sys.modules, "ws1_kernels.cuda_sm90", _fake(("9.0a",)))
    assert provenance._extension_archs() == "ws1_cuda_ext=8.0;9.0a ws1_cuda_sm90_ext=9.0a"
    monkeypatch.setitem(sys.modules, "ws1_kernels.cuda_sm90", _fake(None))  # the Hopper module not built
    assert provenance._extension_archs() == "ws1_cuda_ext=8.0;9.0a"


def test_nothing_loaded_records_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "ws1_kernels.cuda", raising=False)
    monkeypatch.delitem(sys.modules, "ws1_kernels.cuda_sm90", raising=False)
    assert provenance._extension_archs() is None
    record = provenance.collect_provenance(["ws1", "test"]).to_json()
    assert record["extension_archs"] is None


def test_two_builds_are_printed_and_their_difference_named() -> None:
    a = ("a.json", {"torch": "2.11.0", "extension_archs": "ws1_cuda_ext=8.6+PTX", "code_objects": []})
    b = ("b.json", {"torch": "2.11.0", "extension_archs": "ws1_cuda_ext=8.0;9.0a", "code_objects": []})
    assert differences([a, b]) == [
        "  differ: extension_archs: ws1_cuda_ext=8.6+PTX (a.json); ws1_cuda_ext=8.0;9.0a (b.json)"
    ]
    assert differences([a, a]) == []  # control: the same build names no difference
    lines = environment_lines({"shards": [{"file": n, "provenance": p} for n, p in (a, b)]})
    assert "extension_archs=ws1_cuda_ext=8.6+PTX" in lines[1]
