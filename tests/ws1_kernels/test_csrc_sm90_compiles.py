"""The Hopper kernels (`csrc/sm90/*.cu`) compile with nvcc for sm_90a against CUTLASS's headers (compile only).

The CPU CI has nvcc and no GPU: a Hopper file that does not compile fails here, before any GPU time. The flags are
`csrc/setup.py`'s own (`SM90_NVCC`), and so is the header lookup (`cutlass_includes`: the `nvidia-cutlass` wheel,
which `nox -s cpu_contract` installs). Under `CI=true` a missing nvcc or missing headers fail, never skip. Each file
must also compile with no wgmma serialised by ptxas. The negative controls plant an error in a copy of the
dispatcher and must see nvcc fail, and plant a serialising change in a copy of the weight gradient and must see
ptxas report it. Each bucket file takes
about 45 s on two cores (CUTLASS's templates).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from repo_scripts import load_repo_script

REPO = Path(__file__).resolve().parents[2]
SM90 = REPO / "csrc" / "sm90"
NVCC = shutil.which("nvcc")
SETUP = load_repo_script("csrc/setup.py", "ws1_csrc_setup")  # main() runs only as a script
INCLUDES: list[str] = SETUP.cutlass_includes()

if NVCC is None or not INCLUDES:
    missing = (
        "nvcc is not on PATH" if NVCC is None else "CUTLASS's headers (the nvidia-cutlass wheel) are missing"
    )
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"CI=true: {missing}, so csrc/sm90/ cannot be compile-checked")
    pytest.skip(missing, allow_module_level=True)


def _compile(src: Path, out: Path) -> subprocess.CompletedProcess[str]:
    assert NVCC is not None
    flags = [f for f in SETUP.SM90_NVCC if not f.startswith("-U")]  # torch's -D flags are absent here
    cmd = [
        NVCC,
        "-c",
        "-O3",
        *flags,
        "-I",
        str(REPO / "csrc"),
        "-I",
        str(SM90),
        *(f"-I{p}" for p in INCLUDES),
    ]
    return subprocess.run([*cmd, "-o", str(out), str(src)], capture_output=True, text=True, timeout=900)


def test_there_is_a_file_per_bucket() -> None:
    names = {p.name for p in SM90.glob("*.cu")}
    assert {"gemm_sm90.cu", "gemm_sm90_small.cu", "gemm_sm90_mid.cu", "gemm_sm90_large.cu"} <= names


def _cutlass_kernel(src: Path) -> bool:
    """Whether the file instantiates a CUTLASS kernel (through gemm_sm90.cuh, or linear_logp_sm90.cuh which includes
    it): those take 35-90 s to compile."""
    text = src.read_text()
    return '#include "gemm_sm90.cuh"' in text or '#include "linear_logp_sm90.cuh"' in text


@pytest.mark.parametrize(
    "src",
    [
        pytest.param(p, marks=[pytest.mark.heavy(seconds=50)] if _cutlass_kernel(p) else [])
        for p in sorted(SM90.glob("*.cu"))
    ],
    ids=lambda p: p.name,
)
def test_hopper_file_compiles_for_sm90a(src: Path, tmp_path: Path) -> None:
    proc = _compile(src, tmp_path / f"{src.stem}.o")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not _serialised(proc.stderr), "ptxas serialises wgmma:\n" + "\n".join(_serialised(proc.stderr))
    assert (tmp_path / f"{src.stem}.o").stat().st_size > 0


#: ptxas's note when it makes the wgmma of a function wait for each other (C7510: an assert or a call in the
#: mainloop; C7511: too few registers for the pipeline; C7514: other instructions touching the accumulators between
#: a stage's MMAs; and its siblings), printed with or without -v: the kernel still runs, far slower
SERIALISED = "wgmma.mma_async instructions are serialized"


def _serialised(stderr: str) -> list[str]:
    return [line.strip() for line in stderr.splitlines() if SERIALISED in line]


@pytest.mark.heavy(seconds=40)
def test_a_planted_wgmma_serialisation_is_seen(tmp_path: Path) -> None:
    """The weight gradient's fragment loaded from main_grad 8 bytes at a time (an experiment that was dropped) makes
    ptxas serialise the wgmma (C7511); the check must see it. The control is the shipped file, which the test above
    compiles clean."""
    text = (SM90 / "wgrad_sm90.cu").read_text()
    planted = text.replace(
        "  copy(tCgC, acc);", "  copy(AutoVectorizingCopyWithAssumedAlignment<64>{}, tCgC, acc);", 1
    )
    assert planted != text, "the planted change did not land"
    shutil.copytree(SM90, tmp_path / "sm90")
    (tmp_path / "sm90" / "wgrad_sm90.cu").write_text(planted)
    proc = _compile(tmp_path / "sm90" / "wgrad_sm90.cu", tmp_path / "planted.o")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _serialised(proc.stderr), "ptxas did not report the planted serialisation"


def test_a_planted_compile_error_fails(tmp_path: Path) -> None:
    text = (SM90 / "gemm_sm90.cu").read_text()
    broken = text.replace("return m <= kSmallM ? 0 : (m <= kMidM ? 1 : 2);", "return m <= kSmallM ? 0 :", 1)
    assert broken != text, "the planted error did not land"
    shutil.copytree(SM90, tmp_path / "sm90")
    (tmp_path / "sm90" / "gemm_sm90.cu").write_text(broken)
    assert _compile(tmp_path / "sm90" / "gemm_sm90.cu", tmp_path / "broken.o").returncode != 0
