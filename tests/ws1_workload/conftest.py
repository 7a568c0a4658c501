"""Shared fixtures for the ws1_workload tests: the packaged manifest, tiny synthetic weights, a manifest editor."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from ws1_workload import Manifest, load_manifest, synthetic_weights

REPO = Path(__file__).resolve().parents[2]
SOURCE_MANIFEST = REPO / "manifests" / "qwen3-8b-dense.yaml"


@pytest.fixture(scope="session")
def source_manifest() -> Path:
    return SOURCE_MANIFEST


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def manifest() -> Manifest:
    return load_manifest(SOURCE_MANIFEST)


@pytest.fixture(scope="session")
def tiny_weights(manifest: Manifest) -> dict[str, torch.Tensor]:
    return synthetic_weights(manifest, "tiny")


@pytest.fixture
def write_manifest(tmp_path: Path) -> Callable[[Callable[[dict[str, Any]], None]], Path]:
    """Write a copy of the source manifest after `edit(doc)` mutates it; returns the path."""

    def make(edit: Callable[[dict[str, Any]], None]) -> Path:
        doc = yaml.safe_load(SOURCE_MANIFEST.read_text(encoding="utf-8"))
        edit(doc)
        path = tmp_path / "manifest.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        return path

    return make


@pytest.fixture(scope="session")
def hf_tiny(manifest: Manifest, tiny_weights: dict[str, torch.Tensor]) -> Any:
    """HF transformers' Qwen3ForCausalLM for the tiny model, fp32, eager attention, our synthetic weights."""
    transformers = pytest.importorskip("transformers")
    cfg = manifest.model("tiny")
    hc = transformers.Qwen3Config(
        vocab_size=cfg.vocab,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        rms_norm_eps=cfg.rms_eps,
        tie_word_embeddings=cfg.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        attention_bias=False,
        max_position_embeddings=4096,
        attn_implementation="eager",
    )
    model = transformers.Qwen3ForCausalLM(hc).float().eval()
    model.load_state_dict({k: v.float() for k, v in tiny_weights.items()}, strict=True)
    return model
