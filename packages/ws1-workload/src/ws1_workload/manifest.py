"""Load and check the workload manifest: one YAML file, schema-validated, then checked semantically.

The schema (`contracts/manifest.schema.json`, shipped by ws1_contract) fixes the shape; this module checks
what a schema cannot: the single revision embedded in the workload id, token ids inside every model's vocab,
chunked layouts that really split every tier, hard cases that name inputs the operator spec has.

The chain nodes, their op classes and the built-in profiles are not restated here: they are the operator spec's
(`manifests/operators.yaml`, read by `ws1_contract.operators`), and the workload fingerprint covers both files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from ._contract import OperatorSpec, ProfileEntry, validate_manifest_document
from ._contract import fingerprint as _fingerprint
from ._contract import spec as _spec
from .errors import WorkloadError
from .hardcases import HardCaseSpec, hard_rows_of, parse_hard_cases, token_cases_of

#: The chain nodes of the Qwen3 dense forward, in chain order: the operator spec's shipped operators.
CHAIN_NODES: tuple[str, ...] = _spec.shipped_table().names
TIERS: tuple[str, ...] = ("short", "primary", "long")
PACKAGED_MANIFEST = "qwen3-8b-dense.yaml"

#: Inclusive bounds of each model field. The schema only says "integer >= 1", and it counts 1e23 as an integer;
#: such a width passed `describe` and then crashed weight generation. These bounds hold every dense model
#: ws1 is meant for (Qwen3-8B: hidden 4096, intermediate 12288, vocab 151936) with room to spare, and refuse
#: a typo before any tensor is sized from it.
MODEL_BOUNDS: Mapping[str, tuple[float, float]] = MappingProxyType(
    {
        "num_layers": (1, 1024),
        "hidden": (1, 1 << 16),
        "num_heads": (1, 1024),
        "num_kv_heads": (1, 1024),
        "head_dim": (2, 1024),
        "intermediate": (1, 1 << 18),
        "vocab": (2, 1 << 22),
        "rope_theta": (1.0, 1e12),
        "rms_eps": (1e-12, 1e-1),
    }
)
_INTEGER_FIELDS = frozenset(MODEL_BOUNDS) - {"rope_theta", "rms_eps"}


@dataclass(frozen=True)
class ModelConfig:
    """Qwen3 dense architecture pin. `scale` says whether this is the full model or a reduced-width tier."""

    name: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rope_theta: float
    rms_eps: float
    qk_norm: bool
    tie_word_embeddings: bool
    pad_id: int
    scale: str = "full"


@dataclass(frozen=True)
class InitSpec:
    """Distribution of synthetic weights: embeddings N(0, embed_std), norms N(norm_mean, norm_std),
    projections N(0, linear_gain / sqrt(fan_in))."""

    embed_std: float
    norm_mean: float
    norm_std: float
    linear_gain: float


@dataclass(frozen=True)
class WeightPin:
    """How a model's weights are pinned: synthetic generator seed and init, and the content hashes."""

    model: str
    dtype: str
    seed: int
    init: InitSpec
    content_sha256: str | None
    subset_sha256: Mapping[str, str] | None
    checkpoint_sha256: str | None


@dataclass(frozen=True)
class LayoutSpec:
    name: str
    kind: str  # "training" | "inference"
    type: str  # packed | split | padded | permuted | chunked | decode
    params: Mapping[str, Any]


@dataclass(frozen=True)
class SampleSpec:
    length: int
    prompt_len: int


@dataclass(frozen=True, eq=False)
class Manifest:
    """A validated manifest. `document` is the parsed YAML the fingerprint was computed over."""

    source: str
    document: Mapping[str, Any] = field(repr=False)
    revision: int
    workload_id: str
    fingerprint: str
    description: str
    pad_id: int
    token_id_limit: int
    tiers: tuple[str, ...]
    tier_samples: Mapping[str, tuple[SampleSpec, ...]] = field(repr=False)
    layouts: tuple[LayoutSpec, ...] = field(repr=False)
    models: Mapping[str, ModelConfig] = field(repr=False)
    weight_pins: Mapping[str, WeightPin] = field(repr=False)
    # the hard cases the fixtures must hold (ws1_workload.hardcases)
    hard_cases: Mapping[str, HardCaseSpec] = field(repr=False, default_factory=lambda: MappingProxyType({}))

    @property
    def operators(self) -> Mapping[str, OperatorSpec]:
        """Every operator of this process (the spec's, then any a plug-in registered), in chain order."""
        return _spec.operators()

    @property
    def profiles(self) -> Mapping[str, ProfileEntry]:
        """The built-in backend profiles, as the operator spec names them."""
        return _spec.shipped_table().profiles

    @property
    def hard_rows(self) -> Mapping[str, tuple[str, ...]]:
        """Operator input (`<operator>.<input>`) -> the kinds of hard row it holds."""
        return hard_rows_of(self.hard_cases)

    @property
    def token_cases(self) -> Mapping[str, tuple[str, ...]]:
        """Token probe case (`token_probes.TOKEN_CASES`) -> the operator inputs it edits."""
        return token_cases_of(self.hard_cases)

    def model(self, name: str) -> ModelConfig:
        if name not in self.models:
            raise WorkloadError(
                f"unknown model {name!r} (known: {', '.join(sorted(self.models))})", self.source
            )
        return self.models[name]

    def weights(self, name: str) -> WeightPin:
        self.model(name)
        return self.weight_pins[name]

    def layout(self, name: str) -> LayoutSpec:
        for spec in self.layouts:
            if spec.name == name:
                return spec
        raise WorkloadError(f"unknown layout {name!r}", self.source)

    def samples(self, tier: str) -> tuple[SampleSpec, ...]:
        if tier not in self.tier_samples:
            raise WorkloadError(f"unknown tier {tier!r} (known: {', '.join(self.tiers)})", self.source)
        return self.tier_samples[tier]


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (PyYAML would silently keep the last one)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _read_text(path: str | Path | None) -> tuple[str, str]:
    if path is None:
        ref = resources.files("ws1_workload").joinpath("data", PACKAGED_MANIFEST)
        return f"<packaged {PACKAGED_MANIFEST}>", ref.read_text(encoding="utf-8")
    p = Path(path)
    try:
        return str(p), p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"cannot read manifest: {exc.__class__.__name__}: {exc}", str(p)) from None


def load_manifest(path: str | Path | None = None) -> Manifest:
    """Parse, schema-validate and semantically check a manifest (None = the packaged one)."""
    source, text = _read_text(path)
    try:
        doc = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "yaml"
        problem = getattr(exc, "problem", None) or str(exc)
        raise WorkloadError(f"{where}: invalid YAML: {problem}", source) from None
    if not isinstance(doc, dict):
        raise WorkloadError("manifest must be a mapping at top level", source)
    _check_finite(doc, "$", source)
    validate_manifest_document(doc, source)
    _check_model_bounds(doc, source)
    return _build(doc, source)


def _check_finite(node: Any, path: str, source: str, _open: frozenset[int] = frozenset()) -> None:
    """Refuse NaN and infinities anywhere (`.nan`, `.inf` are valid YAML): the schema's bounds let NaN through,
    and the fingerprint (canonical JSON) cannot hold them. The message names the field.

    Also refuses a node that contains itself (a YAML anchor used inside its own value, `a: &a [*a]`): it once
    ended in a RecursionError traceback."""
    if isinstance(node, float) and not math.isfinite(node):
        raise _fail(source, path, f"must be a finite number, found {node!r}")
    if isinstance(node, (dict, list)):
        if id(node) in _open:
            raise _fail(source, path, "a YAML anchor refers to itself (the document would be infinite)")
        inner = _open | {id(node)}
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            sub = f"{path}.{key}" if isinstance(node, dict) else f"{path}[{key}]"
            _check_finite(value, sub, source, inner)


def _check_model_bounds(doc: Mapping[str, Any], source: str) -> None:
    """Every model field within MODEL_BOUNDS; widths are real integers (not 1e23, which YAML reads as a float)."""
    for name, md in doc["models"].items():
        for key, (low, high) in MODEL_BOUNDS.items():
            value = md[key]
            where = f"$.models.{name}.{key}"
            if key in _INTEGER_FIELDS and not isinstance(value, int):
                raise _fail(source, where, f"must be an integer, found {value!r}")
            if not low <= value <= high:
                raise _fail(source, where, f"{value!r} is outside the range [{low:g}, {high:g}] ws1 accepts")


def _fail(source: str, path: str, message: str) -> WorkloadError:
    return WorkloadError(f"{path}: {message}", source)


def _build(doc: dict[str, Any], source: str) -> Manifest:
    revision = int(doc["revision"])
    workload_id = str(doc["workload_id"])
    embedded = int(workload_id.rsplit(".r", 1)[1])
    if embedded != revision:
        raise _fail(
            source,
            "$.workload_id",
            f"workload id {workload_id!r} embeds revision {embedded}, manifest revision is {revision}",
        )

    fx = doc["fixtures"]
    pad_id, limit = int(fx["pad_id"]), int(fx["token_id_limit"])
    models: dict[str, ModelConfig] = {}
    pins: dict[str, WeightPin] = {}
    for name, md in doc["models"].items():
        where = f"$.models.{name}"
        if md["num_heads"] % md["num_kv_heads"]:
            raise _fail(
                source,
                where,
                f"num_heads {md['num_heads']} is not a multiple of num_kv_heads {md['num_kv_heads']}",
            )
        if pad_id >= md["vocab"] or limit > md["vocab"]:
            raise _fail(
                source,
                "$.fixtures",
                f"pad_id {pad_id} / token_id_limit {limit} outside the vocab {md['vocab']} of model {name!r}",
            )
        models[name] = ModelConfig(
            name=name,
            num_layers=md["num_layers"],
            hidden=md["hidden"],
            num_heads=md["num_heads"],
            num_kv_heads=md["num_kv_heads"],
            head_dim=md["head_dim"],
            intermediate=md["intermediate"],
            vocab=md["vocab"],
            rope_theta=float(md["rope_theta"]),
            rms_eps=float(md["rms_eps"]),
            qk_norm=bool(md["qk_norm"]),
            tie_word_embeddings=bool(md["tie_word_embeddings"]),
            pad_id=pad_id,
            scale=md["scale"],
        )
        w, syn = md["weights"], md["weights"]["synthetic"]
        subset = syn.get("subset_sha256")
        pins[name] = WeightPin(
            model=name,
            dtype=w["dtype"],
            seed=int(syn["seed"]),
            init=InitSpec(**{k: float(v) for k, v in syn["init"].items()}),
            content_sha256=syn.get("content_sha256"),
            subset_sha256=MappingProxyType(dict(subset)) if subset is not None else None,
            checkpoint_sha256=w["checkpoint_sha256"],
        )
    if not any(cfg.scale == "full" for cfg in models.values()):
        raise _fail(source, "$.models", "no model has scale 'full'")

    tier_samples: dict[str, tuple[SampleSpec, ...]] = {}
    for tier in TIERS:
        specs = []
        for i, s in enumerate(fx["tiers"][tier]["samples"]):
            if s["prompt_len"] >= s["length"]:
                raise _fail(
                    source,
                    f"$.fixtures.tiers.{tier}.samples[{i}]",
                    f"prompt_len {s['prompt_len']} leaves no completion token in length {s['length']}",
                )
            specs.append(SampleSpec(length=int(s["length"]), prompt_len=int(s["prompt_len"])))
        tier_samples[tier] = tuple(specs)

    layouts = []
    seen: set[str] = set()
    for i, ld in enumerate(doc["layouts"]):
        where = f"$.layouts[{i}]"
        if ld["name"] in seen:
            raise _fail(source, where, f"duplicate layout name {ld['name']!r}")
        seen.add(ld["name"])
        if ld["type"] == "chunked":
            size = int(ld["params"]["chunk_size"])
            for tier, tier_specs in tier_samples.items():
                longest = max(s.length for s in tier_specs)
                if math.ceil(longest / size) < 2:
                    raise _fail(
                        source, where, f"chunk_size {size} gives fewer than 2 chunks on tier {tier!r}"
                    )
                if all(s.length % size == 0 for s in tier_specs):
                    raise _fail(source, where, f"chunk_size {size} divides every length of tier {tier!r}")
        layouts.append(
            LayoutSpec(
                name=ld["name"], kind=ld["kind"], type=ld["type"], params=MappingProxyType(dict(ld["params"]))
            )
        )
    if not any(spec.type == "packed" for spec in layouts):
        raise _fail(source, "$.layouts", "no canonical 'packed' layout")

    return Manifest(
        source=source,
        document=MappingProxyType(doc),
        revision=revision,
        workload_id=workload_id,
        fingerprint=_fingerprint(doc),
        description=str(doc["description"]),
        pad_id=pad_id,
        token_id_limit=limit,
        tiers=TIERS,
        tier_samples=MappingProxyType(tier_samples),
        layouts=tuple(layouts),
        models=MappingProxyType(models),
        weight_pins=MappingProxyType(pins),
        hard_cases=parse_hard_cases(fx["hard_cases"], CHAIN_NODES, source),
    )
