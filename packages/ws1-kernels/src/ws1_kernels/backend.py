"""How a backend registers: one style for every backend, built-in or plug-in.

A backend is a package (or module) that exports ``BACKEND = Backend(...)``: where it runs, the minimum arch, its
parameter-gradient rule, and a loader that returns its operators. Each operator module of the backend exports

    OPS[operator] = OpEntry(fn, kernel_id, declared_ops, kernel_ids)

and ``collect_ops`` gathers them, so a new operator is one new module (or one entry) in each backend's folder,
and a new backend is its own folder plus one line of the operator spec's ``profiles:`` table
(``manifests/operators.yaml``). The registry turns entries into candidates; it holds no per-operator table.

This module is a floor under every backend: it imports no backend.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class OpEntry:
    """One operator of one backend.

    ``kernel_id`` is the primary id its launch sites record (the forward kernel); ``kernel_ids`` the further ids
    it may record or launch (its backward kernels); ``declared_ops`` the aten overload packets it may dispatch,
    forward and backward (a dispatch outside them is a fallback the harness must see)."""

    fn: Callable[..., Any]
    kernel_id: str
    declared_ops: frozenset[str]
    kernel_ids: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Backend:
    """A backend's registration.

    ``load()`` returns (operator -> OpEntry, why it has none): an empty table with a reason makes the profile
    a declared name whose every cell reports that reason (e.g. Triton does not import, the extension is not
    built). ``available(device)`` is None when the backend can run on that device now, else a one-line reason.
    """

    device: str  # "cpu", "cuda" or "any"
    min_arch: str | None
    param_grad_rule: str
    load: Callable[[], tuple[Mapping[str, OpEntry], str | None]]
    available: Callable[[str], str | None] = field(default=lambda device: None, compare=False)


def collect_ops(package: ModuleType) -> tuple[dict[str, OpEntry], dict[str, str]]:
    """Import every public module of ``package`` and merge their ``OPS`` tables.

    Returns (operator -> entry, module -> why it did not import). Two modules claiming one operator is an
    error: the registry must never pick one silently."""
    found: dict[str, OpEntry] = {}
    owner: dict[str, str] = {}
    broken: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        name = f"{package.__name__}.{info.name}"
        try:
            mod = importlib.import_module(name)
        except ImportError as exc:
            broken[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            continue
        for op, entry in getattr(mod, "OPS", {}).items():
            if not isinstance(entry, OpEntry):
                raise TypeError(f"{name}.OPS[{op!r}] is not an OpEntry")
            if op in found:
                raise ValueError(f"operator {op!r} is exported by both {owner[op]} and {name}")
            found[op], owner[op] = entry, name
    return found, broken
