"""Build ws1's CUDA extension (`ws1_cuda_ext`) for an explicit arch list.

    TORCH_CUDA_ARCH_LIST="8.0;9.0a" python csrc/setup.py build_ext --build-lib build/cuda-sm90

`nox -s gpu_sm90` builds `8.0;9.0a` (generic sm_80 code plus Hopper's own), `nox -s gpu_sm86` builds
`8.6+PTX` (sm_86 code and compute_86 PTX: on an sm_90 card the driver JIT-compiles that PTX, the sm86 proxy).
The arch list is recorded in the module (`ws1_cuda_ext.built_targets()`), and each kernel's binary and PTX
versions are read back at run time (`kernel_attributes()`), so evidence names the code that really ran.
Needs the CUDA torch it will run with (build on the GPU machine).

When the list names `9.0a`, a second module is built: `ws1_cuda_sm90_ext` (csrc/sm90/, the Hopper kernels of
profile `cuda_bf16_sm90`), for sm_90a alone and on CUTLASS 3.x's headers. They come from the `nvidia-cutlass`
wheel (its `cutlass_library/source/include`), or from `$WS1_CUTLASS_DIR` (a CUTLASS checkout's root). Without
them a 9.0a build stops with a message: the Hopper profile is never silently left out.

`WS1_MODULES=generic` or `WS1_MODULES=hopper` builds one of the two modules (the GPU sessions build both at once,
each in its own build folder). Every module links the C++ runtime as a shared library, and the build fails when a
module carries a private copy of it (`static_runtime_symbols`): the GPU machine's compiler has only a static
libstdc++, and the copy it linked in once made every failed check in the Hopper module a segfault.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERNELS = sorted(str(p) for p in (HERE / "kernels").glob("*.cu"))
SM90_SOURCES = [
    str(HERE / "sm90" / "ws1_sm90_ops.cpp"),
    *sorted(str(p) for p in (HERE / "sm90").glob("*.cu")),
]
# torch's extension flags hide the half/bf16 operators that CUTLASS's types rely on; sm_90a by -gencode (the
# -arch=sm_90a shorthand also runs a plain sm_90 pass that rejects wgmma on some nvcc versions); NDEBUG: an
# assert's call inside the mainloop makes ptxas serialise every wgmma (warning C7510)
SM90_NVCC = [
    "-std=c++17",
    "-DNDEBUG",
    "--expt-relaxed-constexpr",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
]


#: the C++ runtime by its shared soname. A toolchain that ships only libstdc++.a (the GPU machine's /opt/gcc) would
#: otherwise copy the runtime into the module: its own locale, whose facet ids clash with the process's (torch's
#: libstdc++.so.6), so the first integer formatted in a TORCH_CHECK message crashed. Named first, the shared library
#: resolves every runtime symbol, and the compiler's own -lstdc++ afterwards pulls nothing from an archive.
SHARED_RUNTIME = ["-l:libstdc++.so.6"] if sys.platform.startswith("linux") else []
#: symbols that only a copy of the C++ runtime defines (locale setup, exception throwing); a module that links the
#: runtime dynamically leaves them undefined
RUNTIME_SYMBOLS = ("_ZNSt6localeC1Ev", "_ZNKSt6locale2id5_M_idEv", "__cxa_throw", "__gxx_personality_v0")
MODULES = ("generic", "hopper")


def static_runtime_symbols(so: str | Path) -> list[str]:
    """The C++ runtime's own symbols that the shared object `so` defines (empty for a dynamically linked module).

    Read with `nm -D --defined-only`: a runtime linked in statically exports its symbols like any other."""
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True, check=True
    ).stdout
    defined = {line.split()[-1] for line in out.splitlines() if line.strip()}
    return [sym for sym in RUNTIME_SYMBOLS if sym in defined]


def write_if_changed(path: Path, text: str) -> None:
    """Write `text` to `path` unless it already holds it, through a temporary file and a rename: two builds of one
    arch list run at once (one per module) and must never see the header half-written."""
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def wanted_modules(archs: str, env: str) -> list[str]:
    """The modules to build: `WS1_MODULES` (comma-separated, checked), else every module the arch list asks for."""
    hopper = "9.0a" in re.split(r"[;, ]+", archs)
    if not env.strip():
        return ["generic", "hopper"] if hopper else ["generic"]
    names = [n.strip() for n in env.split(",") if n.strip()]
    for name in names:
        if name not in MODULES:
            sys.exit(f"csrc/setup.py: WS1_MODULES: unknown module {name!r} (known: {', '.join(MODULES)})")
    if "hopper" in names and not hopper:
        sys.exit(f"csrc/setup.py: WS1_MODULES names hopper, but the arch list {archs!r} has no 9.0a")
    return names


def cutlass_includes() -> list[str]:
    """CUTLASS's include folders: `$WS1_CUTLASS_DIR`, else the installed `nvidia-cutlass` wheel's; [] if neither."""
    root = os.environ.get("WS1_CUTLASS_DIR", "").strip()
    if root:
        base = Path(root)
    else:
        import importlib.util

        spec = importlib.util.find_spec("cutlass_library")  # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            return []
        base = Path(next(iter(spec.submodule_search_locations))) / "source"
    inc = [base / "include", base / "tools" / "util" / "include"]
    return [str(p) for p in inc] if (inc[0] / "cutlass" / "cutlass.h").is_file() else []


def main() -> None:
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if not archs:
        # torch's default arch detection crashes without a GPU and silently picks the build machine's arch with
        # one: the arch list is always explicit
        sys.exit("csrc/setup.py: set TORCH_CUDA_ARCH_LIST (e.g. '8.0;9.0a' or '8.6+PTX')")
    write_if_changed(
        HERE / "_build_info.h",
        f'// generated by csrc/setup.py: the arch list this build holds\n#define WS1_BUILT_TARGETS "{archs}"\n',
    )
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    # sources by absolute path and no chdir: --build-lib and --build-temp stay relative to the caller's directory
    flags = ["-O3", "-lineinfo", "-Xptxas=-v"]
    wanted = wanted_modules(archs, os.environ.get("WS1_MODULES", ""))
    modules = []
    if "generic" in wanted:
        modules.append(
            CUDAExtension(
                "ws1_cuda_ext",
                [str(HERE / "ws1_ops.cpp"), *KERNELS],
                include_dirs=[str(HERE)],
                extra_compile_args={"cxx": ["-O3"], "nvcc": flags},
                extra_link_args=SHARED_RUNTIME,
            )
        )
    if "hopper" in wanted:
        inc = cutlass_includes()
        if not inc:
            sys.exit(
                "csrc/setup.py: 9.0a asks for the Hopper kernels (csrc/sm90/), which need CUTLASS's headers: "
                "install the nvidia-cutlass wheel or set WS1_CUTLASS_DIR to a CUTLASS checkout"
            )
        modules.append(
            CUDAExtension(
                "ws1_cuda_sm90_ext",
                SM90_SOURCES,
                include_dirs=[str(HERE), str(HERE / "sm90"), *inc],
                extra_compile_args={"cxx": ["-O3", "-std=c++17"], "nvcc": [*flags, *SM90_NVCC]},
                extra_link_args=SHARED_RUNTIME,
            )
        )
    dist = setup(
        name="ws1-cuda-ext",
        version="0.1.0",
        ext_modules=modules,
        cmdclass={"build_ext": BuildExtension},
    )
    for so in dist.get_command_obj("build_ext").get_outputs():
        copied = static_runtime_symbols(so)
        if copied:
            sys.exit(
                f"csrc/setup.py: {so} carries its own copy of the C++ runtime (defines {', '.join(copied)}): "
                "link libstdc++ as a shared library (the compiler found only libstdc++.a)"
            )


if __name__ == "__main__":
    main()
