"""The bound-kernel fast path on the GPU: every launch of the step scenario and of the training GEMMs is checked
against Triton's own pick (``checked`` mode), and gives the bits Triton's own launch gives.

The CPU test (`test_triton_bound_launch.py`) covers the keying logic on stand-ins; this is where real kernels,
real specialisations (pointer alignment, ints divisible by 16, constexprs) and CUDA graph capture meet it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cuda_only import skip_module_without_cuda

pytestmark = [pytest.mark.gpu]

skip_module_without_cuda("triton", "transformers")

import torch  # noqa: E402
from step_support import gpu_model, step_mismatches  # noqa: E402

from ws1_kernels.integrations.step import step_ops  # noqa: E402
from ws1_kernels.triton_ops import _launch, gemm, native  # noqa: E402
from ws1_kernels.triton_ops._bound import BoundLauncher, LaunchMismatch  # noqa: E402

PROFILE = "triton_cuda_bf16"


@pytest.fixture
def checked() -> Iterator[BoundLauncher]:
    """A fresh launcher in checked mode for the test, the process's own put back after. The step ops' C++ path
    (when built) is blocked meanwhile: its replays would bypass the launcher being checked."""
    previous = _launch._LAUNCHER
    _launch._LAUNCHER = BoundLauncher("checked")
    blocked = native.available()
    if blocked:
        torch.ops.ws1_launch.block(1)
    try:
        yield _launch._LAUNCHER
    finally:
        _launch._LAUNCHER = previous
        if blocked:
            torch.ops.ws1_launch.block(-1)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_the_step_scenario_launches_only_kernels_triton_would_pick(checked: BoundLauncher, mode: str) -> None:
    assert step_mismatches(gpu_model(PROFILE), step_ops(PROFILE), mode) == []
    assert checked.fast > checked.slow > 0  # bound launches really ran, each checked


def _operands(m: int, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x[m, 4096] starting ``offset`` elements into its buffer (offset 1: a 2-byte, unaligned address)."""
    gen = torch.Generator(device="cuda").manual_seed(m)
    buf = torch.randn(m * 4096 + offset, generator=gen, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 4096, generator=gen, device="cuda", dtype=torch.bfloat16)
    return buf[offset:].view(m, 4096), w


@pytest.mark.parametrize("m", [1, 16, 17, 640])
def test_gemm_bits_equal_triton_own_launch_at_any_alignment(checked: BoundLauncher, m: int) -> None:
    for offset in (0, 1, 8):
        x, w = _operands(m, offset)
        checked.mode = "jit"
        want = gemm.gemm_forward(x, w)
        checked.mode = "checked"
        gemm.gemm_forward(x, w)  # binds
        got = gemm.gemm_forward(x, w)  # bound, checked
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (m, offset)
    assert checked.fast >= 3


def test_checked_mode_catches_a_key_blind_to_alignment(
    checked: BoundLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: a key that ignores pointer alignment binds the aligned kernel for an unaligned call, and
    checked mode must refuse it (Triton compiles another kernel for the unaligned address)."""
    from ws1_kernels.triton_ops import _bound

    monkeypatch.setattr(
        _bound, "arg_key", lambda args: tuple(a.dtype if isinstance(a, torch.Tensor) else a for a in args)
    )
    x, w = _operands(16, 0)
    gemm.gemm_forward(x, w)
    x1, _ = _operands(16, 1)
    with pytest.raises(LaunchMismatch):
        gemm.gemm_forward(x1, w)
