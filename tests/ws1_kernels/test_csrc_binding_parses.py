"""The binding files (`csrc/ws1_ops.cpp`, and the Hopper extension's `csrc/sm90/ws1_sm90_ops.cpp`) parse against the installed torch's C++ headers (`g++ -fsyntax-only`).

A CPU torch ships the ATen and c10 CUDA headers but not the CUDA libraries' own (cuSPARSE, cuBLAS, cuSOLVER);
the few types its headers name are stubbed here, so a typo in the binding fails CI in seconds, before a GPU
build. It checks syntax and types against the torch API, not a link. The negative control plants an error.
Under `CI=true` a missing g++ fails, never skips.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from cxx_toolchain import CUDA_INCLUDE, require, torch_includes

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "csrc"
#: binding file (relative to csrc/) -> its extension's module name
BINDINGS = {
    "ws1_ops.cpp": "ws1_cuda_ext",
    "sm90/ws1_sm90_ops.cpp": "ws1_cuda_sm90_ext",
    "launch/ws1_launch.cpp": "ws1_launch_ext",
}
GXX = require("cuda_runtime.h")

STUBS = {
    "cusparse.h": "typedef struct cusparseContext* cusparseHandle_t; typedef int cusparseStatus_t;",
    "cublas_v2.h": "typedef struct cublasContext* cublasHandle_t; typedef int cublasStatus_t;",
    "cublasLt.h": '#include "cublas_v2.h"\ntypedef struct cublasLtContext* cublasLtHandle_t;',
    "cusolverDn.h": "typedef struct cusolverDnContext* cusolverDnHandle_t; typedef int cusolverStatus_t;",
    "cusolver_common.h": "typedef int cusolverStatus_t;",
    "c10/cuda/impl/cuda_cmake_macros.h": "",
}


def _parse(src_dir: Path, stubs: Path, binding: str = "ws1_ops.cpp") -> subprocess.CompletedProcess[str]:
    for name, text in STUBS.items():
        (stubs / name).parent.mkdir(parents=True, exist_ok=True)
        (stubs / name).write_text(f"#pragma once\n{text}\n")
    (stubs / "_build_info.h").write_text('#pragma once\n#define WS1_BUILT_TARGETS "syntax-check"\n')
    cmd = [
        GXX,
        "-std=c++17",
        "-fsyntax-only",
        *(f"-I{p}" for p in torch_includes()),
        f"-I{stubs}",
        f"-I{CUDA_INCLUDE}",
        f"-I{sysconfig.get_paths()['include']}",
        f"-I{src_dir}",
        f"-DTORCH_EXTENSION_NAME={BINDINGS[binding]}",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        str(src_dir / binding),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.mark.heavy(seconds=20)
@pytest.mark.parametrize("binding", sorted(BINDINGS))
def test_the_binding_parses(binding: str, tmp_path: Path) -> None:
    proc = _parse(CSRC, tmp_path, binding)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.heavy(seconds=20)
def test_a_planted_binding_error_fails(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(CSRC, src, ignore=shutil.ignore_patterns("build", "_build_info.h"))
    text = (src / "ws1_ops.cpp").read_text()
    planted = text.replace("Tensor y = at::empty_like(x);", "Tensor y = at::empty_like(x, 3, 4, 5);", 1)
    assert planted != text, "the planted error did not land"
    (src / "ws1_ops.cpp").write_text(planted)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    assert _parse(src, stubs).returncode != 0
