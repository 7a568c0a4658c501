"""The verdict side of the harness imports no torch and nothing of the run side, by structure.

Read from the source (tests/import_graph.py): every import of every module under `ws1_harness/verdict/`, those
inside functions included (an in-function import keeps a process free of torch only while nobody calls that
function). The runtime check that a gate process loads no torch is in test_harness_gate_trust.py.
"""

from __future__ import annotations

from pathlib import Path

from import_graph import import_statements

REPO = Path(__file__).resolve().parents[2]
VERDICT = REPO / "packages" / "ws1-harness" / "src" / "ws1_harness" / "verdict"
#: Top-level names the verdict side must never import.
FORBIDDEN = ("torch", "triton", "numpy", "ws1_workload", "ws1_kernels", "ws1_harness.run", "ws1_harness.cli")


def imported_names(path: Path) -> set[str]:
    """Every absolute module name a verdict file imports, and `module.name` for each `from module import name`."""
    names: set[str] = set()
    for mod, aliases in import_statements(f"ws1_harness.verdict.{path.stem}", path):
        names.add(mod)
        names.update(f"{mod}.{a}" for a in aliases)
    return names


def forbidden_imports(folder: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        bad = sorted(
            n for n in imported_names(path) if any(n == f or n.startswith(f + ".") for f in FORBIDDEN)
        )
        if bad:
            out[path.name] = bad
    return out


def test_the_verdict_side_imports_no_torch_and_no_run_module() -> None:
    assert sorted(p.name for p in VERDICT.glob("*.py")), "no verdict modules found"
    assert forbidden_imports(VERDICT) == {}


def test_a_verdict_module_importing_torch_in_a_function_is_caught(tmp_path: Path) -> None:
    """Negative control: a planted in-function torch import and a `from ..run import` are both found."""
    (tmp_path / "ok.py").write_text("import json\nfrom ws1_harness.verdict import cells\n")
    (tmp_path / "bad.py").write_text("def f():\n    import torch\n    return torch\n")
    (tmp_path / "worse.py").write_text("from ..run import unit\n")
    assert forbidden_imports(tmp_path) == {
        "bad.py": ["torch"],
        "worse.py": ["ws1_harness.run", "ws1_harness.run.unit"],
    }
