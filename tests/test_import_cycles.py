"""No package has an import cycle, counting imports inside functions (tests/import_graph.py says why)."""

from __future__ import annotations

from pathlib import Path

import pytest
from import_graph import package_cycles

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {
    "ws1_contract": REPO / "packages" / "ws1-contract" / "src" / "ws1_contract",
    "ws1_workload": REPO / "packages" / "ws1-workload" / "src" / "ws1_workload",
    "ws1_kernels": REPO / "packages" / "ws1-kernels" / "src" / "ws1_kernels",
    "ws1_harness": REPO / "packages" / "ws1-harness" / "src" / "ws1_harness",
}


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle(package: str) -> None:
    assert package_cycles(PACKAGES[package], package) == []


def _write(root: Path, name: str, text: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_cycle_hidden_in_a_function_is_found(tmp_path: Path) -> None:
    """Negative control: `a` imports `b` at the top, `b` imports `a` inside a function (as cli and chain_args
    once did); the TYPE_CHECKING import of `c` does not count."""
    src = tmp_path / "toy"
    _write(src, "__init__.py", "")
    _write(src, "a.py", "from toy.b import f\n")
    _write(src, "b.py", "def f():\n    from toy import a\n    return a\n")
    _write(src, "c.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    _write(src, "d.py", "from . import c\n")
    assert package_cycles(src, "toy") == [["toy.a", "toy.b"]]
    _write(src, "b.py", "def f():\n    return 1\n")
    assert package_cycles(src, "toy") == []
