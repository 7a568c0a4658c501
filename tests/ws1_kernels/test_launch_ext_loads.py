"""The step ops' C++ module (`csrc/launch/ws1_launch.cpp`) loads and its registry behaves, on a CPU torch.

Why: the ops' schemas (`TORCH_LIBRARY`) are parsed when the module loads, and the registry's refusals are host code;
neither needs a GPU, and a mistake in either would otherwise first show on the GPU machine. The module is compiled
here against the CPU torch's headers with the CUDA symbols it names left unresolved (a CPU torch has no
libc10_cuda; one variable is stubbed, every function binds lazily and is never called: no CUDA tensor exists here),
then imported in a child process. The replay itself (`fast`, `run`) needs CUDA tensors: `test_step_native_gpu.py`.
The negative control plants a schema typo and must see the import fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from cxx_toolchain import CUDA_INCLUDE, require, torch_includes, torch_root

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "csrc" / "launch" / "ws1_launch.cpp"
GXX = require("cuda.h")

#: the one CUDA variable the module's inline headers name (functions bind lazily and are never called here)
STUB = """#include <c10/cuda/CUDACachingAllocator.h>
namespace c10::cuda::CUDACachingAllocator { std::atomic<CUDAAllocator*> allocator; }
"""

#: run in a child: load the module lazily, then exercise the registry; prints one JSON line
CHILD = """
import json, os, sys
sys.setdlopenflags(os.RTLD_LAZY | os.RTLD_GLOBAL)
sys.path.insert(0, sys.argv[1])
import torch
import ws1_launch_ext
from ws1_kernels import launches
ops, out = torch.ops.ws1_launch, {}
out["start"] = ops.stats()
out["pending"] = ws1_launch_ext.pending()
ws1_launch_ext.watch(launches._GLOBAL)
try:
    ws1_launch_ext.watch(launches._GLOBAL)
    out["second_watch"] = "accepted"
except RuntimeError as e:
    out["second_watch"] = str(e).splitlines()[0]
ops.block(-1)
out["opened"] = ops.stats()
for name, call in (("commit", lambda: ops.commit([1], torch.float32, 1, [], [], "")),
                   ("add_launch", lambda: ops.add_launch(1, [1, 1, 1], 32, 0, [0], [0]))):
    try:
        call()
        out[name] = "accepted"
    except RuntimeError as e:
        out[name] = str(e).splitlines()[0]
print(json.dumps(out))
"""


def _build(source: Path, tmp: Path) -> Path:
    """Compile `source` into a loadable module under `tmp`; returns its folder."""
    lib = torch_root() / "lib"
    stubs = tmp / "stubs"
    (stubs / "c10" / "cuda" / "impl").mkdir(parents=True)
    (stubs / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text("#pragma once\n")
    (tmp / "stub.cpp").write_text(STUB)
    out = tmp / "mod"
    out.mkdir()
    cmd = [
        GXX,
        "-std=c++17",
        "-O0",
        "-shared",
        "-fPIC",
        "-DTORCH_EXTENSION_NAME=ws1_launch_ext",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        f"-I{stubs}",
        *(f"-I{p}" for p in torch_includes()),
        f"-I{CUDA_INCLUDE}",
        f"-I{sysconfig.get_paths()['include']}",
        str(source),
        str(tmp / "stub.cpp"),
        "-o",
        str(out / f"ws1_launch_ext{sysconfig.get_config_var('EXT_SUFFIX')}"),
        f"-L{lib}",
        "-ltorch",
        "-ltorch_cpu",
        "-lc10",
        "-ltorch_python",
        "-Wl,--unresolved-symbols=ignore-all",
        "-ldl",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _load(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(folder)], capture_output=True, text=True, timeout=300
    )


@pytest.mark.heavy(seconds=40)
def test_the_module_loads_and_its_registry_refuses_what_it_must(tmp_path: Path) -> None:
    proc = _load(_build(SOURCE, tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["start"] == [0, 0, 0, 0, 1] and out["pending"] is False  # blocked until Python opens it
    assert out["opened"][4] == 0
    assert "already watched" in out["second_watch"]
    assert "no recipe is being recorded" in out["commit"]
    assert "no recipe is being recorded" in out["add_launch"]


@pytest.mark.heavy(seconds=40)
def test_a_planted_schema_typo_fails_the_load(tmp_path: Path) -> None:
    text = SOURCE.read_text()
    planted = text.replace('m.def("stats() -> int[]"', 'm.def("stats() -> int[[]"', 1)
    assert planted != text, "the planted typo did not land"
    source = tmp_path / "ws1_launch.cpp"
    source.write_text(planted)
    proc = _load(_build(source, tmp_path))
    assert proc.returncode != 0 and "stats" in proc.stderr
