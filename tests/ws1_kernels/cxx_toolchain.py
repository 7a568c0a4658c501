"""The host C++ toolchain that the CPU checks of `csrc/` compile with: g++, the CUDA toolkit's headers, and the
installed torch's include folders. A test module calls `require(header)` first: without g++ or that header it
skips, except under `CI=true`, where the check must run and a missing tool is an error."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

GXX = shutil.which("g++")
CUDA_INCLUDE = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"


def require(header: str) -> str:
    """g++'s path, once it and `CUDA_INCLUDE/header` exist (else skip the module; under CI=true, raise)."""
    if GXX is None or not (CUDA_INCLUDE / header).is_file():
        if os.environ.get("CI") == "true":
            raise RuntimeError(
                f"CI=true: g++ or {CUDA_INCLUDE}/{header} is missing: the C++ check cannot run"
            )
        pytest.skip("g++ or the CUDA toolkit headers are missing", allow_module_level=True)
    assert GXX is not None
    return GXX


def torch_root() -> Path:
    """The installed torch's package folder (its `include/` and `lib/`)."""
    import torch

    return Path(torch.__file__).resolve().parent


def torch_includes() -> list[Path]:
    """torch's C++ include folders (what torch.utils.cpp_extension.include_paths names, without importing it: that
    module needs setuptools)."""
    root = torch_root() / "include"
    return [root, root / "torch" / "csrc" / "api" / "include"]
