"""The preamble of a GPU test module that needs a CUDA device and nothing built: one place, so every such module
skips (or, in a GPU session, fails) the same way."""

from __future__ import annotations

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
