"""rms_norm and qk_norm of the Triton profile under TRITON_INTERPRET=1 (fp32, small shapes).

One property per test: accuracy against the fp32 reference (forward, dx, dW), a row alone equals the row in a
batch bit for bit, main_grad over micro-batches equals one call bit for bit (with a negative control that a
different block order changes the bits), eps-scale rows, signed zeros, bad input, declared ops and kernels, and
the pipelined backward gives the bits of the branching backward it replaced.
"""

from __future__ import annotations

import pytest
import torch
from triton_memops_support import (
    Batch,
    assert_bitwise,
    assert_close,
    check_declared,
    context,
    gen,
    layout,
    needs_interpreter,
    run_layout,
    same_bits,
)

from ws1_kernels import KernelInputError, reference

pytestmark = [pytest.mark.interp, needs_interpreter]

H, NH, D, EPS = 64, 4, 16, 1e-6
BATCHES = {1: Batch((1,), (1,)), 3: Batch((2, 1), (1, 1)), 17: Batch((12, 5), (3, 2))}
# 17 tokens in one sample: two wgrad blocks, so the block order is visible in main_grad
LONG = Batch((17,), (4,))


def _ops():
    from ws1_kernels.triton_ops import norm

    return norm


def _inputs(op: str, n: int, scale: float = 1.0, seed: int = 0):
    shape, wd = ((n, H), H) if op == "rms_norm" else ((n, NH, D), D)
    x = gen(seed, shape, scale)
    w = 1.0 + gen(seed + 1, (wd,), 0.1)
    return x, w


def _call(op: str):
    fn = getattr(_ops(), op)
    return lambda rows, params, ctx: fn(rows["x"], params["w"], EPS, ctx)


def _ref(op: str, x: torch.Tensor, w: torch.Tensor, g: torch.Tensor):
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    n = x.shape[0]
    y = getattr(reference, op)(xr, wr, EPS, context(layout(Batch((n,), (1,)), "packed")[0]))
    y.backward(g)
    return y.detach(), xr.grad, wr.grad


@pytest.mark.parametrize("op", ["rms_norm", "qk_norm"])
@pytest.mark.parametrize("n", sorted(BATCHES))
def test_forward_and_backward_match_reference(op: str, n: int) -> None:
    b = BATCHES[n]
    x, w = _inputs(op, n)
    g = gen(9, x.shape)
    res = run_layout(_call(op), b, "packed", {"x": x}, {"w": w}, upstream=g)
    y_ref, dx_ref, dw_ref = _ref(op, x, w, g)
    assert res.out.dtype == torch.float32
    assert_close(f"{op} y", res.out, y_ref, "forward_accuracy", "reduction")
    assert_close(f"{op} dx", res.grads["x"], dx_ref, "gradient_accuracy", "reduction")
    assert res.params["w"].grad is None
    assert_close(f"{op} dW", res.params["w"].main_grad, dw_ref, "gradient_accuracy", "reduction")


@pytest.mark.parametrize("op", ["rms_norm", "qk_norm"])
def test_row_alone_equals_row_in_batch(op: str) -> None:
    b = BATCHES[17]
    x, w = _inputs(op, b.total)
    packed = run_layout(_call(op), b, "packed", {"x": x}, {"w": w}).out
    for name in ("rows_alone", "padded_left", "permuted"):
        assert_bitwise(f"{op} {name}", run_layout(_call(op), b, name, {"x": x}, {"w": w}).out, packed)


@pytest.mark.parametrize("op", ["rms_norm", "qk_norm"])
def test_dx_does_not_depend_on_the_layout(op: str) -> None:
    b = BATCHES[17]
    x, w = _inputs(op, b.total)
    g = gen(9, x.shape)
    packed = run_layout(_call(op), b, "packed", {"x": x}, {"w": w}, upstream=g).grads["x"]
    for name in ("split_1", "padded_right"):
        other = run_layout(_call(op), b, name, {"x": x}, {"w": w}, upstream=g).grads["x"]
        assert_bitwise(f"{op} dx {name}", other, packed)


@pytest.mark.parametrize("op", ["rms_norm", "qk_norm"])
def test_main_grad_over_micro_batches_equals_one_call(op: str) -> None:
    b = Batch((17, 5, 9), (4, 2, 3))
    x, w = _inputs(op, b.total)
    g = gen(9, x.shape)
    start = gen(11, w.shape, 3.0)  # main_grad carries a previous layout's sum
    one = run_layout(_call(op), b, "packed", {"x": x}, {"w": w}, upstream=g, main_grad=start)
    for name in ("split_1", "padded_left"):
        other = run_layout(_call(op), b, name, {"x": x}, {"w": w}, upstream=g, main_grad=start)
        assert_bitwise(
            f"{op} main_grad {name}", other.params["w"].main_grad[None], one.params["w"].main_grad[None]
        )
    # negative control: the same blocks added in another order (samples descending) must change some bits,
    # or the inputs are too weak to show an order dependence
    desc = torch.zeros_like(start)
    desc.copy_(start)
    for s in reversed(range(len(b.lengths))):
        sub = Batch((b.lengths[s],), (1,))
        lo = b.offsets[s]
        r = run_layout(
            _call(op),
            sub,
            "packed",
            {"x": x[lo : lo + b.lengths[s]]},
            {"w": w},
            upstream=g[lo : lo + b.lengths[s]],
            main_grad=desc,
        )
        desc = r.params["w"].main_grad
    assert not same_bits(desc, one.params["w"].main_grad), "negative control: block order left no trace"


@pytest.mark.parametrize("op", ["rms_norm", "qk_norm"])
@pytest.mark.parametrize("name", ["packed", "padded_right", "chunked_5"])
def test_backward_gives_the_previous_kernels_bits(op: str, name: str) -> None:
    """Odd row counts, empty slots, pad rows and partial blocks: dx and main_grad equal the previous kernel's;
    negative control: that kernel walking each block's slots backwards gives another main_grad (in some call:
    two slots add the same either way)."""
    from triton_memops_previous import prev_norm_backward

    reversed_differs = []
    for i, call in enumerate(layout(LONG, name)):
        ctx = context(call)
        x, w = _inputs(op, len(call.keys), seed=3 * i)
        g = gen(50 + i, x.shape)
        xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
        getattr(_ops(), op)(xl, wl, EPS, ctx).backward(g)
        dx, mg = prev_norm_backward(x, w, g, EPS, ctx)
        assert_bitwise(f"{op} dx {name}", xl.grad, dx)
        assert same_bits(wl.main_grad, mg), f"{op} main_grad {name}"
        _, mg_rev = prev_norm_backward(x, w, g, EPS, ctx, reversed_slots=True)
        reversed_differs.append(not same_bits(mg_rev, mg))
    assert any(reversed_differs), f"{op} {name}: the reversed slot order should change main_grad"


@pytest.mark.parametrize("op", ["rms_norm", "qk_norm"])
def test_eps_scale_rows(op: str) -> None:
    """Rows whose mean square is comparable to eps: eps must enter as the reference adds it."""
    b = BATCHES[3]
    x, w = _inputs(op, b.total, scale=1e-3)  # mean(x^2) ~ 1e-6 = eps
    g = gen(9, x.shape)
    res = run_layout(_call(op), b, "packed", {"x": x}, {"w": w}, upstream=g)
    y_ref, dx_ref, dw_ref = _ref(op, x, w, g)
    assert_close(f"{op} y", res.out, y_ref, "forward_accuracy", "reduction")
    assert_close(f"{op} dx", res.grads["x"], dx_ref, "gradient_accuracy", "reduction")
    assert_close(f"{op} dW", res.params["w"].main_grad, dw_ref, "gradient_accuracy", "reduction")
    # without eps every row would come out at unit RMS (times w ~ 1); with it they stay visibly smaller
    rms = (
        (res.out / w).pow(2).flatten(1).mean(1).sqrt()
        if op == "rms_norm"
        else (res.out / w).pow(2).mean(-1).sqrt()
    )
    assert rms.max() < 0.9


@pytest.mark.parametrize("op", ["rms_norm", "qk_norm"])
def test_signed_zeros(op: str) -> None:
    x, w = _inputs(op, 3)
    x[1] = 0.0
    x[2] = -0.0
    ctx = context(layout(BATCHES[3], "packed")[0])
    y = getattr(_ops(), op)(x, w, EPS, ctx)
    y_ref = getattr(reference, op)(x, w, EPS, ctx)
    assert same_bits(y[1:], y_ref[1:]) and bool(torch.signbit(y[2]).all()) and not torch.signbit(y[1]).any()


@pytest.mark.parametrize("op", ["rms_norm", "qk_norm"])
def test_needs_input_grad_is_honoured(op: str) -> None:
    b = BATCHES[17]
    x, w = _inputs(op, b.total)
    g = gen(9, x.shape)
    full = run_layout(_call(op), b, "packed", {"x": x}, {"w": w}, upstream=g)
    ctx = context(layout(b, "packed")[0])
    fn = getattr(_ops(), op)
    # only dx: main_grad untouched, dx unchanged
    xo = x.clone().requires_grad_()
    wo = w.clone()
    fn(xo, wo, EPS, ctx).backward(g)
    assert getattr(wo, "main_grad", None) is None and same_bits(xo.grad, full.grads["x"])
    # only dW: no dx, main_grad unchanged
    wl = w.clone().requires_grad_()
    wl.main_grad = torch.zeros_like(w)
    fn(x, wl, EPS, ctx).backward(g)
    assert same_bits(wl.main_grad, full.params["w"].main_grad)


def test_bad_inputs_raise() -> None:
    norm = _ops()
    ctx3 = context(layout(BATCHES[3], "packed")[0])
    x, w = _inputs("rms_norm", 3)
    bad = [
        lambda: norm.rms_norm(x.half(), w.half(), EPS, ctx3),  # dtype
        lambda: norm.rms_norm(x, w.to(torch.bfloat16), EPS, ctx3),  # mixed dtypes
        lambda: norm.rms_norm(x[None], w, EPS, ctx3),  # rank
        lambda: norm.rms_norm(x, w[:-1], EPS, ctx3),  # weight width
        lambda: norm.rms_norm(x.t().contiguous().t(), w, EPS, ctx3),  # non-contiguous
        lambda: norm.rms_norm(x[:0], w, EPS, ctx3),  # empty batch
        lambda: norm.rms_norm(x[:2], w, EPS, ctx3),  # ctx length
        lambda: norm.rms_norm(x, w, 0.0, ctx3),  # eps
        lambda: norm.qk_norm(x, w, EPS, ctx3),  # rank for qk_norm
        lambda: norm.rms_norm_forward(x, w[:-1], EPS),
    ]
    for i, f in enumerate(bad):
        with pytest.raises(KernelInputError) as info:
            f()
        assert "\n" not in str(info.value), i
    wm = w.clone()
    wm.main_grad = torch.zeros(3)
    with pytest.raises(KernelInputError, match="main_grad"):
        norm.rms_norm(x, wm, EPS, ctx3)


@pytest.mark.parametrize("op", ["rms_norm", "qk_norm"])
def test_declared_ops_and_kernels(op: str) -> None:
    norm = _ops()
    call = layout(BATCHES[17], "padded_right")[0]  # pads between samples: real blocks and pad programs
    n = len(call.keys)
    x, w = _inputs(op, n)
    g = gen(9, x.shape)
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    ctx = context(call)
    check_declared(norm.OPS[op], lambda: getattr(norm, op)(xl, wl, EPS, ctx).backward(g), {"fwd", "bwd"})
    with torch.no_grad():
        check_declared(norm.OPS[op], lambda: getattr(norm, op)(x, w, EPS, ctx), {"fwd"})


def test_plain_forward_matches_operator() -> None:
    norm = _ops()
    x, w = _inputs("rms_norm", 3)
    ctx = context(layout(BATCHES[3], "packed")[0])
    assert same_bits(norm.rms_norm_forward(x, w, EPS), norm.rms_norm(x, w, EPS, ctx))
    xq, wq = _inputs("qk_norm", 3)
    assert same_bits(norm.rms_norm_forward(xq, wq, EPS), norm.qk_norm(xq, wq, EPS, ctx))
