"""Triton logprob family (logp, linear_logp) under TRITON_INTERPRET=1: logic and invariance, fp32, tiny shapes.

The interpreter runs ``tl.dot`` as one numpy matmul, whose per-element order can depend on the element's place
in the tile (a BLAS artefact no GPU MMA has).  The bitwise tests of linear_logp therefore swap in ``seq_dot``
(the accumulator plus each k's products in ascending k, each fp32 add correctly rounded): the model of "one
accumulator walked in order" the kernels rely on.  Under it these tests check what the kernels control (row and
vocab indexing, zero-filled row blocks, the vocab chunk order, the LSE combine, the dx chain across chunks, the
16-token block table of main_grad).  Accuracy against the fp32 reference runs on the raw interpreter.  Whether
the H200's MMA keeps its bits is test_triton_logprob_gpu.py's job.
"""

from __future__ import annotations

import pytest
import torch
from kernels_support import Batch, interp_only, layout, make_case, run

pytest.importorskip("triton")

from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402

from ws1_kernels import KernelInputError, LayoutContext, launches, reference  # noqa: E402
from ws1_kernels.portable._blocks import wgrad_index  # noqa: E402
from ws1_kernels.triton_ops import BACKEND  # noqa: E402
from ws1_kernels.triton_ops import logprob as lp  # noqa: E402

pytestmark = interp_only()

V, H = 300, 64
TS = (1, 3, 17, 33)
F32 = torch.float32
# test-only tiles: several vocab blocks with a ragged tail (300 = 2*128 + 44), 16 rows per logp program (the
# interpreter pays per program; the GPU runs one row per program), 2 K steps, 3 forward chunks of 2 column
# tiles, 3 backward chunks, 2 row blocks at T=33
LOGP_T = lp.LogpTiles(block_v=128, rows=16)
LIN_T = lp.LinearLogpTiles(
    bm=32,
    bv=64,
    bk=32,
    vchunk=128,
    combine_rows=32,
    bwd_chunk=128,
    dx_bm=32,
    dx_bh=64,
    dx_bk=64,
    wg_bn=128,
    wg_bh=64,
    wg_blocks_per_step=1,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _logits(t: int, seed: int = 0) -> torch.Tensor:
    return torch.randn((t, V), generator=_gen(seed)) * 3.0


def _targets(t: int, seed: int = 7) -> torch.Tensor:
    return torch.randint(0, V, (t,), generator=_gen(seed))


def _xw(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn((t, H), generator=_gen(1))
    w = torch.randn((V, H), generator=_gen(2)) * (2 * H**-0.5)
    return x, w


def _ctx1(t: int) -> LayoutContext:
    return LayoutContext(torch.zeros(t, dtype=torch.int64), torch.arange(t))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32)


def _assert_bitwise(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, f"{what}: {tuple(a.shape)} vs {tuple(b.shape)}"
    diff = int((_bits(a) != _bits(b)).sum())
    assert diff == 0, f"{what}: {diff} of {a.numel()} elements differ in bits"


def _logp(logits, targets, ctx, tiles=LOGP_T):
    return lp.logp_apply("test.logp", logits, targets, ctx, allow_fp32=True, tiles=tiles)


def _linear(x, w, targets, ctx, tiles=LIN_T):
    return lp.linear_logp_apply("test.linear_logp", x, w, targets, ctx, allow_fp32=True, tiles=tiles)


def _run_linear(x, w, targets, ctx, g, tiles=LIN_T):
    """Forward + backward; returns (out, dx, main_grad)."""
    xr = x.clone().requires_grad_(True)
    wr = w.clone().requires_grad_(True)
    wr.main_grad = torch.zeros(w.shape)
    out = _linear(xr, wr, targets, ctx, tiles)
    out.backward(g)
    assert wr.grad is None
    return out.detach(), xr.grad, wr.main_grad


# ---------------------------------------------------------------------------------------------- logp


@pytest.mark.parametrize("t", TS)
def test_logp_matches_reference(t: int) -> None:
    logits, tg, g = _logits(t), _targets(t), torch.randn(t, generator=_gen(3))
    a = logits.clone().requires_grad_(True)
    out = _logp(a, tg, _ctx1(t))
    out.backward(g)
    b = logits.clone().requires_grad_(True)
    ref = reference.logp(b, tg, _ctx1(t))
    ref.backward(g)
    assert out.dtype == F32 and a.grad.dtype == F32
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5)


def test_logp_row_alone_equals_row_in_batch() -> None:
    t = 33
    logits, tg, g = _logits(t), _targets(t), torch.randn(t, generator=_gen(3))
    a = logits.clone().requires_grad_(True)
    out = _logp(a, tg, _ctx1(t))
    out.backward(g)
    for r in (0, 16, 32):
        one = logits[r : r + 1].clone().requires_grad_(True)
        o1 = _logp(one, tg[r : r + 1], _ctx1(1))
        o1.backward(g[r : r + 1])
        _assert_bitwise(o1, out[r : r + 1], f"logp row {r}")
        _assert_bitwise(one.grad, a.grad[r : r + 1], f"dlogits row {r}")


def test_logp_negative_control_block_size_changes_bits() -> None:
    """Another vocab block (another reduction order) gives another logsumexp: the input is not too easy.

    Logits are shifted so that lse is near 0: at lse ~ 8 its ulp absorbs the last bits of the sum and every
    order gives the correctly rounded value."""
    t = 33
    logits, tg = _logits(t) - 12.0, _targets(t)
    _, lse_a = lp._logp_fwd(logits, tg, LOGP_T, "fwd")
    _, lse_b = lp._logp_fwd(logits, tg, lp.LogpTiles(block_v=64, rows=16), "fwd")
    torch.testing.assert_close(lse_a, lse_b)
    assert (_bits(lse_a) != _bits(lse_b)).any()


def test_logp_forward_entry_equals_op() -> None:
    t = 17
    logits, tg = _logits(t), _targets(t)
    _assert_bitwise(lp.logp_forward(logits, tg, tiles=LOGP_T), _logp(logits, tg, _ctx1(t)), "logp_forward")


# ---------------------------------------------------------------------------------------------- linear_logp


@pytest.mark.parametrize("t", TS)
def test_linear_logp_matches_reference(t: int) -> None:
    x, w = _xw(t)
    tg, g = _targets(t), torch.randn(t, generator=_gen(3))
    out, dx, mg = _run_linear(x, w, tg, _ctx1(t), g)
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    ref = reference.linear_logp(xr, wr, tg, _ctx1(t))
    ref.backward(g)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(dx, xr.grad, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(mg, wr.grad, atol=2e-5, rtol=2e-5)


def test_linear_logp_row_alone_equals_row_in_batch(seq_dot) -> None:
    t = 33
    x, w = _xw(t)
    tg, g = _targets(t), torch.randn(t, generator=_gen(3))
    out, dx, _ = _run_linear(x, w, tg, _ctx1(t), g)
    for r in (5, 30):
        o1, dx1, _ = _run_linear(x[r : r + 1], w, tg[r : r + 1], _ctx1(1), g[r : r + 1])
        _assert_bitwise(o1, out[r : r + 1], f"linear_logp row {r}")
        _assert_bitwise(dx1, dx[r : r + 1], f"dx row {r}")


def test_linear_logp_negative_control_chunk_changes_bits(seq_dot) -> None:
    """Another vocab chunk (another LSE combine order) gives another logsumexp: the input is not too easy
    (a constant column shifts the logits so that lse is near 0, where its ulp does not absorb the sum's)."""
    t = 33
    x, w = _xw(t)
    x[:, 0], w[:, 0] = 1.0, -7.5
    tg = _targets(t)
    _, lse_a = lp._linear_fwd(x, w, tg, LIN_T, "fwd")
    _, lse_b = lp._linear_fwd(x, w, tg, lp.LinearLogpTiles(**{**LIN_T.__dict__, "vchunk": 64}), "fwd")
    torch.testing.assert_close(lse_a, lse_b)
    assert (_bits(lse_a) != _bits(lse_b)).any()


def test_linear_logp_backward_chunk_size_keeps_bits(seq_dot) -> None:
    """The backward vocab chunk only spills the dx chain to memory: its size never changes a bit."""
    t = 17
    x, w = _xw(t)
    tg, g = _targets(t), torch.randn(t, generator=_gen(3))
    ctx = LayoutContext(torch.tensor([0] * 9 + [1] * 8), torch.tensor(list(range(9)) + list(range(4, 12))))
    a = _run_linear(x, w, tg, ctx, g)
    b = _run_linear(x, w, tg, ctx, g, lp.LinearLogpTiles(**{**LIN_T.__dict__, "bwd_chunk": 64, "dx_bk": 32}))
    for name, u, v_ in zip(("out", "dx", "main_grad"), a, b, strict=True):
        _assert_bitwise(u, v_, name)


def test_linear_logp_is_closer_to_fp32_than_unfused_bf16_logits() -> None:
    """The fused forward keeps fp32 logits; the unfused path rounds them to bf16 before the logprob."""
    t = 33
    x, w = _xw(t)
    tg = _targets(t)
    ref = reference.linear_logp(x, w, tg, _ctx1(t))
    fused = _linear(x, w, tg, _ctx1(t))
    unfused = _logp((x @ w.t()).bfloat16().float(), tg, _ctx1(t))
    assert (fused - ref).abs().mean() * 20 < (unfused - ref).abs().mean()


def test_linear_logp_forward_entry_equals_op() -> None:
    t = 17
    x, w = _xw(t)
    tg = _targets(t)
    _assert_bitwise(
        lp.linear_logp_forward(x, w, tg, tiles=LIN_T), _linear(x, w, tg, _ctx1(t)), "forward entry"
    )


# ---------------------------------------------------------------------------------------------- layouts, main_grad

BATCH = Batch((5, 20, 3), (2, 4, 1))
TRAINING = ("packed", "split_half", "permuted", "padded_left")


def _fp32_case():
    case = make_case("linear_logp", BATCH, dict(hidden=H, vocab=V, inter=8, heads=1, kv_heads=1, head_dim=16))
    case.rows = {k: t.float() for k, t in case.rows.items()}
    case.params = {k: t.float() for k, t in case.params.items()}
    return case


def test_layouts_give_the_same_bits(seq_dot) -> None:
    """Outputs, dx and main_grad: two micro-batches, permuted and padded calls give the bits of one packed call
    (main_grad chains across calls in ascending sample order)."""
    case = _fp32_case()
    res = {
        lay: run(_linear, case, BATCH, layout(BATCH, lay), rule="sample_blocks_main_grad") for lay in TRAINING
    }
    base = res["packed"]
    assert base.pgrads["weight"].abs().max() > 0 and base.grads["x"].abs().max() > 0
    for lay, r in res.items():
        _assert_bitwise(r.out, base.out, f"{lay} out")
        _assert_bitwise(r.grads["x"], base.grads["x"], f"{lay} dx")
        _assert_bitwise(r.pgrads["weight"], base.pgrads["weight"], f"{lay} main_grad")


def test_negative_control_block_order_changes_main_grad(seq_dot) -> None:
    """Relabelled samples (same rows, another ascending-id order of the 16-token blocks) change main_grad's
    bits and nothing else: the rule's order is what the layout test above pins down."""
    t = 24
    x, w = _xw(t)
    tg, g = _targets(t), torch.randn(t, generator=_gen(3))
    pos = torch.tensor(list(range(12)) + list(range(9, 21)))
    a = _run_linear(x, w, tg, LayoutContext(torch.tensor([0] * 12 + [1] * 12), pos), g)
    b = _run_linear(x, w, tg, LayoutContext(torch.tensor([1] * 12 + [0] * 12), pos), g)
    _assert_bitwise(a[0], b[0], "out")
    _assert_bitwise(a[1], b[1], "dx")
    assert (_bits(a[2]) != _bits(b[2])).any()


def test_multi_block_steps_equal_one_block_steps(seq_dot) -> None:
    """The GPU default (4 blocks of 16 tokens per dot step) = one block per step under a chained dot model."""
    t = 24
    x, w = _xw(t)
    tg, g = _targets(t), torch.randn(t, generator=_gen(3))
    ctx = LayoutContext(
        torch.tensor([0] * 12 + [-1] * 2 + [1] * 10), torch.tensor([*range(12), -1, -1, *range(9, 19)])
    )
    a = _run_linear(x, w, tg, ctx, g)
    b = _run_linear(x, w, tg, ctx, g, lp.LinearLogpTiles(**{**LIN_T.__dict__, "wg_blocks_per_step": 4}))
    _assert_bitwise(a[2], b[2], "main_grad")


@pytest.mark.parametrize("step", [1, 4])
def test_wgrad_rows_follow_the_portable_rule(step: int) -> None:
    ctx = LayoutContext(
        torch.tensor([2] * 5 + [-1] + [0] * 20 + [1] * 3),
        torch.tensor([*range(30, 35), -1, *range(7, 27), 0, 1, 2]),
    )
    rows = lp.wgrad_rows(ctx.segments, step)
    want = wgrad_index(ctx.segments, zero_row=-1).flatten().tolist()
    assert rows[: len(want)] == want
    assert rows[len(want) :] == [-1] * (len(rows) - len(want)) and len(rows) % (16 * step) == 0


def test_needs_input_grad_is_honoured() -> None:
    t = 17
    x, w = _xw(t)
    tg, ctx = _targets(t), _ctx1(t)
    # only x needs a gradient: no wgrad kernel, no main_grad
    xr = x.clone().requires_grad_(True)
    with launches.observe() as log:
        _linear(xr, w, tg, ctx).sum().backward()
    bwd = {k for k, ph in log.events if ph == "bwd"}
    assert bwd == {"triton:ws1_linear_logp_dlogits", "triton:ws1_linear_logp_dx"}
    assert xr.grad is not None and not hasattr(w, "main_grad")
    # only the weight needs one: no dx kernel, main_grad created lazily as fp32 zeros then filled
    wr = w.clone().requires_grad_(True)
    with launches.observe() as log:
        _linear(x, wr, tg, ctx).sum().backward()
    bwd = {k for k, ph in log.events if ph == "bwd"}
    assert bwd == {"triton:ws1_linear_logp_dlogits", "triton:ws1_linear_logp_wgrad"}
    assert wr.grad is None and wr.main_grad.dtype == F32 and wr.main_grad.abs().max() > 0


def test_all_pad_call_leaves_main_grad_alone() -> None:
    x, w = _xw(3)
    wr = w.clone().requires_grad_(True)
    wr.main_grad = torch.zeros(w.shape)
    pads = LayoutContext(torch.full((3,), -1), torch.full((3,), -1))
    _linear(x, wr, _targets(3), pads).sum().backward()
    assert not wr.main_grad.any()


# ---------------------------------------------------------------------------------------------- contract


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("op", ["logp", "linear_logp"])
def test_registered_ops_declare_what_they_launch_and_dispatch(
    op: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kernels launched = the OpEntry's kernels; aten ops dispatched around the launches = declared ones (the
    interpreter's own host copies inside a launch are not the candidate's and are not watched)."""
    found, _why = BACKEND.load()
    spec = found[op]
    real_launch = lp.launch

    def launch_unwatched(*args, **kwargs):
        with _disable_current_modes():
            return real_launch(*args, **kwargs)

    monkeypatch.setattr(lp, "launch", launch_unwatched)
    t = 20
    tg = _targets(t)
    ctx = LayoutContext(torch.tensor([0] * 10 + [1] * 10), torch.tensor(list(range(10)) * 2))
    g = torch.ones(1).expand(t)  # a stride-0 incoming gradient (what .sum().backward() gives)
    rec = _Ops()
    if op == "logp":
        a = _logits(t).requires_grad_(True)
        with launches.observe() as log, rec:
            _logp(a, tg, ctx).backward(g)
    else:
        x, w = _xw(t)
        xr, wr = x.requires_grad_(True), w.requires_grad_(True)  # main_grad absent: created in the backward
        with launches.observe() as log, rec:
            _linear(xr, wr, tg, ctx).backward(g)
    assert set(log.kernels) == spec.kernel_ids
    assert {ph for _, ph in log.events} == {"fwd", "bwd"}
    allowed = spec.declared_ops | {"aten.detach", "aten.alias"}  # autograd's own bookkeeping
    assert rec.ops <= allowed, sorted(rec.ops - allowed)


def _bad_calls():
    bf = torch.bfloat16
    t = 4
    lg, tg = torch.zeros(t, V, dtype=bf), torch.zeros(t, dtype=torch.int64)
    x, w = torch.zeros(t, H, dtype=bf), torch.zeros(V, H, dtype=bf)
    ctx = _ctx1(t)
    empty = LayoutContext(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    bad_mg = torch.zeros(V, H, dtype=bf).requires_grad_(True)
    bad_mg.main_grad = torch.zeros(V, H, dtype=bf)

    def oob(val):
        t2 = tg.clone()
        t2[2] = val
        return t2

    return {
        "logp target -1": lambda: lp.logp(lg, oob(-1), ctx),
        "logp target V": lambda: lp.logp(lg, oob(V), ctx),
        "logp int32 targets": lambda: lp.logp(lg, tg.int(), ctx),
        "logp targets length": lambda: lp.logp(lg, tg[:3], ctx),
        "logp fp32 into the bf16 op": lambda: lp.logp(lg.float(), tg, ctx),
        "logp fp16 (interpreter entry)": lambda: _logp(lg.half(), tg, ctx),
        "logp rank": lambda: lp.logp(lg[None], tg, ctx),
        "logp empty batch": lambda: lp.logp(lg[:0], tg[:0], empty),
        "logp non-contiguous": lambda: lp.logp(torch.zeros(t, 2 * V, dtype=bf)[:, :V], tg, ctx),
        "logp ctx length": lambda: lp.logp(lg, tg, _ctx1(5)),
        "logp ctx type": lambda: lp.logp(lg, tg, None),
        "linear target V": lambda: lp.linear_logp(x, w, oob(V), ctx),
        "linear target -1": lambda: lp.linear_logp(x, w, oob(-1), ctx),
        "linear fp32 into the bf16 op": lambda: lp.linear_logp(x.float(), w.float(), tg, ctx),
        "linear mixed dtypes": lambda: _linear(x.float(), w, tg, ctx),
        "linear width": lambda: lp.linear_logp(x, torch.zeros(V, H + 1, dtype=bf), tg, ctx),
        "linear empty batch": lambda: lp.linear_logp(x[:0], w, tg[:0], empty),
        "linear non-contiguous x": lambda: lp.linear_logp(torch.zeros(H, t, dtype=bf).t(), w, tg, ctx),
        "linear non-contiguous weight": lambda: lp.linear_logp(x, torch.zeros(H, V, dtype=bf).t(), tg, ctx),
        "linear main_grad dtype": lambda: lp.linear_logp(x, bad_mg, tg, ctx),
        "linear ctx length": lambda: lp.linear_logp(x, w, tg, _ctx1(5)),
        "forward entry int32 targets": lambda: lp.linear_logp_forward(x, w, tg.int()),
        "bad tiles": lambda: lp.LinearLogpTiles(vchunk=100),
    }


@pytest.mark.parametrize("case", list(_bad_calls()))
def test_bad_input_raises(case: str) -> None:
    with pytest.raises(KernelInputError) as info:
        _bad_calls()[case]()
    msg = str(info.value)
    assert "\n" not in msg and ": " in msg
    if "target -1" in case or "target V" in case:
        assert ("-1" if "-1" in case else str(V)) in msg
    if "empty" in case:
        assert "empty" in msg


def _wgrad_direct(dl: torch.Tensor, dl_lo: torch.Tensor, x: torch.Tensor, ctx: LayoutContext, step: int):
    """main_grad from one launch of the wgrad kernel (fp32, one vocab chunk of all of dl's columns)."""
    t, cw = dl.shape
    h = x.shape[1]
    rows = torch.tensor(lp.wgrad_rows(ctx.segments, step), dtype=torch.int64)
    mg = torch.zeros((cw, h), dtype=F32)
    lp.ws1_linear_logp_wgrad[(1, 1)](
        dl, dl_lo, x, rows, mg, rows.numel() // (16 * step), 0, cw, cw, h,
        BN=cw, BH=h, ROWS_PER_STEP=16 * step, BLOCK=16, IEEE=True,
    )  # fmt: skip
    return mg


@pytest.mark.parametrize("step", [1, 2])
def test_wgrad_adds_the_residual_of_every_block(step: int) -> None:
    """main_grad = sum over the rule's blocks of (dl_b + dl_lo_b)^T x_b: the residual buffer is read, for the
    right rows, whatever the step size (the bf16 kernel's second significand half)."""
    ctx = LayoutContext(torch.tensor([0] * 20 + [1] * 13), torch.tensor([*range(20), *range(13)]))
    dl = torch.randn(33, 16, generator=_gen(5))
    dl_lo = torch.randn(33, 16, generator=_gen(6)) * 2.0**-9
    x = torch.randn(33, 32, generator=_gen(7))
    got = _wgrad_direct(dl, dl_lo, x, ctx, step)
    want = ((dl + dl_lo).double().t() @ x.double()).float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # negative control: without the residual the sum is off by far more than the tolerance
    without = _wgrad_direct(dl, torch.zeros_like(dl_lo), x, ctx, step)
    assert float((without - want).abs().max()) > 1e-3
