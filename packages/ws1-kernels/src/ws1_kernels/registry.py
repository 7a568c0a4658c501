"""Registry: ``(profile, operator) -> Candidate``, fail-closed.

``resolve`` returns a candidate that can run on the requested device or raises ``CandidateUnavailable`` listing
every candidate it considered and why each was rejected; nothing falls back to another profile or operator.
Every backend registers in one style (``ws1_kernels.backend``): a ``Backend`` whose loader gives operator ->
``OpEntry``. The built-in backends are the operator spec's ``profiles:`` table (``manifests/operators.yaml``:
profile name -> the module exporting ``BACKEND``); the operator names and which operators take a weight are the
spec's too, so this module holds no per-operator table. Plug-ins register whole profiles the same way
(``register_backend``) or as candidate lists (``register_profile``), through the ``ws1.candidates`` entry-point
group (``load_entry_points``) or a ``module:attr`` spec (``load_spec``, for a CLI ``--candidates``); they are
judged exactly like the built-in ones.
"""

from __future__ import annotations

import hashlib
import importlib
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import torch

from ws1_contract import operators as spec

from .backend import Backend
from .errors import CandidateUnavailable, RegistryError

PARAM_GRAD_RULES: frozenset[str] = frozenset({"sample_blocks_main_grad", "autograd_accumulate"})
ENTRY_POINT_GROUP = "ws1.candidates"


def operators() -> tuple[str, ...]:
    """Every operator of this process, in chain order (the spec's, then any a plug-in registered)."""
    return tuple(spec.operators())


def layout_only() -> frozenset[str]:
    """Operators that are layout helpers: no candidate by design."""
    return frozenset(n for n, s in spec.operators().items() if s.layout_only)


def param_operators() -> frozenset[str]:
    """Operators with a weight: their candidates follow a parameter-gradient rule; the others declare None."""
    return frozenset(n for n, s in spec.operators().items() if s.has_params)


# the shipped spec's, as constants for callers that read them once (a plug-in operator is in the functions above)
OPERATORS: tuple[str, ...] = spec.shipped_table().names
LAYOUT_ONLY: frozenset[str] = spec.shipped_table().layout_only
PARAM_OPERATORS: frozenset[str] = spec.shipped_table().param_operators


def _always(device: str) -> str | None:
    return None


@dataclass(frozen=True)
class Candidate:
    """One operator implementation of one profile.

    ``available(device)`` returns None when the candidate can run on ``device`` or a one-line reason.
    ``declared_ops`` lists the aten overload packets (``"aten.mm"``) it may dispatch, forward and backward.
    """

    profile: str
    operator: str
    kernel_id: str
    device: str  # "cpu", "cuda" or "any"
    min_arch: str | None
    param_grad_rule: str | None
    declared_ops: frozenset[str]
    fn: Callable[..., Any]
    available: Callable[[str], str | None] = field(default=_always, compare=False)
    # further kernel ids this candidate may record or launch besides ``kernel_id`` (e.g. its backward kernels)
    kernel_ids: frozenset[str] = frozenset()
    # a stock baseline: the torch ops it dispatches are torch's per-device choice, recorded but not judged
    stock: bool = False

    @property
    def all_kernel_ids(self) -> frozenset[str]:
        return frozenset({self.kernel_id, *self.kernel_ids})

    @property
    def candidate_id(self) -> str:
        return f"{self.profile}.{self.operator}"

    def __post_init__(self) -> None:
        where = f"registry.Candidate({self.profile}.{self.operator})"
        if self.operator not in operators() or self.operator in layout_only():
            raise RegistryError(f"{where}: unknown or layout-only operator {self.operator!r}")
        if self.device not in ("cpu", "cuda", "any"):
            raise RegistryError(f"{where}: device must be cpu, cuda or any, got {self.device!r}")
        if self.min_arch is not None and not re.fullmatch(r"sm\d{2,3}a?", self.min_arch):
            raise RegistryError(f"{where}: min_arch must look like 'sm90', got {self.min_arch!r}")
        expected_rule = self.operator in param_operators()
        if (self.param_grad_rule is not None) != expected_rule or (
            self.param_grad_rule is not None and self.param_grad_rule not in PARAM_GRAD_RULES
        ):
            raise RegistryError(f"{where}: bad param_grad_rule {self.param_grad_rule!r}")
        if not isinstance(self.declared_ops, frozenset) or not self.declared_ops:
            raise RegistryError(f"{where}: declared_ops must be a non-empty frozenset")
        if not callable(self.fn):
            raise RegistryError(f"{where}: fn is not callable")


_PROFILES: dict[str, dict[str, Candidate]] = {}
# declared profiles without candidates yet: name -> reason every resolve reports
_PENDING: dict[str, str] = {}
# the profiles this module defines; set once the built-ins below are registered. A plug-in cannot take one of
# these names: its evidence would read as the built-in profile's.
_BUILTIN: frozenset[str] = frozenset()
# plug-in profile -> the sources behind it: {"profile", "module", "file", "sha256"} per module
_PLUGIN_SOURCES: dict[str, tuple[dict[str, str | None], ...]] = {}


def _module_source(profile: str, module: str) -> dict[str, str | None]:
    """Where a plug-in module's code lives and a digest of it, read when the profile is registered."""
    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None) if mod is not None else None
    digest = None
    if path:
        try:
            with open(path, "rb") as f:
                digest = "sha256:" + hashlib.sha256(f.read()).hexdigest()
        except OSError:
            digest = None
    return {"profile": profile, "module": module, "file": path or "", "sha256": digest}


def plugin_sources() -> tuple[dict[str, str | None], ...]:
    """Every plug-in profile registered in this process with the source of its candidates (and of the module
    that registered it, for a ``module:attr`` spec): what evidence records so a plug-in is never mistaken for a
    built-in profile. ``file`` is the absolute path; the harness makes it portable."""
    return tuple(dict(entry) for entries in _PLUGIN_SOURCES.values() for entry in entries)


def profiles() -> tuple[str, ...]:
    """Every known profile name (with or without candidates), in registration order."""
    return tuple(dict.fromkeys([*_PROFILES, *_PENDING]))


def candidates(profile: str) -> Mapping[str, Candidate]:
    """The candidates registered for ``profile`` (operator -> Candidate)."""
    _check_profile(profile)
    return dict(_PROFILES.get(profile, {}))


def register_profile(name: str, cands: Iterable[Candidate], *, replace: bool = False) -> None:
    """Register a profile; every candidate must carry ``profile == name``, one per operator."""
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise RegistryError(f"registry.register_profile: bad profile name {name!r}")
    if name in _BUILTIN:
        raise RegistryError(
            f"registry.register_profile: profile {name!r} is already registered as a built-in profile; a "
            "plug-in cannot replace it, with or without replace=True (register under another name)"
        )
    if (name in _PROFILES or name in _PENDING) and not replace:
        raise RegistryError(f"registry.register_profile: profile {name!r} already registered")
    table: dict[str, Candidate] = {}
    for c in cands:
        if not isinstance(c, Candidate):
            raise RegistryError(f"registry.register_profile({name}): {c!r} is not a Candidate")
        if c.profile != name:
            raise RegistryError(
                f"registry.register_profile({name}): candidate {c.candidate_id} names another profile"
            )
        if c.operator in table:
            raise RegistryError(f"registry.register_profile({name}): two candidates for {c.operator}")
        table[c.operator] = c
    if not table:
        raise RegistryError(f"registry.register_profile({name}): no candidates")
    _PENDING.pop(name, None)
    _PROFILES[name] = table
    if _BUILTIN:  # registered after the built-ins: a plug-in, whose sources the evidence records
        modules = sorted({getattr(c.fn, "__module__", None) or type(c.fn).__module__ for c in table.values()})
        _PLUGIN_SOURCES[name] = tuple(_module_source(name, m) for m in modules)


def declare_profile(name: str, reason: str) -> None:
    """A profile that exists by name but has no candidate yet (every resolve raises with ``reason``)."""
    _PENDING[name] = reason


def _check_profile(profile: str) -> None:
    if profile not in _PROFILES and profile not in _PENDING:
        raise RegistryError(f"registry: unknown profile {profile!r} (known: {', '.join(profiles())})")


def _device_reason(c: Candidate, device: str) -> str | None:
    kind = torch.device(device).type
    if c.device != "any" and c.device != kind:
        return f"runs on {c.device}, asked for {device}"
    if c.min_arch is not None:
        if kind != "cuda" or not torch.cuda.is_available():
            return f"needs CUDA {c.min_arch}, no CUDA device"
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        need = int(re.sub(r"\D", "", c.min_arch))
        if major * 10 + minor < need:
            return f"needs CUDA {c.min_arch}, device is sm{major}{minor}"
    return None


def resolve(profile: str, operator: str, device: str = "cpu") -> Candidate:
    """The candidate of ``(profile, operator)`` that can run on ``device``; fail-closed."""
    _check_profile(profile)
    if operator not in operators():
        raise RegistryError(f"registry: unknown operator {operator!r} (known: {', '.join(operators())})")
    try:
        torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise RegistryError(f"registry: bad device {device!r}") from exc
    cid = f"{profile}.{operator}"
    if operator in layout_only():
        raise CandidateUnavailable(profile, operator, device, [(cid, "layout_only: no candidate by design")])
    if profile in _PENDING:
        raise CandidateUnavailable(profile, operator, device, [(cid, _PENDING[profile])])
    cand = _PROFILES[profile].get(operator)
    if cand is None:
        raise CandidateUnavailable(
            profile, operator, device, [(cid, "no candidate registered for this operator")]
        )
    hw_reason = _device_reason(cand, device)
    if hw_reason is not None:
        raise CandidateUnavailable(profile, operator, device, [(cid, hw_reason)], hardware_only=True)
    reason = cand.available(device)
    if reason is not None:
        raise CandidateUnavailable(profile, operator, device, [(cid, reason)])
    return cand


def preferred_device(profile: str, operator: str) -> str:
    """Where a run with no explicit device executes ``(profile, operator)``: ``cpu`` or ``cuda``.

    A candidate bound to a device runs there; one that runs anywhere (``any``: the stock baseline) runs on CUDA
    when a CUDA device is present, so a GPU session judges the GPU's stock kernels, not the host's. Operators
    without a candidate go to CUDA when present (their cells say why nothing ran).
    """
    _check_profile(profile)
    cand = _PROFILES.get(profile, {}).get(operator)
    if cand is not None and cand.device != "any":
        return cand.device
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_spec(spec: str) -> str:
    """Import ``module:attr`` and register what it names; return the profile name.

    ``attr`` may be a ``(name, candidates)`` pair, a mapping ``{"name": ..., "candidates": [...]}``, or a
    zero-argument callable returning either.
    """
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise RegistryError(f"registry.load_spec: expected 'module:attr', got {spec!r}")
    mod_name, attr = spec.split(":")
    try:
        obj = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as exc:
        raise RegistryError(f"registry.load_spec: cannot load {spec!r}: {exc}") from exc
    name = _register_object(spec, obj)
    known = {entry["module"] for entry in _PLUGIN_SOURCES.get(name, ())}
    if mod_name not in known:  # the registering module too: it chose the candidates
        _PLUGIN_SOURCES[name] = (*_PLUGIN_SOURCES.get(name, ()), _module_source(name, mod_name))
    return name


def _register_object(where: str, obj: object) -> str:
    if callable(obj) and not isinstance(obj, (tuple, Mapping)):
        obj = obj()
    if isinstance(obj, Mapping):
        obj = (obj.get("name"), obj.get("candidates"))
    if not (isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], str)):
        raise RegistryError(f"registry: {where} must give (name, candidates)")
    register_profile(obj[0], obj[1] or ())
    return obj[0]


def load_entry_points() -> tuple[str, ...]:
    """Register every profile advertised in the ``ws1.candidates`` entry-point group; return their names."""
    names = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _PROFILES:
            continue
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plug-in is a clear error, never a silent skip
            raise RegistryError(f"registry.load_entry_points: {ep.name} = {ep.value}: {exc}") from exc
        names.append(_register_object(f"entry point {ep.name}", obj))
    return tuple(names)


def backend_candidates(
    profile: str, backend: Backend, *, stock: bool = False
) -> tuple[list[Candidate], str | None]:
    """The candidates of a backend under a profile name, or (no candidates, why) when its loader has none.

    The parameter-gradient rule is the backend's, on the operators that take a weight (the spec says which)."""
    entries, why = backend.load()
    params, order = param_operators(), operators()
    unknown = sorted(set(entries) - set(order))
    if unknown:
        raise RegistryError(
            f"registry: profile {profile!r} implements {unknown[0]!r}, which the operator spec lacks"
        )
    return [
        Candidate(
            profile=profile,
            operator=op,
            kernel_id=entry.kernel_id,
            kernel_ids=entry.kernel_ids,
            device=backend.device,
            min_arch=backend.min_arch,
            param_grad_rule=backend.param_grad_rule if op in params else None,
            declared_ops=entry.declared_ops,
            fn=entry.fn,
            available=backend.available,
            stock=stock,
        )
        for op, entry in sorted(entries.items(), key=lambda kv: order.index(kv[0]))
    ], why


def register_backend(name: str, backend: Backend, *, stock: bool = False, replace: bool = False) -> None:
    """Register a profile from a ``Backend`` (the one registration style; ``register_profile`` takes the
    candidates it builds). A backend whose loader has no operator becomes a declared name with its reason."""
    cands, why = backend_candidates(name, backend, stock=stock)
    if not cands:
        declare_profile(name, f"no candidate registered yet ({why or 'the backend loads no operator'})")
        return
    register_profile(name, cands, replace=replace)


# ---- built-in profiles: the operator spec's `profiles:` table ------------------------------------------------


def _register_builtins() -> None:
    """Import each built-in backend's module and register it; a module that is not there (the CUDA extension's
    Python side before it is written) leaves a declared name whose cells say so."""
    for name, entry in spec.shipped_table().profiles.items():
        try:
            mod = importlib.import_module(entry.backend)
        except ModuleNotFoundError as exc:
            if exc.name != entry.backend:
                raise  # the backend exists but something it needs is missing: a bug to see
            declare_profile(name, f"no candidate registered yet (backend module {entry.backend} not written)")
            continue
        backend = getattr(mod, "BACKEND", None)
        if not isinstance(backend, Backend):
            raise RegistryError(f"registry: {entry.backend} (profile {name}) exports no BACKEND")
        register_backend(name, backend, stock=entry.stock)


_register_builtins()
_BUILTIN = frozenset(profiles())
