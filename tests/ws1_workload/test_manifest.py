"""The manifest: schema-validated, semantically checked, pinned to Qwen3-8B, fingerprinted over every key."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from ws1_contract import load_schema
from ws1_workload import CHAIN_NODES, WorkloadError, load_manifest
from ws1_workload.manifest import TIERS


def test_packaged_manifest_is_the_source(manifest):
    packaged = load_manifest()
    assert packaged.fingerprint == manifest.fingerprint
    assert packaged.fingerprint.startswith("sha256:") and len(packaged.fingerprint) == 71


def test_schema_is_strict_draft_2020_12(repo_root):
    schema = load_schema("manifest")
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["schema_version"] == {"const": 1}
    assert schema["additionalProperties"] is False
    assert (repo_root / "contracts" / "manifest.schema.json").read_text() == (
        repo_root / "packages/ws1-contract/src/ws1_contract/data/manifest.schema.json"
    ).read_text()


def test_full_model_pin(manifest):
    cfg = manifest.model("qwen3-8b")
    got = (
        cfg.num_layers,
        cfg.hidden,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.intermediate,
        cfg.vocab,
        cfg.rope_theta,
        cfg.rms_eps,
        cfg.qk_norm,
        cfg.tie_word_embeddings,
        cfg.scale,
    )
    assert got == (36, 4096, 32, 8, 128, 12288, 151936, 1e6, 1e-6, True, False, "full")


def test_tiny_model_is_a_reduced_tier_of_the_same_topology(manifest):
    full, tiny = manifest.model("qwen3-8b"), manifest.model("tiny")
    assert tiny.scale == "reduced"
    assert tiny.num_heads // tiny.num_kv_heads == full.num_heads // full.num_kv_heads == 4
    assert tiny.head_dim == full.head_dim == 128
    assert tiny.vocab > 4 * 1024 and tiny.vocab % 1024 != 0  # spans several 1024-wide blocks, ragged end
    assert (tiny.qk_norm, tiny.tie_word_embeddings) == (full.qk_norm, full.tie_word_embeddings)


def test_tiers_layouts_and_operators(manifest):
    assert manifest.tiers == TIERS == ("short", "primary", "long")
    kinds = {s.name: (s.kind, s.type) for s in manifest.layouts}
    assert kinds["packed"] == ("training", "packed")
    assert kinds["chunked"] == ("inference", "chunked") and kinds["decode"] == ("inference", "decode")
    assert {s.type for s in manifest.layouts} == {
        "packed",
        "split",
        "padded",
        "permuted",
        "chunked",
        "decode",
    }
    assert {s.params.get("side") for s in manifest.layouts if s.type == "padded"} == {"right", "left"}
    assert tuple(manifest.operators) == CHAIN_NODES
    classes = {n: op.op_class for n, op in manifest.operators.items()}
    assert classes == {
        "embedding": "elementwise",
        "rms_norm": "reduction",
        "qk_norm": "reduction",
        "det_gemm": "gemm",
        "rope": "elementwise",
        "attention": "attention",
        "silu": "elementwise",
        "swiglu": "elementwise",
        "lm_head": "gemm",
        "logp": "logprob",
        "linear_logp": "logprob",
        "pack": None,
    }
    assert manifest.operators["pack"].layout_only and manifest.operators["linear_logp"].optional


def test_profiles_are_the_operator_specs(manifest):
    """The manifest no longer restates the backends: its profiles are the spec's names and stock flags."""
    assert set(manifest.profiles) == {
        "portable_cpu",
        "native_torch",
        "triton_cuda_bf16",
        "cuda_bf16",
        "cuda_bf16_sm90",
    }
    assert [n for n, p in manifest.profiles.items() if p.stock] == ["native_torch"]
    assert "profiles" not in manifest.document and "operators" not in manifest.document


def test_fingerprint_covers_every_key(manifest, write_manifest):
    def edit(doc):
        doc["layouts"][6]["params"]["chunk_size"] = 7

    assert load_manifest(write_manifest(edit)).fingerprint != manifest.fingerprint
    same = load_manifest(write_manifest(lambda doc: None))
    assert same.fingerprint == manifest.fingerprint  # comments and key order do not matter


def _raises(path: Path, needle: str) -> str:
    with pytest.raises(WorkloadError) as info:
        load_manifest(path)
    text = str(info.value)
    assert "\n" not in text and needle in text, text
    return text


def test_revision_mismatch_is_an_error(write_manifest):
    _raises(write_manifest(lambda d: d.update(revision=d["revision"] + 1)), "embeds revision")


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda d: d.update(extra_key=1), "extra_key"),
        (lambda d: d.update(schema_version=2), "schema_version"),
        (lambda d: d["models"]["tiny"].pop("vocab"), "vocab"),
        (
            lambda d: d["layouts"].append(
                {"name": "bad", "kind": "training", "type": "chunked", "params": {"chunk_size": 5}}
            ),
            "layouts",
        ),
        (lambda d: d.update(operators={"silu": {}}), "operators"),
    ],
    ids=["unknown-key", "schema-version", "missing-field", "chunked-as-training", "restated-operators"],
)
def test_schema_violations(write_manifest, edit, needle):
    _raises(write_manifest(edit), needle)


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda d: d["fixtures"].update(token_id_limit=6000), "outside the vocab"),
        (lambda d: d["models"]["tiny"].update(num_kv_heads=3), "not a multiple"),
        (
            lambda d: d["fixtures"]["tiers"]["short"]["samples"][0].update(prompt_len=17),
            "no completion token",
        ),
        (lambda d: d["layouts"][6]["params"].update(chunk_size=20), "fewer than 2 chunks"),
        (lambda d: d["layouts"].append(copy.deepcopy(d["layouts"][0])), "duplicate layout"),
    ],
    ids=[
        "token-limit",
        "gqa",
        "no-completion",
        "one-chunk",
        "dup-layout",
    ],
)
def test_semantic_violations(write_manifest, edit, needle):
    _raises(write_manifest(edit), needle)


def test_yaml_errors_are_one_line(tmp_path, source_manifest):
    bad = tmp_path / "m.yaml"
    bad.write_text("revision: [1\n", encoding="utf-8")
    _raises(bad, "invalid YAML")
    dup = tmp_path / "d.yaml"
    dup.write_text(source_manifest.read_text() + "\nrevision: 1\n", encoding="utf-8")
    _raises(dup, "duplicate key")
    _raises(tmp_path / "absent.yaml", "cannot read manifest")


def test_unknown_names_raise(manifest):
    for call in (
        lambda: manifest.model("qwen3-9b"),
        lambda: manifest.samples("huge"),
        lambda: manifest.layout("zigzag"),
    ):
        with pytest.raises(WorkloadError):
            call()


def test_source_manifest_is_plain_yaml(source_manifest):
    assert isinstance(yaml.safe_load(source_manifest.read_text()), dict)


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("hidden", 1e23, "must be an integer, found 1e+23"),
        ("hidden", 10**23, "outside the range"),
        ("vocab", 1 << 40, "outside the range"),
        ("num_layers", 100_000, "outside the range"),
        ("rms_eps", float("nan"), "must be a finite number, found nan"),
        ("rope_theta", float("inf"), "must be a finite number, found inf"),
        ("rms_eps", 0.5, "outside the range"),
    ],
    ids=["float-width", "huge-width", "huge-vocab", "huge-depth", "nan-eps", "inf-theta", "eps-too-big"],
)
def test_model_fields_are_bounded_and_name_file_and_field(write_manifest, field, value, needle):
    """`hidden: 1e23` passed the schema (it counts an integral float as an integer) and `describe`, then crashed
    weight generation; `.nan` / `.inf` gave a message naming neither file nor field."""
    path = write_manifest(lambda d: d["models"]["tiny"].update({field: value}))
    with pytest.raises(WorkloadError) as info:
        load_manifest(path)
    assert str(info.value).startswith(f"{path}: $.models.tiny.{field}: "), str(info.value)
    assert needle in str(info.value)


def test_every_model_of_the_shipped_manifest_is_inside_the_bounds(manifest):
    """The negative control of the bounds above: the real widths pass them."""
    from ws1_workload.manifest import MODEL_BOUNDS

    for cfg in manifest.models.values():
        for field, (low, high) in MODEL_BOUNDS.items():
            assert low <= getattr(cfg, field) <= high, (cfg.name, field)
