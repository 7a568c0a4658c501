"""Which builds of the CUDA extension run on which device (`ws1_kernels.cuda.runs_on`), with no GPU needed.

The check decides whether `cuda_bf16` is available on a device: machine code runs on its own major arch at an equal
or newer minor, `9.0a` only on 9.0, PTX on any device at least as new (through the driver's JIT). Each case that
must be refused is here beside the one that must pass.
"""

from __future__ import annotations

import pytest

from ws1_kernels.cuda import runs_on


@pytest.mark.parametrize(
    ("capability", "targets", "expected"),
    [
        ((9, 0), ("8.0", "9.0a"), True),  # the gpu_sm90 build on an H200: 9.0a machine code
        ((9, 0), ("8.6+PTX",), True),  # the gpu_sm86 build on an H200: compute_86 PTX through the JIT
        ((8, 6), ("8.6+PTX",), True),
        ((8, 9), ("8.0",), True),  # sm_80 machine code on a newer sm_8x
        ((9, 0), ("8.6",), False),  # sm_86 machine code does not run on sm_90
        ((8, 6), ("9.0a",), False),  # Hopper-only code on an Ampere card
        ((8, 0), ("8.6+PTX",), False),  # PTX of a newer arch than the device
        ((12, 0), ("9.0a",), False),  # 9.0a runs on 9.0 only
        ((9, 0), (), False),  # nothing built
    ],
)
def test_runs_on(capability: tuple[int, int], targets: tuple[str, ...], expected: bool) -> None:
    assert runs_on(capability, targets) is expected
