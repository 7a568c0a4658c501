"""The preamble of a GPU test module that needs a CUDA device and nothing built: one place, so every such module
skips (or, in a GPU session, fails) the same way."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch


def skip_module_without_cuda(*modules: str) -> None:
    """Skip the calling module when one of ``modules`` is missing or no CUDA device is visible; with
    ``WS1_REQUIRE_GPU=1`` (a GPU session) a missing device is an error, never a skip."""
    for name in modules:
        pytest.importorskip(name)
    if not torch.cuda.is_available():
        if os.environ.get("WS1_REQUIRE_GPU") == "1":
            raise RuntimeError("WS1_REQUIRE_GPU=1: no CUDA device")
        pytest.skip("no CUDA device", allow_module_level=True)


def skip_module_without_hopper() -> None:
    """Skip the calling module unless the Hopper extension is built and the device is capability 9.0; in a GPU
    session (``WS1_REQUIRE_GPU=1``) whose build holds 9.0a, a missing Hopper module or device is an error."""
    from ws1_kernels import cuda, cuda_sm90

    if cuda_sm90.missing_reason() is not None or not torch.cuda.is_available():
        why = cuda_sm90.missing_reason() or "no CUDA device"
        if os.environ.get("WS1_REQUIRE_GPU") == "1":
            # a session that built 9.0a, or whose path holds the Hopper module itself (a call that built only it
            # once skipped every Hopper test here, silently): its Hopper tests must run
            if "9.0a" in cuda.built_targets():
                raise RuntimeError(f"WS1_REQUIRE_GPU=1 with a 9.0a build: {why}")
            if importlib.util.find_spec(cuda_sm90.EXTENSION) is not None:
                raise RuntimeError(f"WS1_REQUIRE_GPU=1 with {cuda_sm90.EXTENSION} on the path: {why}")
        pytest.skip(str(why), allow_module_level=True)
    if torch.cuda.get_device_capability() != cuda_sm90.CAPABILITY:
        pytest.skip("the Hopper kernels run on capability 9.0 only", allow_module_level=True)


def skip_module_without_extension() -> None:
    """Skip the calling module when ws1's CUDA extension is not built; in a GPU session (``WS1_REQUIRE_GPU=1``) a
    missing extension is an error, never a skip."""
    from ws1_kernels import cuda

    if cuda.extension() is None:
        if os.environ.get("WS1_REQUIRE_GPU") == "1":
            raise RuntimeError(f"WS1_REQUIRE_GPU=1: {cuda.missing_reason()}")
        pytest.skip(str(cuda.missing_reason()), allow_module_level=True)
