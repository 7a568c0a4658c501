"""Triton attention under TRITON_INTERPRET=1: logic and batch invariance, fp32, tiny shapes.

Shapes: 4 query / 2 kv heads (GQA group 2), head_dim 16, samples of 1, 5, 17 and 40 tokens.  Test tiles
(``TILES``) make every sample cross blocks: forward tiles of 16 positions x 2 heads over key blocks of 8, dQ
tiles of 8 positions, dK/dV blocks of 16 keys stepping 4 query positions at a time; a decode call (one row
per sample) runs tiles of one row x 2 heads padded to 16 slots.  The interpreter runs each ``tl.dot`` as one
numpy/OpenBLAS matmul whose per-element order depends on the element's slot in the tile (a BLAS artefact no
GPU MMA has).  Training layouts keep a row in the same slot of a same-shape tile (tiles are aligned to logical
positions), so they run on the raw interpreter; a decode tile puts the row in another slot, so the decode and
row-alone tests swap in ``seq_dot`` (each k's products added in ascending k, the model of one accumulator
walked in order).  The bitwise checks thus test what the kernels control: the tables, the slot and key
indexing, the masking, the key-block order, the prefix/own key source.  Whether the H200's MMA keeps the bits
across tile shapes is test_triton_attention_gpu.py's job.
"""

from __future__ import annotations

import functools

import pytest
import torch
from kernels_support import Batch, Call, Case, assert_bitwise, interp_only, layout, run, upstream

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402

from ws1_kernels import KernelInputError, LayoutContext, launches, reference  # noqa: E402
from ws1_kernels.triton_ops import attention as att  # noqa: E402

pytestmark = interp_only()

HQ, HKV, D = 4, 2, 16
SCALE = D**-0.5
F32 = torch.float32
TILES = att.Tiles(block_m=32, block_n=8, dq_m=16, dq_n=8, dkv_m=8, dkv_n=16, dec_m=16)
# decode: each sample's last 3 tokens (a 1-token sample decodes its only token with no prefix)
BATCH = Batch(lengths=(1, 5, 17, 40), prompt_lens=(0, 2, 14, 37))


def _case(seed: int = 0) -> Case:
    g = torch.Generator().manual_seed(seed)
    n = BATCH.total
    rows = {
        "q": torch.randn((n, HQ, D), generator=g) * 2.0,  # peaky softmax: block order matters in the bits
        "k": torch.randn((n, HKV, D), generator=g),
        "v": torch.randn((n, HKV, D), generator=g),
    }
    return Case("attention", rows, {}, {}, (("row", "q"), ("row", "k"), ("row", "v"), ("scalar", SCALE)))


def _fn(tiles: att.Tiles = TILES):
    def fn(q, k, v, scale, ctx):
        return att._attention(q, k, v, scale, ctx, tiles=tiles, allow_fp32=True)

    return fn


@functools.cache
def _packed(backward: bool):
    """The packed layout (one call), the baseline every other layout must match bit for bit."""
    return run(_fn(), _case(), BATCH, layout(BATCH, "packed"), rule=None, backward=backward)


_SEQ_PACKED: dict[str, object] = {}


def _packed_seq():
    """The packed forward under ``seq_dot`` (the caller holds the fixture), computed once."""
    if "out" not in _SEQ_PACKED:
        _SEQ_PACKED["out"] = run(
            _fn(), _case(), BATCH, layout(BATCH, "packed"), rule=None, backward=False
        ).out
    return _SEQ_PACKED["out"]


def _reference(case: Case, gout: torch.Tensor):
    call = layout(BATCH, "packed")[0]
    sid = torch.tensor([s for s, _ in call.keys], dtype=torch.int64)
    pos = torch.tensor([p for _, p in call.keys], dtype=torch.int64)
    rows = {k: t.clone().requires_grad_(True) for k, t in case.rows.items()}
    out = reference.attention(rows["q"], rows["k"], rows["v"], SCALE, LayoutContext(sid, pos))
    out.backward(gout)
    return out.detach(), {k: t.grad for k, t in rows.items()}


def _close(name: str, got: torch.Tensor, want: torch.Tensor, tol: float = 1e-5) -> None:
    err = float((got - want).abs().max())
    assert err <= tol * (1.0 + float(want.abs().max())), f"{name}: max abs error {err}"


# ------------------------------------------------------------------------------------------------ accuracy


def test_forward_and_backward_match_reference() -> None:
    res = _packed(True)
    gout = upstream(_case(), BATCH, (BATCH.total, HQ, D), F32)  # the upstream gradient run() used
    ref_out, ref_grads = _reference(_case(), gout)
    _close("out", res.out, ref_out)
    for k in ("q", "k", "v"):
        _close(f"d{k}", res.grads[k], ref_grads[k])


def test_default_tiles_forward_matches_reference() -> None:
    """The frozen D<=64 table entry (128 slots, key block 128) is a valid launch and right."""
    res = run(_fn(att.tiles_for(D)), _case(), BATCH, layout(BATCH, "packed"), rule=None, backward=False)
    ref_out, _ = _reference(_case(), torch.zeros((BATCH.total, HQ, D)))
    _close("out", res.out, ref_out)


def test_backward_with_prefix_matches_reference() -> None:
    """One chunk call (positions 7..13 of every sample long enough, earlier keys from kv_prefix): dQ reads
    prefix keys; the call's own keys get the gradient of the call's own queries, prefix keys none.  The
    reference runs whole samples with the upstream gradient on the chunk's rows only, which is the same
    function of the chunk's rows."""
    case = _case(3)
    call = layout(BATCH, "chunked_7")[1]
    res = run(_fn(), case, BATCH, [call], rule=None, backward=True)
    idx = torch.tensor([BATCH.offsets[s] + p for s, p in call.keys])
    mask = torch.zeros(BATCH.total, 1, 1)
    mask[idx] = 1.0
    ref_out, ref_grads = _reference(case, upstream(case, BATCH, (BATCH.total, HQ, D), F32) * mask)
    _close("out", res.out[idx], ref_out[idx])
    for k in ("q", "k", "v"):
        _close(f"d{k}", res.grads[k][idx], ref_grads[k][idx])


# ----------------------------------------------------------------------------------------------- invariance


@pytest.mark.parametrize("name", ["split_1", "split_half", "permuted", "padded_right", "padded_left"])
def test_forward_layouts_bitwise(name: str) -> None:
    """Each sample alone, two micro-batches, permuted samples, right and left pad rows: the bits of the
    packed call (pads carry garbage: it must not leak)."""
    res = run(_fn(), _case(), BATCH, layout(BATCH, name), rule=None, backward=False)
    assert_bitwise(f"{name} out", res.out, _packed(False).out)


def test_pad_rows_are_zero() -> None:
    call = layout(BATCH, "padded_left")[0]
    pads = torch.tensor([s < 0 for s, _ in call.keys])
    seen = {}

    def fn(q, k, v, scale, ctx):
        seen["out"] = att._attention(q, k, v, scale, ctx, tiles=TILES, allow_fp32=True)
        return seen["out"]

    run(fn, _case(), BATCH, [call], rule=None, backward=False)
    assert pads.any() and (seen["out"][pads] == 0).all()


@pytest.mark.parametrize("name", ["chunked_7", "decode"])
def test_inference_layouts_bitwise(name: str, seq_dot: None) -> None:
    """Chunked prefill (7 rows per sample per call) and decode (one row per sample per call, keys below it
    from kv_prefix, one-row tiles) give the full prefill's bits for every row."""
    res = run(_fn(), _case(), BATCH, layout(BATCH, name), rule=None, backward=False)
    assert_bitwise(f"{name} out", res.out, _packed_seq())


def test_row_alone_bitwise(seq_dot: None) -> None:
    """A single row alone in its call (a decode call: its earlier keys from kv_prefix) has the bits it has in
    the packed call: every row of the 40-token sample, on both sides of key-block and query-tile boundaries."""
    calls = [Call(((3, p),)) for p in range(40)]
    res = run(_fn(), _case(), BATCH, calls, rule=None, backward=False)
    rows = [BATCH.offsets[3] + p for p in range(40)]
    assert_bitwise("row alone", res.out[rows], _packed_seq()[rows])


def _launched(monkeypatch: pytest.MonkeyPatch, name: str) -> list[dict]:
    """The forward launches' constexprs of layout ``name``'s calls."""
    seen: list[dict] = []
    real = att.launch

    def spy(kernel, grid, phase, *args, **kwargs):
        if phase == "fwd":
            seen.append({"grid": grid, **kwargs})
        return real(kernel, grid, phase, *args, **kwargs)

    monkeypatch.setattr(att, "launch", spy)
    run(_fn(), _case(), BATCH, layout(BATCH, name), rule=None, backward=False)
    return seen


def test_decode_calls_take_one_row_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode call (one row per sample) launches one-row tiles of ``dec_m`` slots, one program per sample
    and kv head, so the bitwise decode tests above run the decode specialisation, not the prefill tiles."""
    seen = _launched(monkeypatch, "decode")  # the prompt call, then steps of 4, 3 and 3 samples
    assert [kw["grid"][0] for kw in seen[1:]] == [4, 3, 3]
    assert all(kw["R"] == 1 and kw["BLOCK_M"] == TILES.dec_m for kw in seen[1:])


def test_chunked_calls_keep_prefill_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: calls holding several rows of a sample keep the prefill tile (R = block_m // G rows)."""
    seen = _launched(monkeypatch, "chunked_7")
    assert seen and all(
        kw["R"] == TILES.block_m // (HQ // HKV) and kw["BLOCK_M"] == TILES.block_m for kw in seen
    )


_REAL_STEP = att._fwd_step


@triton.jit
def _reversed_prefix_step(
    acc, l_i, m_i, q, qpos, qk_scale, kb, k_ptr, v_ptr, pk_ptr, pv_ptr, row0, p0, length, kv_off,
    KV_STRIDE: tl.constexpr, BLOCK_N: tl.constexpr, HAS_PREFIX: tl.constexpr, MASKED: tl.constexpr,
    PREFIX_ONLY: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """A planted bug: the blocks wholly inside the prefix visited in descending order."""
    if PREFIX_ONLY:
        kb = p0 // BLOCK_N - 1 - kb
    return _REAL_STEP(
        acc, l_i, m_i, q, qpos, qk_scale, kb, k_ptr, v_ptr, pk_ptr, pv_ptr, row0, p0, length, kv_off,
        KV_STRIDE, BLOCK_N, HAS_PREFIX, MASKED, PREFIX_ONLY, DOT_PREC,
    )  # fmt: skip


def test_negative_control_decode_block_order_changes_bits(
    monkeypatch: pytest.MonkeyPatch, seq_dot: None
) -> None:
    """A decode path that walked the prefix's key blocks in another order would be caught: the rows whose
    prefix holds two or more whole blocks (the 40-token sample's last tokens) change bits."""
    base = _packed_seq()
    monkeypatch.setattr(att, "_fwd_step", _reversed_prefix_step)
    res = run(_fn(), _case(), BATCH, layout(BATCH, "decode"), rule=None, backward=False)
    rows = slice(BATCH.offsets[3] + BATCH.prompt_lens[3], BATCH.total)
    assert (res.out[rows] != base[rows]).any()


@pytest.mark.parametrize("name", ["split_1", "padded_left"])
def test_backward_layouts_bitwise(name: str) -> None:
    """dQ, dK, dV of every token: the packed call's bits in every training layout."""
    res = run(_fn(), _case(), BATCH, layout(BATCH, name), rule=None, backward=True)
    base = _packed(True)
    for k in ("q", "k", "v"):
        assert_bitwise(f"{name} d{k}", res.grads[k], base.grads[k])


def test_negative_control_key_block_changes_bits() -> None:
    """A key block size that followed T (8 for one call, 16 for another) would change the bits: the inputs
    are strong enough for the bitwise tests to see a wrong block order."""
    other = att.Tiles(block_m=32, block_n=16, dq_m=16, dq_n=8, dkv_m=8, dkv_n=16)
    res = run(_fn(other), _case(), BATCH, layout(BATCH, "packed"), rule=None, backward=False)
    base = _packed(False).out
    long_rows = slice(BATCH.offsets[3] + 16, BATCH.total)  # rows that see more than one key block of 16
    assert (res.out[long_rows] != base[long_rows]).any()


def test_launch_log_and_declared_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels launched = the OpEntry's kernels; aten ops dispatched around the launches (the interpreter's own
    host copies inside a launch are not the candidate's) stay inside the declared set."""

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    spec = att.OPS["attention"]
    real_launch = att.launch

    def launch_unwatched(*args, **kwargs):
        with _disable_current_modes():
            return real_launch(*args, **kwargs)

    monkeypatch.setattr(att, "launch", launch_unwatched)
    g = torch.Generator().manual_seed(1)
    q = torch.randn((6, HQ, D), generator=g).requires_grad_(True)
    k = torch.randn((6, HKV, D), generator=g).requires_grad_(True)
    v = torch.randn((6, HKV, D), generator=g).requires_grad_(True)
    ctx = LayoutContext(torch.tensor([0, 0, 0, -1, 1, 1]), torch.tensor([0, 1, 2, -1, 0, 1]))
    dout = torch.randn((6, HQ, 2 * D), generator=g)[:, :, :D]  # non-contiguous: the clone path
    rec = Ops()
    with launches.observe() as log, rec:
        att._attention(q, k, v, SCALE, ctx, tiles=TILES, allow_fp32=True).backward(dout)
    assert set(log.kernels) == spec.kernel_ids
    allowed = spec.declared_ops | {"aten.alias"}
    assert rec.ops <= allowed, sorted(rec.ops - allowed)


def test_attention_forward_matches_op() -> None:
    """The benchmark entry point (packed varlen, host cu_seqlens) gives the operator's packed bits."""
    case = _case()
    cu = [0, *torch.tensor(BATCH.lengths).cumsum(0).tolist()]
    out = att._varlen_forward(
        case.rows["q"], case.rows["k"], case.rows["v"], SCALE, cu, tiles=TILES, allow_fp32=True
    )
    assert_bitwise("attention_forward", out, _packed(False).out)


def test_a_packing_seen_before_reuses_its_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """attention_forward builds a packing's tables once: the second call with the same cu_seqlens builds none
    and gives the same bits; another packing (the control) builds its own and is not served the first's."""
    case = _case()
    q, k, v = case.rows["q"], case.rows["k"], case.rows["v"]
    cu = [0, *torch.tensor(BATCH.lengths).cumsum(0).tolist()]
    other = [0, cu[2], *cu[3:]]  # the first two samples as one
    monkeypatch.setattr(att, "_VARLEN_PLANS", {})
    built: list[int] = []
    real = att._build_plan
    monkeypatch.setattr(att, "_build_plan", lambda *a, **kw: built.append(1) or real(*a, **kw))
    first = att._varlen_forward(q, k, v, SCALE, cu, tiles=TILES, allow_fp32=True)
    again = att._varlen_forward(q, k, v, SCALE, cu, tiles=TILES, allow_fp32=True)
    assert len(built) == 1 and torch.equal(first.view(torch.int32), again.view(torch.int32))
    merged = att._varlen_forward(q, k, v, SCALE, other, tiles=TILES, allow_fp32=True)
    assert len(built) == 2 and not torch.equal(merged.view(torch.int32), first.view(torch.int32))


# ------------------------------------------------------------------------------------------ host-side cache


def _decode_call(seed: int = 5):
    """A decode step: samples 0 and 1 at positions 3 and 9, their earlier keys as kv_prefix."""
    g = torch.Generator().manual_seed(seed)
    pre = {
        s: (torch.randn((p, HKV, D), generator=g), torch.randn((p, HKV, D), generator=g))
        for s, p in ((0, 3), (1, 9))
    }
    q, k, v = (
        torch.randn((2, HQ, D), generator=g),
        torch.randn((2, HKV, D), generator=g),
        torch.randn((2, HKV, D), generator=g),
    )
    return q, k, v, LayoutContext(torch.tensor([0, 1]), torch.tensor([3, 9]), pre)


def test_repeated_call_skips_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second call on the same context with the same tensors reuses the validated plan (no per-sample walk)
    and gives the same bits."""
    q, k, v, ctx = _decode_call()
    calls: list[int] = []
    real = att.check_attention
    monkeypatch.setattr(att, "check_attention", lambda *a: calls.append(1) or real(*a))
    first = att._attention(q, k, v, SCALE, ctx, tiles=TILES, allow_fp32=True)
    again = att._attention(q, k, v, SCALE, ctx, tiles=TILES, allow_fp32=True)
    assert len(calls) == 1
    assert_bitwise("repeated call", again, first)


def _change(name: str, ctx: LayoutContext) -> None:
    pk, pv = ctx.kv_prefix[1]
    if name == "replaced":  # a new entry of the wrong dtype
        ctx.kv_prefix[1] = (pk.double(), pv)  # type: ignore[index]
    elif name == "resized":  # the same tensor object, shrunk in place
        pk.resize_(4, HKV, D)
    else:  # a new, non-contiguous tensor of the right shape
        ctx.kv_prefix[1] = (torch.zeros(HKV, 9, D).transpose(0, 1), pv)  # type: ignore[index]


@pytest.mark.parametrize("name", ["replaced", "resized", "non_contiguous"])
def test_changed_prefix_is_checked_again(name: str) -> None:
    """The cache never hides a bad input: a kv_prefix entry replaced or resized in place after a cached call
    is refused on the next call, as on a fresh context."""
    q, k, v, ctx = _decode_call()
    att._attention(q, k, v, SCALE, ctx, tiles=TILES, allow_fp32=True)
    _change(name, ctx)
    with pytest.raises(KernelInputError):
        att._attention(q, k, v, SCALE, ctx, tiles=TILES, allow_fp32=True)


# ---------------------------------------------------------------------------------------------- bad input


def _bad_calls():
    bf = torch.bfloat16
    q, k, v = (
        torch.zeros(4, HQ, D, dtype=bf),
        torch.zeros(4, HKV, D, dtype=bf),
        torch.zeros(4, HKV, D, dtype=bf),
    )
    ctx = LayoutContext(torch.zeros(4, dtype=torch.int64), torch.arange(4))
    pre_ctx = LayoutContext(torch.zeros(4, dtype=torch.int64), torch.arange(2, 6))
    good_pre = (torch.zeros(2, HKV, D, dtype=bf), torch.zeros(2, HKV, D, dtype=bf))
    empty = LayoutContext(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    return {
        "fp32 into the bf16 op": lambda: att.attention(q.float(), k.float(), v.float(), SCALE, ctx),
        "fp16": lambda: att.attention(q.half(), k.half(), v.half(), SCALE, ctx),
        "mixed dtypes": lambda: att._attention(q, k.float(), v, SCALE, ctx, allow_fp32=True),
        "rank": lambda: att.attention(q[None], k, v, SCALE, ctx),
        "heads not a multiple": lambda: att.attention(torch.zeros(4, 3, D, dtype=bf), k, v, SCALE, ctx),
        "head_dim not a power of two": lambda: att.attention(
            torch.zeros(4, HQ, 24, dtype=bf), torch.zeros(4, HKV, 24, dtype=bf), torch.zeros(4, HKV, 24, dtype=bf),
            SCALE, ctx,
        ),
        "non-contiguous q": lambda: att.attention(
            torch.zeros(4, D, HQ, dtype=bf).transpose(1, 2), k, v, SCALE, ctx
        ),
        "bad scale": lambda: att.attention(q, k, v, 0.0, ctx),
        "ctx length": lambda: att.attention(
            q, k, v, SCALE, LayoutContext(torch.zeros(5, dtype=torch.int64), torch.arange(5))
        ),
        "empty batch": lambda: att.attention(q[:0], k[:0], v[:0], SCALE, empty),
        "missing prefix": lambda: att.attention(q, k, v, SCALE, pre_ctx),
        "prefix dtype": lambda: att.attention(
            q, k, v, SCALE, LayoutContext(pre_ctx.sample_ids, pre_ctx.positions, {0: (good_pre[0].float(), good_pre[1])})
        ),
        "non-contiguous prefix": lambda: att.attention(
            q, k, v, SCALE,
            LayoutContext(
                pre_ctx.sample_ids, pre_ctx.positions,
                {0: (torch.zeros(HKV, 2, D, dtype=bf).transpose(0, 1), good_pre[1])},
            ),
        ),
        "cu_seqlens not rising": lambda: att.attention_forward(q, k, v, SCALE, [0, 3, 3, 4]),
        "cu_seqlens total": lambda: att.attention_forward(q, k, v, SCALE, [0, 3]),
    }  # fmt: skip


@pytest.mark.parametrize("name", list(_bad_calls()))
def test_bad_input_is_refused(name: str) -> None:
    with pytest.raises(KernelInputError) as info:
        _bad_calls()[name]()
    assert "\n" not in str(info.value)
