"""Every header-light kernel file of `csrc/kernels/` compiles with nvcc for sm_86 and for sm_90a (compile only).

The CPU CI has nvcc and no GPU: a kernel that does not compile fails here in minutes, before any GPU time. Under
`CI=true` a missing nvcc is a failure, never a skip. The negative control plants a compile error in a copy of a
kernel file and must see nvcc fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KERNELS = sorted((REPO / "csrc" / "kernels").glob("*.cu"))
TARGETS = {
    "sm_86": "-gencode=arch=compute_86,code=sm_86",
    "sm_90a": "-gencode=arch=compute_90a,code=sm_90a",
}
NVCC = shutil.which("nvcc")

if NVCC is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI=true: nvcc is not on PATH, so csrc/ cannot be compile-checked")
    pytest.skip("nvcc is not on PATH", allow_module_level=True)


def _compile(src: Path, target: str, out: Path) -> subprocess.CompletedProcess[str]:
    assert NVCC is not None
    cmd = [NVCC, "-c", "-O3", "-std=c++17", TARGETS[target], "-I", str(src.parent), "-o", str(out), str(src)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_there_are_kernel_files() -> None:
    assert KERNELS, "csrc/kernels/ holds no .cu file"


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("src", KERNELS, ids=lambda p: p.name)
def test_kernel_file_compiles(src: Path, target: str, tmp_path: Path) -> None:
    proc = _compile(src, target, tmp_path / f"{src.stem}.o")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / f"{src.stem}.o").stat().st_size > 0


def test_a_planted_compile_error_fails(tmp_path: Path) -> None:
    src = REPO / "csrc" / "kernels" / "pointwise.cu"
    for header in (REPO / "csrc" / "kernels").glob("*.h"):
        shutil.copy(header, tmp_path / header.name)
    broken = tmp_path / "pointwise.cu"
    broken.write_text(
        src.read_text().replace("return 1.0f / (1.0f + expf(-x));", "return 1.0f / (1.0f + expf(-x))")
    )
    assert broken.read_text() != src.read_text(), "the planted error did not land"
    proc = _compile(broken, "sm_86", tmp_path / "broken.o")
    assert proc.returncode != 0
