"""The package-data copies of contracts/*.json and manifests/*.yaml equal their sources byte for byte.

Fix a failure with `python ci/sync_package_data.py`.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from repo_scripts import load_repo_script

ROOT = Path(__file__).resolve().parent.parent


def _load_sync() -> ModuleType:
    return load_repo_script("ci/sync_package_data.py", "ws1_ci_sync_package_data")


SYNC = _load_sync()
PAIRS = SYNC.pairs(ROOT)


def test_the_tolerance_contract_and_its_schema_are_shipped() -> None:
    names = {pair.source.name for pair in PAIRS}
    assert {"tolerance.json", "tolerance.schema.json"} <= names


@pytest.mark.parametrize("pair", PAIRS, ids=[str(p.copy.relative_to(ROOT)) for p in PAIRS])
def test_copy_is_byte_identical_to_source(pair: object) -> None:
    source, copy = pair.source, pair.copy  # type: ignore[attr-defined]
    assert copy.is_file(), f"missing copy {copy.relative_to(ROOT)}: run python ci/sync_package_data.py"
    assert copy.read_bytes() == source.read_bytes(), f"{copy.relative_to(ROOT)} differs from its source"


def test_no_orphan_copies() -> None:
    orphans = SYNC.orphans(ROOT)
    assert orphans == [], f"copies without a source: {[str(p.relative_to(ROOT)) for p in orphans]}"


def test_plan_detects_missing_stale_and_orphan(tmp_path: Path) -> None:
    """The checker itself has teeth: build a tiny tree with one of each fault."""
    (tmp_path / "contracts").mkdir()
    (tmp_path / "manifests").mkdir()
    data = tmp_path / "packages/ws1-contract/src/ws1_contract/data"
    data.mkdir(parents=True)
    (tmp_path / "contracts" / "a.json").write_text("{}\n")
    (tmp_path / "contracts" / "b.json").write_text('{"x": 1}\n')
    (data / "b.json").write_text('{"x": 2}\n')
    (data / "c.json").write_text("{}\n")
    (tmp_path / "manifests" / "m.yaml").write_text("a: 1\n")
    missing, stale, orphans = SYNC.plan(tmp_path)
    # the manifest is shipped twice: by the workload and by the harness (whose gate reads it without torch)
    assert sorted(str(p.copy.relative_to(tmp_path)) for p in missing) == sorted(
        [
            "packages/ws1-contract/src/ws1_contract/data/a.json",
            "packages/ws1-workload/src/ws1_workload/data/m.yaml",
            "packages/ws1-harness/src/ws1_harness/data/m.yaml",
        ]
    )
    assert [p.source.name for p in stale] == ["b.json"]
    assert [p.name for p in orphans] == ["c.json"]
