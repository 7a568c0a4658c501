"""Session-wide test policy.

A GPU session sets WS1_REQUIRE_GPU=1: then a missing GPU turns every `gpu` test into an error instead of a
skip, so a GPU job can never go green on an empty run. CPU sessions deselect `gpu` with `-m "not gpu"`.
"""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse to skip GPU tests in a session that promised a GPU."""
    if os.environ.get("WS1_REQUIRE_GPU") != "1":
        return
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu and any(item.get_closest_marker("gpu") for item in items):
        raise pytest.UsageError("WS1_REQUIRE_GPU=1 but no CUDA GPU is visible: refusing to skip gpu tests")


@pytest.fixture(scope="session")
def tiny_one_layer():  # type: ignore[no-untyped-def]
    """(manifest, tiny ModelConfig cut to one layer, its synthetic weights, the short fixture): the whole-model
    tests' smallest model (the drop-in, the chain watch)."""
    import dataclasses

    from ws1_workload import build_fixture, load_manifest, synthetic_weights, tensor_shapes

    m = load_manifest()
    cfg = dataclasses.replace(m.model("tiny"), num_layers=1)
    weights = synthetic_weights(m, "tiny", names=tensor_shapes(cfg))
    return m, cfg, weights, build_fixture(m, "short", "tiny")
