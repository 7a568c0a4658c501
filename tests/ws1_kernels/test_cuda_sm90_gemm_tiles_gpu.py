"""The Hopper GEMM's tiles (`torch.ops.ws1_sm90.gemm_tile`, csrc/sm90/gemm_sm90.cu) on an sm_90 device: every tile
gives an element the same accumulator chain over K, so any tile at any M gives the same bits, the mid bucket's wide
tile (128 x 192) included. That is what lets the tile follow M and N for speed alone.
Also where the wide tile runs (`gemm_mid_wide_pick`, wired: `mid_wide_wired`): a mid-bucket call whose 128 x 192
tiles fit one wave of the SMs and whose 128 x 128 tiles do not (qkv's N = 6144 at 512 rows on an H100 or H200's 132 SMs).
"""

from __future__ import annotations

import pytest
import torch

from ws1_kernels import cuda_sm90

pytestmark = [pytest.mark.gpu, pytest.mark.needs_build, pytest.mark.sm90]

if cuda_sm90.missing_reason() is not None or not torch.cuda.is_available():
    pytest.skip(str(cuda_sm90.missing_reason() or "no CUDA device"), allow_module_level=True)
if torch.cuda.get_device_capability() != cuda_sm90.CAPABILITY:
    pytest.skip("the Hopper kernels run on capability 9.0 only", allow_module_level=True)

DEV = "cuda"
TILES = (0, 1, 2, 3)  # small, mid, large, mid wide
QKV_N, HIDDEN = 6144, 4096


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def _operands(m: int, b_trans: bool, seed: int = 90) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv's forward (a [m, 4096] @ w[6144, 4096]^T) or its dx (dy [m, 6144] @ w [6144, 4096])."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    k = HIDDEN if b_trans else QKV_N
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=g)
    w = torch.randn(QKV_N, HIDDEN, device=DEV, dtype=torch.bfloat16, generator=g)
    return a, w


@pytest.mark.parametrize("b_trans", [True, False], ids=["forward", "dx"])
@pytest.mark.parametrize("m", [1, 65, 384, 512, 1100])
def test_every_tile_gives_the_same_bits(m: int, b_trans: bool) -> None:
    a, w = _operands(m, b_trans)
    want = torch.ops.ws1_sm90.gemm(a, w, b_trans)
    for tile in TILES:
        assert torch.equal(_bits(torch.ops.ws1_sm90.gemm_tile(a, w, b_trans, tile)), _bits(want)), tile


def test_the_control_other_operands_change_the_bits() -> None:
    a, w = _operands(512, True)
    other, _ = _operands(512, True, seed=91)
    got = torch.ops.ws1_sm90.gemm_tile(other, w, True, 3)
    assert not torch.equal(_bits(got), _bits(torch.ops.ws1_sm90.gemm(a, w, True)))


def test_an_unknown_tile_is_refused() -> None:
    a, w = _operands(64, True)
    with pytest.raises(RuntimeError, match="tile must be in"):
        torch.ops.ws1_sm90.gemm_tile(a, w, True, 4)


@pytest.mark.parametrize(
    ("m", "n", "picked"),
    [
        (512, QKV_N, True),  # 192 tiles of 128 x 128, 128 of 128 x 192
        (384, QKV_N, True),
        (512, HIDDEN, False),  # o and down: 128 tiles of 128 x 128 already fit one wave
        (1024, QKV_N, False),  # 256 tiles of 128 x 192: no single wave either way
        (64, QKV_N, False),  # the small bucket
        (2048, QKV_N, False),  # the large bucket
    ],
)
def test_where_the_wide_tile_would_run(m: int, n: int, picked: bool) -> None:
    ext = cuda_sm90.extension()
    assert ext is not None
    assert ext.gemm_mid_wide_pick(m, n, 132) is picked


def _kernels(fn) -> set[str]:  # type: ignore[no-untyped-def]
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type.name == "CUDA"}


def _sm_count() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def test_the_wide_tile_runs_where_it_is_picked() -> None:
    """qkv's forward at 512 rows (picked on a 132-SM card): the candidate's GEMM runs the 128 x 192 tile's kernel
    (the same bits as the 128 x 128 tile, so only the profiler tells them apart)."""
    ext = cuda_sm90.extension()
    assert ext is not None and ext.mid_wide_wired is True
    if not ext.gemm_mid_wide_pick(512, QKV_N, _sm_count()):
        pytest.skip(f"qkv at 512 rows is not picked on {_sm_count()} SMs")
    a, w = _operands(512, True)
    ran = _kernels(lambda: torch.ops.ws1_sm90.gemm(a, w, True))
    assert ran == _kernels(lambda: torch.ops.ws1_sm90.gemm_tile(a, w, True, 3))


def test_the_control_an_unpicked_call_keeps_the_square_tile() -> None:
    """o's forward at 512 rows (4096 columns: 128 x 128 tiles already fit one wave) is not picked: it runs the mid
    bucket's 128 x 128 kernel, not the wide one."""
    ext = cuda_sm90.extension()
    assert ext is not None and not ext.gemm_mid_wide_pick(512, HIDDEN, _sm_count())
    g = torch.Generator(device=DEV).manual_seed(92)
    a = torch.randn(512, HIDDEN, device=DEV, dtype=torch.bfloat16, generator=g)
    w = torch.randn(HIDDEN, HIDDEN, device=DEV, dtype=torch.bfloat16, generator=g)
    ran = _kernels(lambda: torch.ops.ws1_sm90.gemm(a, w, True))
    assert ran == _kernels(lambda: torch.ops.ws1_sm90.gemm_tile(a, w, True, 1))
    assert ran != _kernels(lambda: torch.ops.ws1_sm90.gemm_tile(a, w, True, 3))


def test_the_control_the_wide_tile_is_another_kernel() -> None:
    a, w = _operands(512, True)
    wide = _kernels(lambda: torch.ops.ws1_sm90.gemm_tile(a, w, True, 3))
    assert wide and wide != _kernels(lambda: torch.ops.ws1_sm90.gemm_tile(a, w, True, 1))
