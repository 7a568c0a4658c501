"""Fixtures for the ws1_contract tests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

# The helpers module sits beside this file; make it importable under any pytest import mode.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from ws1_contract_testkit import shipped_document  # noqa: E402


@pytest.fixture
def doc() -> dict[str, Any]:
    """A fresh copy of the shipped contract document that a test may mutate."""
    return shipped_document()
