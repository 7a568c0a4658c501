"""Session-wide test policy.

A GPU session sets WS1_REQUIRE_GPU=1: then a missing GPU turns every `gpu` test into an error instead of a
skip, so a GPU job can never go green on an empty run. CPU sessions deselect `gpu` with `-m "not gpu"`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: the marker of a test file that needs the CUDA extension built from csrc/ (pyproject.toml registers it)
NEEDS_BUILD = "pytest.mark.needs_build"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With `WS1_COLLECT_WITHOUT_BUILD=1` (the GPU session's tests that run while csrc/ compiles) a test file marked
    `needs_build` is not even imported: it would load the extension the compiler is still writing."""
    if os.environ.get("WS1_COLLECT_WITHOUT_BUILD") != "1" or collection_path.suffix != ".py":
        return None
    try:
        return True if NEEDS_BUILD in collection_path.read_text(encoding="utf-8") else None
    except OSError:
        return None


@pytest.fixture(scope="session", autouse=True)
def _forced_cpu_path_taken() -> None:
    """A worker of the forced-CPU-path run (noxfile `forced_path_args`) must run on the path it was given: its
    variables are set in the worker process before torch loads, and this checks that torch took the ATen path
    (every test of a worker on another path errors)."""
    want = os.environ.get("WS1_EXPECT_CPU_CAPABILITY")
    if not want:
        return
    import torch

    have = str(torch.backends.cpu.get_cpu_capability())
    if have.lower() != want.lower():
        raise RuntimeError(
            f"WS1_EXPECT_CPU_CAPABILITY={want} but torch runs the {have} CPU path: the forced path did not take"
        )


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # type: ignore[no-untyped-def]
    """Tell each pytest-xdist worker how the run distributes its tests: a worker's own `dist` option reads "no"."""
    node.workerinput["ws1_dist"] = node.config.getoption("dist")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Heavy tests first under work stealing (tests/heavy_order.py); refuse to skip GPU tests in a session that
    promised a GPU."""
    worker = getattr(config, "workerinput", {})
    workers = int(worker.get("workercount", 1))
    if workers > 1 and worker.get("ws1_dist") == "worksteal":
        from heavy_order import heavy_first  # beside this file (tests/ is on sys.path, as for repo_scripts)

        items[:] = heavy_first(items, workers)
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


@pytest.fixture(scope="module", autouse=True)
def _return_gpu_memory_after_each_module():  # type: ignore[no-untyped-def]
    """Hand the CUDA caching allocator's free blocks back after each test module.

    Why: the GPU sessions run the tests beside the matrices on one card, and a test process that kept every block
    it ever cached held 42 GB of an 80 GB H100 while a full-width lm_head matrix beside it ran out of memory.
    Nothing is done where torch was never imported or CUDA never initialised (the CPU runs)."""
    yield
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
