"""Build `ws1_launch_ext`, the C++ host path of profile triton_cuda_bf16's step ops (docs/step.md).

    python csrc/launch/setup.py build_ext --build-lib build/launch

Host code only: no arch list, no device code, no CUTLASS. It includes torch's C++ and CUDA headers and the
toolkit's `cuda.h` (types only: the driver is opened with dlopen at run time), so it builds where the CUDA torch it
will run with is installed (the GPU machine). Its own script rather than a module of csrc/setup.py: the CUDA
profiles' modules do not contain it, and their build script stays theirs. Like them it links the C++ runtime as a
shared library (csrc/setup.py says why).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED_RUNTIME = ["-l:libstdc++.so.6"] if sys.platform.startswith("linux") else []


def main() -> None:
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    setup(
        name="ws1-launch-ext",
        version="0.1.0",
        ext_modules=[
            CUDAExtension(
                "ws1_launch_ext",
                [str(HERE / "ws1_launch.cpp")],
                extra_compile_args={"cxx": ["-O3", "-std=c++17"]},
                extra_link_args=[*SHARED_RUNTIME, "-ldl"],
            )
        ],
        cmdclass={"build_ext": BuildExtension},
    )


if __name__ == "__main__":
    main()
