"""The fp32 reference imports no candidate, and no backend imports another backend's module.

Input checks (`op_checks`), the rope arithmetic (`rope_math`) and the main_grad rule's pieces (`main_grad`) sit
on a floor under every backend. Read from the source with tests/import_graph.py, in-function imports included.
"""

from __future__ import annotations

from pathlib import Path

from import_graph import imports_of, modules

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "packages" / "ws1-kernels" / "src" / "ws1_kernels"
BACKENDS = ("ws1_kernels.portable", "ws1_kernels.triton_ops", "ws1_kernels.native", "ws1_kernels.cuda")


def _backend(module: str) -> str | None:
    return next((b for b in BACKENDS if module == b or module.startswith(b + ".")), None)


def crossings(src: Path, package: str) -> dict[str, list[str]]:
    """Module -> the backend modules it imports that are not its own backend's (the reference owns none)."""
    known = modules(src, package)
    out: dict[str, list[str]] = {}
    for name, path in known.items():
        mine = _backend(name)
        if mine is None and name != f"{package}.reference":
            continue
        bad = sorted(m for m in imports_of(name, path, known) if _backend(m) not in (None, mine))
        if bad:
            out[name] = bad
    return out


def test_no_backend_and_not_the_reference_imports_another_backend() -> None:
    assert crossings(SRC, "ws1_kernels") == {}


def test_a_reference_importing_a_candidate_is_caught(tmp_path: Path) -> None:
    """Negative control: a toy package whose reference takes a check from the portable backend."""
    pkg = tmp_path / "ws1_kernels"
    (pkg / "portable").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "portable" / "__init__.py").write_text("")
    (pkg / "portable" / "attention.py").write_text("def check():\n    return 1\n")
    (pkg / "op_checks.py").write_text("def check():\n    return 1\n")
    (pkg / "reference.py").write_text("from .op_checks import check\n")
    assert crossings(pkg, "ws1_kernels") == {}
    (pkg / "reference.py").write_text("from .portable.attention import check\n")
    assert crossings(pkg, "ws1_kernels") == {"ws1_kernels.reference": ["ws1_kernels.portable.attention"]}
