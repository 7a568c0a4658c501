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
    from ws1_kernels.integrations.qwen3 import qwen3_config

    hc = qwen3_config(manifest.model("tiny"), attn_implementation="eager")
    model = transformers.Qwen3ForCausalLM(hc).float().eval()
    model.load_state_dict({k: v.float() for k, v in tiny_weights.items()}, strict=True)
    return model
