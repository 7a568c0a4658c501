"""Triton GEMM family (det_gemm, lm_head) under TRITON_INTERPRET=1: logic and invariance, fp32, tiny shapes.

The interpreter runs ``tl.dot`` as one numpy/OpenBLAS matmul, whose per-element order depends on the element's
position inside the tile (rows 6+ of a 16-row tile differ from row 0 here): a BLAS artefact that no GPU MMA has.
The invariance tests therefore swap in ``seq_dot``, a dot that adds the products into the accumulator one k at a
time (each fp32 add correctly rounded): the model of "one accumulator walked in order" that the kernels rely on.
Under it these tests check what the kernels control (indexing, the k order, the bucket machinery, persistence,
wrapped edge rows, the block table of the weight gradient); whether the H200's MMA keeps the bits across tile
shapes is checked by test_triton_gemm_gpu.py.  Accuracy against the reference also runs on the raw interpreter.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

import triton.language as tl  # noqa: E402
from kernels_support import interp_only, sequential_dot  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402
from triton.runtime import interpreter as interp  # noqa: E402

from ws1_kernels import KernelInputError, LayoutContext, launches, reference  # noqa: E402
from ws1_kernels.portable._blocks import wgrad_index  # noqa: E402
from ws1_kernels.triton_ops import BACKEND  # noqa: E402
from ws1_kernels.triton_ops import gemm as g  # noqa: E402

pytestmark = interp_only()

K, N = 64, 48
MS = (1, 2, 3, 15, 16, 17, 33, 64, 65)
F32 = torch.float32

# Test table: four buckets with four different tile shapes (one BLOCK_K), bounds 2 / 16 / 64 so that MS has M
# on both sides of every boundary; the last two buckets are persistent (3 "SMs" under the interpreter).
TEST_TABLE = g.TileTable(
    (
        (2, g.Tile(16, 16, 32)),
        (16, g.Tile(16, 32, 32, group_m=1)),
        (64, g.Tile(32, 16, 32, group_m=2, persistent=True)),
        (None, g.Tile(64, 64, 32, persistent=True)),
    )
)
TEST_WGRAD = g.WgradTile(block_n=32, block_k=32, blocks_per_step=1, group_n=2)
TABLES = g._Tables(fwd=TEST_TABLE, dx=TEST_TABLE, wgrad=TEST_WGRAD)


def _data(name: str, rows: int, cols: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}/{rows}/{cols}".encode()))
    return torch.randn((rows, cols), generator=gen, dtype=F32)


def _ctx(lengths: list[int], *, first: list[int] | None = None, order: list[int] | None = None, pads=()):
    """LayoutContext of samples with ``lengths`` (first positions ``first``), physical order ``order``, then
    ``pads`` pad rows inserted at the given physical indices."""
    first = first or [0] * len(lengths)
    order = order if order is not None else list(range(len(lengths)))
    sid: list[int] = []
    pos: list[int] = []
    for s in order:
        sid += [s] * lengths[s]
        pos += list(range(first[s], first[s] + lengths[s]))
    for p in sorted(pads):
        sid.insert(p, -1)
        pos.insert(p, -1)
    return LayoutContext(torch.tensor(sid), torch.tensor(pos))


def _one_sample_ctx(m: int) -> LayoutContext:
    return LayoutContext(torch.zeros(m, dtype=torch.int64), torch.arange(m))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _assert_bitwise(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    diff = (_bits(a) != _bits(b)).sum().item()
    assert diff == 0, f"{what}: {diff} of {a.numel()} elements differ in bits"


# ---------------------------------------------------------------------------------------------- forward, dx


@pytest.mark.parametrize("m", MS)
def test_forward_matches_reference_raw_interpreter(m: int) -> None:
    """Unpatched interpreter, frozen default table: the kernel computes x @ W^T."""
    x, w = _data("x", m, K), _data("w", N, K)
    y = g.gemm_forward(x, w)
    ref = reference.det_gemm(x, w, _one_sample_ctx(m))
    torch.testing.assert_close(y, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("m", MS)
def test_dx_matches_reference_raw_interpreter(m: int) -> None:
    dy, w = _data("dy", m, N), _data("w", N, K)
    torch.testing.assert_close(g.gemm_dx(dy, w), dy @ w, atol=2e-5, rtol=2e-5)


def test_bucket_boundaries_are_covered() -> None:
    """The test's M set has an M on both sides of every boundary of the test table (else the test is weak)."""
    for bound in TEST_TABLE.boundaries:
        assert bound in MS and bound + 1 in MS, bound
    picked = {TEST_TABLE.pick(m) for m in MS}
    assert len(picked) == len(TEST_TABLE.buckets)


@pytest.mark.parametrize("m", MS)
def test_forward_row_alone_equals_row_in_batch(seq_dot, m: int) -> None:
    """Every row of an M-row call equals the same row computed alone (M=1, another bucket) and inside the
    largest call (another bucket again), bit for bit."""
    x, w = _data("x", max(MS), K), _data("w", N, K)
    big = g.gemm_forward(x, w, table=TEST_TABLE)
    y = g.gemm_forward(x[:m].contiguous(), w, table=TEST_TABLE)
    _assert_bitwise(y, big[:m], f"M={m} vs M={max(MS)}")
    for r in sorted({0, m // 2, m - 1}):  # every row is covered by the comparison with the largest call
        alone = g.gemm_forward(x[r : r + 1].contiguous(), w, table=TEST_TABLE)
        _assert_bitwise(alone[0], y[r], f"row {r} alone vs in M={m}")


@pytest.mark.parametrize("m", MS)
def test_dx_row_alone_equals_row_in_batch(seq_dot, m: int) -> None:
    dy, w = _data("dy", max(MS), N), _data("w", N, K)
    big = g.gemm_dx(dy, w, table=TEST_TABLE)
    y = g.gemm_dx(dy[:m].contiguous(), w, table=TEST_TABLE)
    _assert_bitwise(y, big[:m], f"dx M={m} vs M={max(MS)}")
    alone = g.gemm_dx(dy[m - 1 : m].contiguous(), w, table=TEST_TABLE)
    _assert_bitwise(alone[0], y[m - 1], f"dx last row alone vs in M={m}")


def test_every_default_tile_gives_the_same_bits(seq_dot) -> None:
    """Every tile of the frozen tables (forced for one M) gives the bits of every other: the table may pick
    tiles by M.  Odd K exercises the masked k tail."""
    x, w = _data("x", 17, 72), _data("w", N, 72)
    tiles = {t for tab in (*g.FWD_TABLES.values(), g.DEFAULT_TABLE) for _, t in tab.buckets}
    outs = [g.gemm_forward(x, w, tile=t) for t in sorted(tiles, key=repr)]
    for t, y in zip(sorted(tiles, key=repr), outs, strict=True):
        _assert_bitwise(y, outs[0], f"tile {t}")
    torch.testing.assert_close(outs[0], x @ w.t(), atol=2e-5, rtol=2e-5)


def test_negative_control_split_k_changes_bits(seq_dot) -> None:
    """A split-K order (two halves reduced apart, then added) must change some bits of this input; if it did
    not, the invariance tests above could not see a batch-dependent split either."""
    x, w = _data("x", 16, K), _data("w", N, K)
    one = g.gemm_forward(x, w, table=TEST_TABLE)
    h = K // 2
    lo = g.gemm_forward(x[:, :h].contiguous(), w[:, :h].contiguous(), table=TEST_TABLE)
    hi = g.gemm_forward(x[:, h:].contiguous(), w[:, h:].contiguous(), table=TEST_TABLE)
    assert (_bits(lo + hi) != _bits(one)).any()


def test_wrapped_edge_rows_never_leak(seq_dot) -> None:
    """Rows past M (wrapped onto real rows inside the tile) are never stored: the output has exactly M rows
    and the memory after it is untouched."""
    x, w = _data("x", 3, K), _data("w", N, K)
    y = g.gemm_forward(x, w, tile=g.Tile(16, 32, 32))
    assert y.shape == (3, N)
    torch.testing.assert_close(y, x @ w.t(), atol=2e-5, rtol=2e-5)


# ---------------------------------------------------------------------------------------------- autograd, dW


LENGTHS = [
    5,
    20,
    3,
    17,
    33,
]  # blocks of 16 cut inside samples, a sample shorter than a block, one of 2+ blocks


def _grads(ctx: LayoutContext, x: torch.Tensor, dy: torch.Tensor, w: torch.Tensor, tables=TABLES):
    """Run forward + backward of the autograd path; return (y, dx) (main_grad accumulates on ``w``)."""
    xr = x.clone().requires_grad_(True)
    y = g.linear("test", xr, w, ctx, allow_fp32=True, tables=tables)
    y.backward(dy)
    return y.detach(), xr.grad


def _logical(lengths: list[int], name: str, cols: int) -> list[torch.Tensor]:
    """Per-sample rows, a pure function of (name, sample, position)."""
    return [_data(f"{name}{s}", n, cols) for s, n in enumerate(lengths)]


def _physical(rows: list[torch.Tensor], order: list[int], pads=(), cols: int = 0) -> torch.Tensor:
    """Rows of the samples in physical ``order``, garbage rows (1e3) at the pad indices."""
    out = [rows[s] for s in order]
    t = torch.cat(out)
    for p in sorted(pads):
        t = torch.cat([t[:p], torch.full((1, t.shape[1]), 1e3), t[p:]])
    return t.contiguous()


def _weight() -> torch.Tensor:
    w = _data("w", N, K).requires_grad_(True)
    w.main_grad = torch.zeros(N, K)
    return w


def test_wgrad_matches_reference(seq_dot) -> None:
    xs, dys = _logical(LENGTHS, "x", K), _logical(LENGTHS, "dy", N)
    order = list(range(len(LENGTHS)))
    x, dy, w = _physical(xs, order), _physical(dys, order), _weight()
    y, dx = _grads(_ctx(LENGTHS), x, dy, w)
    torch.testing.assert_close(y, x @ w.detach().t(), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(dx, dy @ w.detach(), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(w.main_grad, dy.t() @ x, atol=1e-4, rtol=1e-5)
    assert w.grad is None


def test_wgrad_split_into_two_calls_equals_one_call(seq_dot) -> None:
    """Micro-batches in ascending sample order accumulate main_grad to the bits of one call."""
    xs, dys = _logical(LENGTHS, "x", K), _logical(LENGTHS, "dy", N)
    one = _weight()
    _grads(_ctx(LENGTHS), _physical(xs, [0, 1, 2, 3, 4]), _physical(dys, [0, 1, 2, 3, 4]), one)
    two = _weight()
    for part in ([0, 1], [2, 3, 4]):
        lens = [LENGTHS[s] for s in part]
        ctx = LayoutContext(
            torch.tensor([s for s in part for _ in range(LENGTHS[s])]),
            torch.tensor([p for s in part for p in range(LENGTHS[s])]),
        )
        assert sum(lens) == ctx.num_rows
        _grads(ctx, _physical(xs, part), _physical(dys, part), two)
    _assert_bitwise(two.main_grad, one.main_grad, "two calls vs one call")


def test_wgrad_permuted_samples_give_same_bits(seq_dot) -> None:
    xs, dys = _logical(LENGTHS, "x", K), _logical(LENGTHS, "dy", N)
    base = _weight()
    _grads(_ctx(LENGTHS), _physical(xs, [0, 1, 2, 3, 4]), _physical(dys, [0, 1, 2, 3, 4]), base)
    order = [3, 0, 4, 2, 1]
    perm = _weight()
    _grads(_ctx(LENGTHS, order=order), _physical(xs, order), _physical(dys, order), perm)
    _assert_bitwise(perm.main_grad, base.main_grad, "permuted vs packed")


def test_wgrad_pads_are_skipped(seq_dot) -> None:
    """Pad rows (garbage values) change neither main_grad nor the real rows of y and dx."""
    xs, dys = _logical(LENGTHS, "x", K), _logical(LENGTHS, "dy", N)
    order = [0, 1, 2, 3, 4]
    base = _weight()
    y0, dx0 = _grads(_ctx(LENGTHS), _physical(xs, order), _physical(dys, order), base)
    pads = (0, 6, 27, 81)  # before sample 0, between samples, after the last one
    padded = _weight()
    y1, dx1 = _grads(
        _ctx(LENGTHS, pads=pads), _physical(xs, order, pads), _physical(dys, order, pads), padded
    )
    _assert_bitwise(padded.main_grad, base.main_grad, "padded vs packed main_grad")
    keep = [i for i in range(y1.shape[0]) if i not in pads]
    _assert_bitwise(y1[keep], y0, "padded vs packed y")
    _assert_bitwise(dx1[keep], dx0, "padded vs packed dx")


def test_wgrad_multi_block_steps_equal_one_block_steps(seq_dot) -> None:
    """``blocks_per_step`` 2 (two blocks per dot, tail padded with an empty block) gives the bits of 1, in one
    call and split at a point that is not a whole step."""
    xs, dys = _logical(LENGTHS, "x", K), _logical(LENGTHS, "dy", N)
    order = [0, 1, 2, 3, 4]
    x, dy = _physical(xs, order), _physical(dys, order)
    one = _weight()
    _grads(_ctx(LENGTHS), x, dy, one)
    two_step = g._Tables(TEST_TABLE, TEST_TABLE, g.WgradTile(32, 32, blocks_per_step=2, group_n=2))
    two = _weight()
    _grads(_ctx(LENGTHS), x, dy, two, tables=two_step)
    _assert_bitwise(two.main_grad, one.main_grad, "2 blocks per step vs 1")
    split = _weight()
    for part in ([0], [1, 2, 3, 4]):  # sample 0 is one block: the first call pads a whole empty block
        ctx = LayoutContext(
            torch.tensor([s for s in part for _ in range(LENGTHS[s])]),
            torch.tensor([p for s in part for p in range(LENGTHS[s])]),
        )
        _grads(ctx, _physical(xs, part), _physical(dys, part), split, tables=two_step)
    _assert_bitwise(split.main_grad, one.main_grad, "2 blocks per step, split calls vs one call")


def test_negative_control_block_order_changes_bits(seq_dot) -> None:
    """Adding the same blocks in another order must change some bits of this input."""
    xs, dys = _logical(LENGTHS, "x", K), _logical(LENGTHS, "dy", N)
    order = [0, 1, 2, 3, 4]
    x, dy = _physical(xs, order), _physical(dys, order)
    rows = g.wgrad_block_rows(_ctx(LENGTHS).segments)
    blocks = [rows[i : i + 16] for i in range(0, len(rows), 16)]
    a, b = torch.zeros(N, K), torch.zeros(N, K)
    g.gemm_wgrad(dy, x, a, torch.tensor(rows, dtype=torch.int32), tile=TEST_WGRAD)
    rev = [r for blk in reversed(blocks) for r in blk]
    g.gemm_wgrad(dy, x, b, torch.tensor(rev, dtype=torch.int32), tile=TEST_WGRAD)
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-5)
    assert (_bits(a) != _bits(b)).any()


@pytest.mark.parametrize("step", [1, 4])
def test_block_rows_follow_the_portable_rule(step: int) -> None:
    """Same blocks as ``portable._blocks.wgrad_index`` (ascending ids, aligned to position 0, pads skipped)."""
    ctx = _ctx([5, 20, 3, 17], first=[0, 7, 30, 16], order=[2, 0, 3, 1], pads=(0, 4))
    rows = g.wgrad_block_rows(ctx.segments, blocks_per_step=step)
    want = wgrad_index(ctx.segments, zero_row=-1).flatten().tolist()
    assert rows[: len(want)] == want
    assert rows[len(want) :] == [-1] * (len(rows) - len(want))
    assert len(rows) % (16 * step) == 0


def test_needs_input_grad_is_honoured(seq_dot) -> None:
    x, dy = _data("x", 20, K), _data("dy", 20, N)
    ctx = _one_sample_ctx(20)
    # x needs no grad: no dx kernel, main_grad only
    w = _weight()
    with launches.observe() as log:
        g.linear("test", x, w, ctx, allow_fp32=True, tables=TABLES).backward(dy)
    assert [k for k, ph in log.events if ph == "bwd"] == ["triton:ws1_gemm_wgrad_blocks"]
    assert w.main_grad.abs().sum() > 0
    # the weight needs no grad: dx only, main_grad untouched
    w2 = _data("w", N, K)
    w2.main_grad = torch.zeros(N, K)
    xr = x.clone().requires_grad_(True)
    with launches.observe() as log:
        g.linear("test", xr, w2, ctx, allow_fp32=True, tables=TABLES).backward(dy)
    assert [k for k, ph in log.events if ph == "bwd"] == ["triton:ws1_gemm_fixed_k"]
    assert xr.grad is not None and not w2.main_grad.any()


def test_main_grad_created_lazily_when_absent() -> None:
    w = _data("w", N, K).requires_grad_(True)
    x, dy = _data("x", 4, K), _data("dy", 4, N)
    g.linear("test", x, w, _one_sample_ctx(4), allow_fp32=True, tables=TABLES).backward(dy)
    assert w.main_grad.dtype == F32 and w.main_grad.shape == (N, K) and w.grad is None


# ---------------------------------------------------------------------------------------------- contract


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def test_registered_ops_declare_what_they_launch_and_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels launched = the OpEntry's kernels; aten ops dispatched around the launches (the interpreter's own
    host copies inside a launch are not the candidate's and are not watched) = declared ones."""
    found, _why = BACKEND.load()
    assert {"det_gemm", "lm_head"} <= set(found)
    spec = found["det_gemm"]
    real_launch = g.launch

    def launch_unwatched(*args, **kwargs):
        with _disable_current_modes():
            return real_launch(*args, **kwargs)

    monkeypatch.setattr(g, "launch", launch_unwatched)
    x, dy = _data("x", 20, K), _data("dy", 20, N)
    w = _weight()
    xr = x.clone().requires_grad_(True)
    ctx = _one_sample_ctx(20)
    dy_strided = torch.cat([dy, dy], dim=1)[:, :N]  # a non-contiguous incoming gradient takes the clone path
    rec = _Ops()
    with launches.observe() as log, rec:
        g.linear("test", xr, w, ctx, allow_fp32=True, tables=TABLES).backward(dy_strided)
    assert set(log.kernels) == spec.kernel_ids
    assert "aten.clone" in rec.ops
    allowed = spec.declared_ops | {"aten.detach", "aten.alias"}  # autograd's own bookkeeping
    assert rec.ops <= allowed, sorted(rec.ops - allowed)


def _bad_calls():
    bf = torch.bfloat16
    x, w = torch.zeros(4, K, dtype=bf), torch.zeros(N, K, dtype=bf)
    ctx = _one_sample_ctx(4)
    bad_mg = torch.zeros(N, K, dtype=bf).requires_grad_(True)
    bad_mg.main_grad = torch.zeros(N, K, dtype=bf)
    bad_shape = torch.zeros(N, K, dtype=bf).requires_grad_(True)
    bad_shape.main_grad = torch.zeros(K, N)
    return {
        "fp32 into the bf16 op": lambda: g.det_gemm(x.float(), w.float(), ctx),
        "rank": lambda: g.det_gemm(x[None], w, ctx),
        "width": lambda: g.lm_head(x, torch.zeros(N, K + 1, dtype=bf), ctx),
        "non-contiguous x": lambda: g.det_gemm(torch.zeros(K, 4, dtype=bf).t(), w, ctx),
        "non-contiguous weight": lambda: g.det_gemm(x, torch.zeros(K, N, dtype=bf).t(), ctx),
        "empty batch": lambda: g.det_gemm(
            x[:0], w, LayoutContext(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
        ),
        "ctx length": lambda: g.det_gemm(x, w, _one_sample_ctx(5)),
        "ctx type": lambda: g.det_gemm(x, w, None),
        "main_grad dtype": lambda: g.det_gemm(x, bad_mg, ctx),
        "main_grad shape": lambda: g.det_gemm(x, bad_shape, ctx),
        "launcher mixed dtypes": lambda: g.gemm_forward(x, w.float()),
        "launcher int": lambda: g.gemm_forward(x.long(), w.long()),
        "dx width": lambda: g.gemm_dx(torch.zeros(4, N + 1, dtype=bf), w),
        "wgrad rows dtype": lambda: g.gemm_wgrad(
            torch.zeros(4, N), torch.zeros(4, K), torch.zeros(N, K), torch.full((16,), -1, dtype=torch.int64)
        ),
        "wgrad main_grad": lambda: g.gemm_wgrad(
            torch.zeros(4, N),
            torch.zeros(4, K),
            torch.zeros(N, K + 1),
            torch.full((16,), -1, dtype=torch.int32),
        ),
    }


@pytest.mark.parametrize("case", list(_bad_calls()))
def test_bad_input_raises(case: str) -> None:
    with pytest.raises(KernelInputError) as info:
        _bad_calls()[case]()
    assert "\n" not in str(info.value)


def test_seq_dot_model_is_row_position_independent(seq_dot) -> None:
    """Sanity of the test's own dot model: a row's bits do not depend on its index in the tile."""
    a = np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32)
    d = interp.TensorHandle(np.zeros((16, 16), np.float32), tl.float32)
    ha, hb = interp.TensorHandle(a, tl.float32), interp.TensorHandle(b, tl.float32)
    full = sequential_dot(None, ha, hb, d, "ieee", 0).data
    shifted = sequential_dot(None, interp.TensorHandle(np.roll(a, 7, 0), tl.float32), hb, d, "ieee", 0).data
    assert np.array_equal(np.roll(full, 7, 0), shifted)
