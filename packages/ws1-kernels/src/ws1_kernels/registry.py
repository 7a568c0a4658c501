"""Registry: ``(profile, operator) -> Candidate``, fail-closed.

``resolve`` returns a candidate that can run on the requested device or raises ``CandidateUnavailable`` listing
every candidate it considered and why each was rejected; nothing falls back to another profile or operator.
Plug-ins register whole profiles (``register_profile``), through the ``ws1.candidates`` entry-point group
(``load_entry_points``) or a ``module:attr`` spec (``load_spec``, for a CLI ``--candidates``); they are judged
exactly like the built-in ones.
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

from . import native, portable
from ._declared import NATIVE_OPS, PORTABLE_OPS
from .errors import CandidateUnavailable, RegistryError

OPERATORS: tuple[str, ...] = (
    "embedding",
    "rms_norm",
    "qk_norm",
    "det_gemm",
    "rope",
    "attention",
    "silu",
    "swiglu",
    "lm_head",
    "logp",
    "linear_logp",
    "pack",
)
LAYOUT_ONLY: frozenset[str] = frozenset({"pack"})
PARAM_GRAD_RULES: frozenset[str] = frozenset({"sample_blocks_main_grad", "autograd_accumulate"})
ENTRY_POINT_GROUP = "ws1.candidates"
# operators with a weight parameter (param_grad_rule applies); the others declare None
PARAM_OPERATORS: frozenset[str] = frozenset(
    {"embedding", "rms_norm", "qk_norm", "det_gemm", "lm_head", "linear_logp"}
)


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
        if self.operator not in OPERATORS or self.operator in LAYOUT_ONLY:
            raise RegistryError(f"{where}: unknown or layout-only operator {self.operator!r}")
        if self.device not in ("cpu", "cuda", "any"):
            raise RegistryError(f"{where}: device must be cpu, cuda or any, got {self.device!r}")
        if self.min_arch is not None and not re.fullmatch(r"sm\d{2,3}a?", self.min_arch):
            raise RegistryError(f"{where}: min_arch must look like 'sm90', got {self.min_arch!r}")
        expected_rule = self.operator in PARAM_OPERATORS
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
    if operator not in OPERATORS:
        raise RegistryError(f"registry: unknown operator {operator!r} (known: {', '.join(OPERATORS)})")
    try:
        torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise RegistryError(f"registry: bad device {device!r}") from exc
    cid = f"{profile}.{operator}"
    if operator in LAYOUT_ONLY:
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


# ---- built-in profiles -----------------------------------------------------------------------------------

_P = portable
# declared_ops: aten overload packets each candidate may dispatch (forward and backward), recorded over every
# layout type (tests/ws1_kernels/test_registry.py::test_launch_log_and_declared_ops re-checks them). One entry per
# operator of OPERATORS but the layout-only ones (tests/ws1_harness/test_harness_operator_lists_agree.py checks)
_PORTABLE_FNS: dict[str, tuple[Callable[..., Any], str]] = {
    "embedding": (_P.embedding, "ws1.cpu.embedding.gather"),
    "rms_norm": (_P.rms_norm, "ws1.cpu.rms_norm.rowwise"),
    "qk_norm": (_P.qk_norm, "ws1.cpu.qk_norm.rowwise"),
    "det_gemm": (_P.det_gemm, _P.linear.DET_GEMM_KERNEL),
    "rope": (_P.rope, "ws1.cpu.rope.rotate_half"),
    "attention": (_P.attention, "ws1.cpu.attention.fixed_keyblock"),
    "silu": (_P.silu, "ws1.cpu.silu.pointwise"),
    "swiglu": (_P.swiglu, "ws1.cpu.swiglu.pointwise"),
    "lm_head": (_P.lm_head, _P.linear.LM_HEAD_KERNEL),
    "logp": (_P.logp, "ws1.cpu.logp.rowwise"),
    "linear_logp": (_P.linear_logp, "ws1.cpu.linear_logp.vocabblock"),
}

register_profile(
    "portable_cpu",
    [
        Candidate(
            profile="portable_cpu",
            operator=op,
            kernel_id=kid,
            device="cpu",
            min_arch=None,
            param_grad_rule="sample_blocks_main_grad" if op in PARAM_OPERATORS else None,
            declared_ops=PORTABLE_OPS[op],
            fn=fn,
        )
        for op, (fn, kid) in _PORTABLE_FNS.items()
    ],
)

register_profile(
    "native_torch",
    [
        Candidate(
            profile="native_torch",
            operator=op,
            kernel_id=f"ws1.native.{op}",
            device="any",
            min_arch=None,
            param_grad_rule="autograd_accumulate" if op in PARAM_OPERATORS else None,
            declared_ops=NATIVE_OPS[op],
            fn=getattr(native, op),
            stock=True,
        )
        for op in OPERATORS
        if op not in LAYOUT_ONLY
    ],
)


def _register_triton() -> None:
    """Register the Triton profile with every operator whose module exists; the others resolve red."""
    from . import triton_ops

    found, missing = triton_ops.load_ops()
    if not found:
        why = "; ".join(sorted(set(missing.values()))) or "no operator module"
        declare_profile(triton_ops.PROFILE, f"no candidate registered yet ({why})")
        return
    register_profile(
        triton_ops.PROFILE,
        [
            Candidate(
                profile=triton_ops.PROFILE,
                operator=op,
                kernel_id=spec.kernel_id,
                kernel_ids=spec.kernel_ids,
                device="cuda",
                min_arch=triton_ops.MIN_ARCH,
                param_grad_rule="sample_blocks_main_grad" if op in PARAM_OPERATORS else None,
                declared_ops=spec.declared_ops,
                fn=spec.fn,
            )
            for op, spec in found.items()
        ],
    )


_register_triton()
declare_profile("cuda_bf16", "no candidate registered yet (needs CUDA sm80 and the ws1 extension)")
declare_profile("cuda_bf16_sm90", "no candidate registered yet; needs CUDA sm90")
_BUILTIN = frozenset(profiles())
