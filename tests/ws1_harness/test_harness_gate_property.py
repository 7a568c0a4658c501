"""Property: no single-field edit of a finalised evidence file makes the gate pass unless the field is one the
gate documents as informational (docs/gate.md, "Informational fields", read here so the list and the test
cannot drift apart).

The file is real (`real_evidence`: a tiny in-process `ws1 matrix` run, clean tree at a known commit) and the
gate is run with `--expect-commit` and `--require-clean`, so the commit fields count too. Each edit is judged
twice: as made (the cells digest is stale) and re-digested, as a forger covering it would; both must fail
unless the field is informational. The base file passing is the negative control.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from commit_support import REAL_COMMIT  # noqa: E402
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ws1_harness.verdict.evidence import cells_digest, shard_cells
from ws1_harness.verdict.gate import EXIT_PASS, gate

DOCS = Path(__file__).resolve().parents[2] / "docs" / "gate.md"
DIGEST_FIELDS = frozenset({"cells_digest", "shards[].cells_digest"})

Path_ = tuple[Any, ...]


def informational_patterns() -> list[str]:
    text = DOCS.read_text(encoding="utf-8")
    block = text.split("<!-- informational:begin -->", 1)[1].split("<!-- informational:end -->", 1)[0]
    return re.findall(r"^- `([^`]+)`", block, flags=re.M)


def pattern_of(path: Path_) -> str:
    """`cells[].layouts[].checks[].atol` for ("cells", 3, "layouts", 0, "checks", 1, "atol")."""
    out = ""
    for part in path:
        out += "[]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def is_informational(path: Path_, patterns: list[str]) -> bool:
    concrete = pattern_of(path)
    for pat in patterns:
        rx = re.escape(pat).replace(r"\*\*", ".+").replace(r"\*", r"[^.\[]+")
        if re.fullmatch(rx, concrete):
            return True
    return False


def leaves(doc: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every editable place: each scalar, and each dict entry / list element (for deletion)."""
    out: list[Path_] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append((*prefix, k))
            if isinstance(v, (dict, list)):
                out += leaves(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.append((*prefix, i))
            if isinstance(v, (dict, list)):
                out += leaves(v, (*prefix, i))
    return out


def _parent(doc: Any, path: Path_) -> Any:
    for part in path[:-1]:
        doc = doc[part]
    return doc


def changed(value: Any, pick: int) -> Any:
    """A different value for a scalar (same type where possible; sometimes another type)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + (-2, -1, 1, 7)[pick % 4]
    if isinstance(value, float):
        return (value * 1.5 + 0.25, -value - 1.0, value + 1e-3)[pick % 3]
    if isinstance(value, str):
        return (value + "x", "", value[::-1] + "_")[pick % 3] or "x"
    if value is None:
        return (1, "x", 0.5, True)[pick % 4]
    return None  # a list or an object replaced by null


def apply_edit(doc: dict, path: Path_, kind: str, pick: int) -> bool:
    """Edit `doc` in place; False when the edit would change nothing."""
    parent = _parent(doc, path)
    key = path[-1]
    if kind == "delete":
        del parent[key]
        return True
    old = parent[key]
    new = changed(old, pick)
    if new == old and type(new) is type(old):
        return False
    parent[key] = new
    return True


def redigest(doc: dict) -> dict:
    if isinstance(doc.get("cells"), list) and isinstance(doc.get("shards"), list):
        try:
            doc["cells_digest"] = cells_digest(doc["cells"])
            for i, entry in enumerate(doc["shards"]):
                entry["cells_digest"] = cells_digest(shard_cells(doc["cells"], i))
        except Exception:  # noqa: BLE001 - an edit that broke the cells' shape: the digest stays as it was
            pass
    return doc


def _gate(doc: dict) -> int:
    return gate(doc, source="edited", expect_commit=REAL_COMMIT, require_clean=True).exit_code


@pytest.fixture(scope="module")
def base(real_evidence: Path) -> dict:
    doc = json.loads(real_evidence.read_text())
    assert _gate(copy.deepcopy(doc)) == EXIT_PASS  # negative control: the file as written passes
    return doc


@pytest.fixture(scope="module")
def groups(base: dict) -> dict[str, list[Path_]]:
    """Editable places grouped by field pattern, so every kind of field is drawn as often as any other."""
    out: dict[str, list[Path_]] = {}
    for path in leaves(base):
        out.setdefault(pattern_of(path), []).append(path)
    return out


def test_docs_list_informational_fields_and_what_the_gate_cannot_stop() -> None:
    patterns = informational_patterns()
    assert "cells[].wall_s" in patterns and "cells[].diagnostics.**" in patterns
    assert not any(p.startswith(("cells[].status", "cells[].layouts[].checks[].passed")) for p in patterns)
    assert "## What the gate cannot stop" in DOCS.read_text(encoding="utf-8")


def test_informational_patterns_match_fields_of_a_real_file(groups) -> None:
    """Every documented pattern names a field a real file has (no stale entries hiding a typo)."""
    patterns = informational_patterns()
    unused = [
        p for p in patterns if not any(is_informational(path, [p]) for g in groups.values() for path in g)
    ]
    # fields that are null or empty in a CPU run have no place to match; they must still be schema fields. The
    # real file is a matrix run: its chain_cells list is empty (test_harness_chain_gate.py covers chain cells).
    unused = [p for p in unused if not p.startswith("chain_cells[].")]
    assert set(unused) <= {"shard", "provenance.driver", "provenance.cuda", "provenance.arch_proxy"}, unused


@settings(
    max_examples=60,  # every field pattern is also edited once by the deterministic sweep below
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_single_field_edit_never_passes_unless_informational(base, groups, data) -> None:
    patterns = informational_patterns()
    pattern = data.draw(st.sampled_from(sorted(groups)), label="field")
    path = data.draw(st.sampled_from(groups[pattern]), label="place")
    kind = data.draw(st.sampled_from(["change", "delete"]), label="edit")
    pick = data.draw(st.integers(0, 11), label="value")
    doc = copy.deepcopy(base)
    if not apply_edit(doc, path, kind, pick):
        return
    informational = is_informational(path, patterns)
    code = _gate(copy.deepcopy(doc))
    assert code != EXIT_PASS or informational, f"{kind} {pattern_of(path)} passed with a stale digest"
    if pattern_of(path) in DIGEST_FIELDS:
        return  # re-digesting would undo the edit itself
    code = _gate(redigest(doc))
    assert code != EXIT_PASS or informational, f"{kind} {pattern_of(path)} passed after re-digesting"


@pytest.mark.parametrize("kind", ["change", "delete"])
def test_every_field_kind_is_judged_or_documented_informational(base, groups, kind) -> None:
    """The sweep above draws fields at random, so a field added without a check or a docs entry
    (`provenance.extension_archs` once) failed only on the runs that happened to draw it. Here every field pattern
    is edited once at its first place: each edit that the gate still passes must be a documented informational
    field. The control: a cell's status edit is refused."""
    patterns = informational_patterns()
    passed_undocumented = []
    for pattern, places in sorted(groups.items()):
        doc = copy.deepcopy(base)
        if not apply_edit(doc, places[0], kind, 1):
            continue
        if _gate(doc) == EXIT_PASS and not is_informational(places[0], patterns):
            passed_undocumented.append(pattern)
    assert passed_undocumented == [], (
        f"{kind}: the gate passes these edits and docs/gate.md does not list them"
    )
    status = next(p for p in groups["cells[].status"])
    doc = copy.deepcopy(base)
    assert apply_edit(doc, status, "change", 1) and _gate(doc) != EXIT_PASS
