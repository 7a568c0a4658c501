"""rms_norm and qk_norm of the Triton profile on the GPU: bf16 at Qwen3-8B widths.

What only a GPU can show: the compiled reduction trees keep a row's bits whatever T and the layout, the
libdevice-free IEEE sqrt/div path is accurate at the contract's bf16 tolerance, and main_grad (fp32 block
sums added in block order) is identical bit for bit over micro-batch splits, permutation and padding, and the
pipelined backward gives the compiled bits (the real reduction trees) of the branching backward it replaced.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from triton_memops_support import (  # noqa: E402
    Batch,
    assert_bitwise,
    assert_close,
    check_declared,
    context,
    gen,
    layout,
    run_layout,
    same_bits,
)

from ws1_kernels import KernelInputError, reference  # noqa: E402
from ws1_kernels.triton_ops import _launch, norm  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        _launch.interpreting(), reason="TRITON_INTERPRET=1 runs kernels on the CPU, not the GPU"
    ),
]

BF, DEV, EPS = torch.bfloat16, "cuda", 1e-6
H, HEAD_DIM = 4096, 128
SHAPES = {"rms_norm": (H,), "q_norm": (32, HEAD_DIM), "k_norm": (8, HEAD_DIM)}
# 4 samples, 1100 tokens: many wgrad blocks, partial blocks, a sample shorter than one block
BIG = Batch((700, 250, 137, 13), (100, 50, 30, 5))
SMALL = Batch((40, 17, 9), (5, 3, 2))


def _op(kind: str) -> str:
    return "rms_norm" if kind == "rms_norm" else "qk_norm"


def _inputs(kind: str, n: int, seed: int = 0, scale: float = 1.0):
    x = gen(seed, (n, *SHAPES[kind]), scale, BF, DEV)
    w = (1.0 + gen(seed + 1, (SHAPES[kind][-1],), 0.1)).to(BF).to(DEV)
    return x, w


def _call(kind: str):
    fn = getattr(norm, _op(kind))
    return lambda rows, params, ctx: fn(rows["x"], params["w"], EPS, ctx)


@pytest.mark.parametrize("kind", sorted(SHAPES))
@pytest.mark.parametrize("scale", [1.0, 1e-3])  # 1e-3: mean square ~ eps
def test_matches_fp32_reference(kind: str, scale: float) -> None:
    x, w = _inputs(kind, BIG.total, scale=scale)
    g = gen(9, x.shape, 1.0, BF, DEV)
    res = run_layout(_call(kind), BIG, "packed", {"x": x}, {"w": w}, upstream=g)
    xr, wr = x.float().requires_grad_(), w.float().requires_grad_()
    y = getattr(reference, _op(kind))(xr, wr, EPS, context(layout(BIG, "packed")[0]))
    y.backward(g.float())
    assert res.out.dtype == BF
    assert_close(f"{kind} y", res.out, y, "forward_accuracy", "reduction")
    assert_close(f"{kind} dx", res.grads["x"], xr.grad, "gradient_accuracy", "reduction")
    assert res.params["w"].grad is None
    mg = res.params["w"].main_grad
    assert mg.dtype == torch.float32
    assert_close(f"{kind} dW", mg, wr.grad, "gradient_accuracy", "reduction", dtype=BF)


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_row_alone_equals_row_in_batch(kind: str) -> None:
    x, w = _inputs(kind, SMALL.total)
    packed = run_layout(_call(kind), SMALL, "packed", {"x": x}, {"w": w}).out
    for name in ("rows_alone", "padded_left", "permuted", "decode"):
        assert_bitwise(f"{kind} {name}", run_layout(_call(kind), SMALL, name, {"x": x}, {"w": w}).out, packed)
    # the same rows inside a much larger call
    big = Batch((*SMALL.lengths, *BIG.lengths), (*SMALL.prompt_lens, *BIG.prompt_lens))
    xa = torch.cat([x, _inputs(kind, BIG.total, seed=5)[0]])
    out = run_layout(_call(kind), big, "packed", {"x": xa}, {"w": w}).out
    assert_bitwise(f"{kind} inside 1100 more rows", out[: SMALL.total], packed)


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_gradients_do_not_depend_on_the_layout(kind: str) -> None:
    x, w = _inputs(kind, BIG.total)
    g = gen(9, x.shape, 1.0, BF, DEV)
    start = gen(11, w.shape, 3.0, torch.float32, DEV)
    one = run_layout(_call(kind), BIG, "packed", {"x": x}, {"w": w}, upstream=g, main_grad=start)
    for name in ("split_1", "split_half", "permuted", "padded_right", "padded_left"):
        other = run_layout(_call(kind), BIG, name, {"x": x}, {"w": w}, upstream=g, main_grad=start)
        assert_bitwise(f"{kind} dx {name}", other.grads["x"], one.grads["x"])
        assert_bitwise(
            f"{kind} main_grad {name}", other.params["w"].main_grad[None], one.params["w"].main_grad[None]
        )
    # negative control: samples in descending order (blocks added in another order) change some bits
    mg = start.clone()
    for s in reversed(range(len(BIG.lengths))):
        lo, n = BIG.offsets[s], BIG.lengths[s]
        r = run_layout(
            _call(kind), Batch((n,), (1,)), "packed", {"x": x[lo : lo + n]}, {"w": w}, upstream=g[lo : lo + n],
            main_grad=mg,
        )  # fmt: skip
        mg = r.params["w"].main_grad
    assert not same_bits(mg, one.params["w"].main_grad), "negative control: block order left no trace"


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_backward_gives_the_previous_kernels_bits(kind: str) -> None:
    """Pads, partial blocks and odd row counts at Qwen3 widths: dx and main_grad equal the previous kernel's;
    negative control: that kernel walking each block's slots backwards gives another main_grad."""
    from triton_memops_previous import prev_norm_backward

    for name in ("packed", "padded_right"):
        for i, call in enumerate(layout(BIG, name)):
            ctx = context(call)
            x, w = _inputs(kind, len(call.keys), seed=7 * i)
            g = gen(60 + i, x.shape, 1.0, BF, DEV)
            xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
            getattr(norm, _op(kind))(xl, wl, EPS, ctx).backward(g)
            dx, mg = prev_norm_backward(x, w, g, EPS, ctx)
            assert_bitwise(f"{kind} dx {name}", xl.grad, dx)
            assert same_bits(wl.main_grad, mg), f"{kind} main_grad {name}"
            _, mg_rev = prev_norm_backward(x, w, g, EPS, ctx, reversed_slots=True)
            assert not same_bits(mg_rev, mg), (
                f"{kind} {name}: the reversed slot order should change main_grad"
            )


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_declared_ops_and_kernels(kind: str) -> None:
    call = layout(SMALL, "padded_right")[0]
    x, w = _inputs(kind, len(call.keys))
    g = gen(9, x.shape, 1.0, BF, DEV)
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    ctx = context(call)
    spec = norm.OPS[_op(kind)]
    check_declared(spec, lambda: getattr(norm, _op(kind))(xl, wl, EPS, ctx).backward(g), {"fwd", "bwd"})
    with torch.no_grad():
        check_declared(spec, lambda: getattr(norm, _op(kind))(x, w, EPS, ctx), {"fwd"})


def test_bad_inputs_raise() -> None:
    x, w = _inputs("rms_norm", 3)
    ctx = context(layout(Batch((3,), (1,)), "packed")[0])
    for f in (
        lambda: norm.rms_norm(x.cpu(), w.cpu(), EPS, ctx),  # CPU tensors outside the interpreter
        lambda: norm.rms_norm(x, w.cpu(), EPS, ctx),  # mixed devices
        lambda: norm.rms_norm(x.half(), w.half(), EPS, ctx),
        lambda: norm.rms_norm(x[:, ::2], w[::2], EPS, ctx),
        lambda: norm.qk_norm(x.view(3, 32, 128)[:, :, :64], w[:64], EPS, ctx),
    ):
        with pytest.raises(KernelInputError):
            f()


def test_plain_forward_matches_operator() -> None:
    x, w = _inputs("rms_norm", 257)
    ctx = context(layout(Batch((257,), (1,)), "packed")[0])
    assert same_bits(norm.rms_norm_forward(x, w, EPS), norm.rms_norm(x, w, EPS, ctx))
