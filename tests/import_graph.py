"""The import graph of a package, read from its source (no import runs), and its cycles.

Every `import` and `from ... import` counts, including those inside functions: an import placed in a function
hides a cycle from Python at load time but not from a maintainer, who still cannot take the two modules apart.
Imports under `if TYPE_CHECKING:` do not count (they never run). A `from pkg import name` where `pkg.name` is a
module is an edge to that module, otherwise to `pkg` itself.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def modules(src: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the package folder `src`."""
    out: dict[str, Path] = {}
    for f in sorted(src.rglob("*.py")):
        parts = [package, *f.relative_to(src).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def import_statements(name: str, path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """Every import of module `name` (file `path`) as `(module, names)`: `("a.b", ())` for `import a.b`,
    `("a", ("b", "c"))` for `from a import b, c`; relative imports resolved against the module's package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skip = _type_checking_nodes(tree)
    out: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                mod = ".".join(parts + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((mod, tuple(a.name for a in node.names)))
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that module `name` (file `path`) imports."""
    found: set[str] = set()
    for mod, names in import_statements(name, path):
        if not names:
            if mod in known:
                found.add(mod)
            continue
        for alias in names:
            if f"{mod}.{alias}" in known:
                found.add(f"{mod}.{alias}")
            elif mod in known:
                found.add(mod)
    found.discard(name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def package_cycles(src: Path, package: str) -> list[list[str]]:
    known = modules(src, package)
    return cycles({m: imports_of(m, f, known) for m, f in known.items()})
