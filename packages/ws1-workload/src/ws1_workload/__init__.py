"""ws1 canonical workload: manifest, fixtures, physical layouts with restore."""

from __future__ import annotations

from .errors import LayoutError, WorkloadError
from .fixtures import Fixture, Sample, build_fixture, make_fixture, next_token_targets
from .inputs import logical_tensor
from .layouts import Layout, PhysicalCall, build_layout
from .manifest import (
    CHAIN_NODES,
    InitSpec,
    LayoutSpec,
    Manifest,
    ModelConfig,
    OperatorSpec,
    SampleSpec,
    WeightPin,
    load_manifest,
)
from .restore import call_rows, restore, sample_runs
from .weights import (
    CheckpointReport,
    content_sha256,
    iter_synthetic_weights,
    load_checkpoint,
    synthetic_weights,
    tensor_shapes,
    verify_checkpoint,
)

__all__ = [
    "CHAIN_NODES",
    "CheckpointReport",
    "Fixture",
    "InitSpec",
    "Layout",
    "LayoutError",
    "LayoutSpec",
    "Manifest",
    "ModelConfig",
    "OperatorSpec",
    "PhysicalCall",
    "Sample",
    "SampleSpec",
    "WeightPin",
    "WorkloadError",
    "build_fixture",
    "build_layout",
    "content_sha256",
    "iter_synthetic_weights",
    "load_checkpoint",
    "load_manifest",
    "logical_tensor",
    "make_fixture",
    "next_token_targets",
    "restore",
    "call_rows",
    "sample_runs",
    "synthetic_weights",
    "tensor_shapes",
    "verify_checkpoint",
]
