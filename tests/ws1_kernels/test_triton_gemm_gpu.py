"""Triton GEMM family (det_gemm, lm_head) on the GPU: bf16 at Qwen3-8B widths.

What only a GPU can show: that the MMA hardware keeps a row's bits whatever the tile shape of its M bucket
(forward and dx, M on both sides of every bucket boundary), that a multi-block wgrad dot equals block-by-block
accumulation, and that main_grad is split- and permutation-invariant bit for bit.  Accuracy is judged against
the fp32 reference with the contract's tolerances.
"""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

pytest.importorskip("triton")

from kernels_support import assert_bitwise, assert_close  # noqa: E402

from ws1_kernels import KernelInputError, LayoutContext, launches, reference  # noqa: E402
from ws1_kernels.triton_ops import _launch  # noqa: E402
from ws1_kernels.triton_ops import gemm as g  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        _launch.interpreting(), reason="TRITON_INTERPRET=1 runs kernels on the CPU, not the GPU"
    ),
]

BF = torch.bfloat16
DET = (4096, 12288)  # weight (N, K) of det_gemm as graded (down projection)
LM = (151936, 4096)  # weight (N, K) of lm_head
DET_MS = (
    1,
    2,
    3,
    15,
    16,
    17,
    63,
    64,
    65,
    127,
    128,
    129,
    255,
    256,
    257,
    511,
    512,
    513,
    1023,
    1024,
    1025,
    4096,
)
LM_MS = (1, 2, 16, 17, 64, 65, 256, 257, 1024, 1025)


def _rand(name: str, shape: tuple[int, ...], scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{name}/{shape}".encode()))
    return (torch.randn(shape, generator=gen, device="cuda") * scale).to(BF)


def _one_sample(m: int) -> LayoutContext:
    return LayoutContext(torch.zeros(m, dtype=torch.int64), torch.arange(m))


@pytest.fixture(scope="module")
def det_inputs():
    n, k = DET
    return _rand("x", (max(DET_MS), k)), _rand("w", (n, k), 0.02)


@pytest.fixture(scope="module")
def lm_inputs():
    n, k = LM
    return _rand("x", (max(LM_MS), k)), _rand("w", (n, k), 0.02)


def test_tables_cover_bucket_boundaries() -> None:
    """The M lists hold an M on both sides of every bucket boundary of the frozen tables."""
    for table in (g.fwd_table(*DET), g.dx_table(*DET), g.DEFAULT_TABLE):
        for bound in table.boundaries:
            assert bound in DET_MS and bound + 1 in DET_MS, bound
    for table in (g.fwd_table(*LM), g.dx_table(*LM)):
        for bound in table.boundaries:
            assert bound in LM_MS and bound + 1 in LM_MS, bound
    for table in (*g.FWD_TABLES.values(), *g.DX_TABLES.values()):  # the other shapes' tables
        for bound in table.boundaries:
            assert bound in DET_MS and bound + 1 in DET_MS, bound


@pytest.mark.parametrize("m", DET_MS)
def test_det_gemm_row_alone_equals_row_in_batch(det_inputs, m: int) -> None:
    x, w = det_inputs
    with torch.no_grad():
        big = g.det_gemm(x, w, _one_sample(x.shape[0]))
        y = g.det_gemm(x[:m].contiguous(), w, _one_sample(m))
        assert_bitwise(f"det_gemm M={m} vs M={x.shape[0]}", y, big[:m])
        for r in sorted({0, m - 1}):
            alone = g.det_gemm(x[r : r + 1].contiguous(), w, _one_sample(1))
            assert_bitwise(f"det_gemm row {r} alone vs in M={m}", alone, y[r : r + 1])


@pytest.mark.parametrize("m", LM_MS)
def test_lm_head_row_alone_equals_row_in_batch(lm_inputs, m: int) -> None:
    x, w = lm_inputs
    with torch.no_grad():
        big = g.lm_head(x, w, _one_sample(x.shape[0]))
        y = g.lm_head(x[:m].contiguous(), w, _one_sample(m))
        assert_bitwise(f"lm_head M={m} vs M={x.shape[0]}", y, big[:m])
        for r in sorted({0, m - 1}):
            alone = g.lm_head(x[r : r + 1].contiguous(), w, _one_sample(1))
            assert_bitwise(f"lm_head row {r} alone vs in M={m}", alone, y[r : r + 1])


@pytest.mark.parametrize("m", DET_MS)
def test_det_gemm_dx_row_alone_equals_row_in_batch(m: int) -> None:
    n, k = DET
    dy, w = _rand("dy", (max(DET_MS), n)), _rand("w", (n, k), 0.02)
    big = g.gemm_dx(dy, w)
    y = g.gemm_dx(dy[:m].contiguous(), w)
    assert_bitwise(f"dx M={m} vs M={dy.shape[0]}", y, big[:m])
    alone = g.gemm_dx(dy[m - 1 : m].contiguous(), w)
    assert_bitwise(f"dx last row alone vs in M={m}", alone, y[m - 1 : m])


@pytest.mark.parametrize("m", (1, 17, 65, 257, 1025))
def test_lm_head_dx_row_alone_equals_row_in_batch(lm_inputs, m: int) -> None:
    n, _k = LM
    _x, w = lm_inputs
    dy = _rand("dy", (1025, n))
    big = g.gemm_dx(dy, w)
    y = g.gemm_dx(dy[:m].contiguous(), w)
    assert_bitwise(f"lm_head dx M={m} vs M=1025", y, big[:m])


def _all_tiles(table: g.TileTable) -> list[g.Tile]:
    """Every tile of a table, and each with the persistent grid flipped; plus every tile of every other
    frozen table with this table's BLOCK_K (a shape-specific table, e.g. gate/up's, is checked here too)."""
    tables = (table, g.DEFAULT_TABLE, *g.FWD_TABLES.values(), *g.DX_TABLES.values())
    tiles = {t for tab in tables for _, t in tab.buckets if t.block_k == table.block_k}
    tiles |= {dataclasses.replace(t, persistent=not t.persistent) for t in tiles}
    return sorted(tiles, key=repr)


@pytest.mark.parametrize("shape", [DET, LM], ids=["det_gemm", "lm_head"])
@pytest.mark.parametrize("m", (17, 257))
def test_every_tile_of_the_table_gives_the_same_bits(shape, m: int) -> None:
    """The measured fact the buckets rest on, re-checked for every tile the tables may pick (forward and dx)."""
    n, k = shape
    x, w, dy = _rand("x", (m, k)), _rand("w", (n, k), 0.02), _rand("dy", (m, n))
    fwd = [(t, g.gemm_forward(x, w, tile=t)) for t in _all_tiles(g.fwd_table(n, k))]
    for t, y in fwd:
        assert_bitwise(f"forward tile {t}", y, fwd[0][1])
    dxs = [(t, g.gemm_dx(dy, w, tile=t)) for t in _all_tiles(g.dx_table(n, k))]
    for t, y in dxs:
        assert_bitwise(f"dx tile {t}", y, dxs[0][1])


@pytest.mark.parametrize(
    ("op", "shape", "m"), [("det_gemm", DET, 1), ("det_gemm", DET, 4096), ("lm_head", LM, 17)]
)
def test_forward_and_dx_accuracy(op: str, shape, m: int) -> None:
    n, k = shape
    x, w, dy = _rand("x", (m, k)), _rand("w", (n, k), 0.02), _rand("dy", (m, n))
    ctx = _one_sample(m)
    with torch.no_grad():
        y = getattr(g, op)(x, w, ctx)
    ref = getattr(reference, op)(x.float(), w.float(), ctx)
    assert_close(f"{op} forward M={m}", y, ref, "forward_accuracy", op)
    with reference.fp32_math():
        dx_ref = dy.float() @ w.float()
    assert_close(f"{op} dx M={m}", g.gemm_dx(dy, w), dx_ref, "gradient_accuracy", op)


def test_odd_shape_masked_k_tail() -> None:
    """K and N not multiples of any block: masked k tail, wrapped edge rows and columns."""
    n, k = 300, 200
    x, w = _rand("x", (77, k)), _rand("w", (n, k), 0.05)
    y = g.gemm_forward(x, w)
    with reference.fp32_math():
        ref = x.float() @ w.float().t()
    assert_close("odd forward", y, ref, "forward_accuracy", "det_gemm")
    assert_bitwise("odd row alone", g.gemm_forward(x[40:41].contiguous(), w), y[40:41])


# ---------------------------------------------------------------------------------------------- main_grad

LENGTHS = [37, 300, 5, 1000, 129]


def _ctx(order: list[int], pads_after: frozenset[int] | set[int] = frozenset()) -> LayoutContext:
    sid: list[int] = []
    pos: list[int] = []
    for s in order:
        sid += [s] * LENGTHS[s]
        pos += list(range(LENGTHS[s]))
        if s in pads_after:
            sid += [-1] * 3
            pos += [-1] * 3
    return LayoutContext(torch.tensor(sid), torch.tensor(pos))


def _rows(
    name: str, cols: int, order: list[int], pads_after: frozenset[int] | set[int] = frozenset()
) -> torch.Tensor:
    parts = []
    for s in order:
        parts.append(_rand(f"{name}{s}", (LENGTHS[s], cols)))
        if s in pads_after:
            parts.append(torch.full((3, cols), 1e3, dtype=BF, device="cuda"))  # garbage in pads
    return torch.cat(parts).contiguous()


def _main_grad(op: str, shape, calls: list[tuple[list[int], set[int]]]) -> torch.Tensor:
    n, k = shape
    w = _rand("w", (n, k), 0.02).requires_grad_(True)
    w.main_grad = torch.zeros(n, k, device="cuda")
    for order, pads in calls:
        x = _rows("x", k, order, pads).requires_grad_(True)
        getattr(g, op)(x, w, _ctx(order, pads)).backward(_rows("dy", n, order, pads))
        assert w.grad is None
    return w.main_grad


@pytest.mark.parametrize(("op", "shape"), [("det_gemm", DET), ("lm_head", LM)], ids=["det_gemm", "lm_head"])
def test_main_grad_split_permuted_padded_equal_one_call(op: str, shape) -> None:
    one = _main_grad(op, shape, [([0, 1, 2, 3, 4], set())])
    split = _main_grad(op, shape, [([0, 1], set()), ([2, 3, 4], set())])
    assert_bitwise(f"{op} main_grad two calls vs one", split, one)
    perm = _main_grad(op, shape, [([3, 0, 4, 2, 1], set())])
    assert_bitwise(f"{op} main_grad permuted vs packed", perm, one)
    padded = _main_grad(op, shape, [([0, 1, 2, 3, 4], {0, 2, 4})])
    assert_bitwise(f"{op} main_grad padded vs packed", padded, one)
    x = torch.cat([_rand(f"x{s}", (LENGTHS[s], shape[1])) for s in range(5)]).float()
    dy = torch.cat([_rand(f"dy{s}", (LENGTHS[s], shape[0])) for s in range(5)]).float()
    with reference.fp32_math():
        ref = dy.t() @ x
    assert_close(f"{op} main_grad", one, ref, "gradient_accuracy", op)


@pytest.mark.parametrize("step", (2, 4, 8))
def test_wgrad_multi_block_dot_equals_block_by_block(step: int) -> None:
    """One dot over ``step`` 16-token blocks gives the bits of ``step`` one-block dots (the MMA chain along K);
    the calls are split at a point that is not a whole step."""
    n, k = DET
    order = [0, 1, 2, 3, 4]
    x, dy = _rows("x", k, order), _rows("dy", n, order)
    segs = _ctx(order).segments

    def run(tile: g.WgradTile, parts: list[tuple]) -> torch.Tensor:
        mg = torch.zeros(n, k, device="cuda")
        for part in parts:
            rows = torch.tensor(
                g.wgrad_block_rows(part, tile.blocks_per_step), dtype=torch.int32, device="cuda"
            )
            g.gemm_wgrad(dy, x, mg, rows, tile=tile)
        return mg

    base = dataclasses.replace(g.wgrad_tile(n, k), blocks_per_step=1)
    multi = dataclasses.replace(base, blocks_per_step=step)
    ref = run(base, [segs])
    assert_bitwise(f"{step} blocks per dot vs 1", run(multi, [segs]), ref)
    assert_bitwise(f"{step} blocks per dot, split calls", run(multi, [segs[:1], segs[1:]]), ref)


def test_launch_log_names_the_triton_kernels() -> None:
    n, k = 256, 512
    x = _rand("x", (20, k)).requires_grad_(True)
    w = _rand("w", (n, k), 0.02).requires_grad_(True)
    w.main_grad = torch.zeros(n, k, device="cuda")
    with launches.observe() as log:
        g.det_gemm(x, w, _one_sample(20)).backward(_rand("dy", (20, n)))
    assert log.events == [
        ("triton:ws1_gemm_fixed_k", "fwd"),
        ("triton:ws1_gemm_fixed_k", "bwd"),
        ("triton:ws1_gemm_wgrad_blocks", "bwd"),
    ]


def test_bad_input_on_gpu() -> None:
    x, w = _rand("x", (4, 64)), _rand("w", (32, 64))
    ctx = _one_sample(4)
    with pytest.raises(KernelInputError):
        g.det_gemm(x.cpu(), w.cpu(), ctx)  # CPU tensors outside the interpreter
    with pytest.raises(KernelInputError):
        g.det_gemm(x, w.cpu(), ctx)  # two devices
    with pytest.raises(KernelInputError):
        g.det_gemm(x.float(), w.float(), ctx)  # the public op is bf16 only
    wg = w.clone().requires_grad_(True)
    wg.main_grad = torch.zeros(32, 64)  # on the CPU
    with pytest.raises(KernelInputError):
        g.lm_head(x, wg, ctx)
