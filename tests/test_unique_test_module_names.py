"""pytest (prepend import mode) cannot collect two test modules with one basename: keep them unique."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def test_test_module_basenames_are_unique() -> None:
    here = Path(__file__).resolve().parent
    names = Counter(p.name for p in here.rglob("*.py") if p.name != "conftest.py")
    duplicates = sorted(name for name, n in names.items() if n > 1)
    assert duplicates == [], f"duplicate test module names: {duplicates}"
