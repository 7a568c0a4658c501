"""silu, swiglu and rope of the Triton profile on the GPU: bf16 at Qwen3-8B widths.

What only a GPU can show: libdevice exp/cos/sin and the RTNE bf16 rounding are accurate at the contract's
tolerance, every element's bits are independent of T and of the layout (positions from the context), and
signed zeros come out as the reference's, and the two-kernel rope (cos/sin table, then rotation) gives the
compiled bits of the one-kernel rope it replaced (libdevice cos/sin at real positions).
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

from ws1_kernels import KernelInputError, LayoutContext, reference  # noqa: E402
from ws1_kernels.triton_ops import _launch, pointwise  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        _launch.interpreting(), reason="TRITON_INTERPRET=1 runs kernels on the CPU, not the GPU"
    ),
]

BF, DEV, THETA = torch.bfloat16, "cuda", 1e6
F = 12288
KINDS = ("silu", "swiglu", "rope_q", "rope_k")
BIG = Batch((700, 250, 137, 13), (100, 50, 30, 5))
SMALL = Batch((40, 17, 9), (5, 3, 2))


def _rows(kind: str, n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    if kind == "silu":
        return {"x": gen(seed, (n, F), 3.0, BF, DEV)}
    if kind == "swiglu":
        return {"gate": gen(seed, (n, F), 3.0, BF, DEV), "up": gen(seed + 1, (n, F), 1.0, BF, DEV)}
    return {"x": gen(seed, (n, 32 if kind == "rope_q" else 8, 128), 1.0, BF, DEV)}


def _call(kind: str):
    if kind == "swiglu":
        return lambda r, p, ctx: pointwise.swiglu(r["gate"], r["up"], ctx)
    if kind == "silu":
        return lambda r, p, ctx: pointwise.silu(r["x"], ctx)
    return lambda r, p, ctx: pointwise.rope(r["x"], THETA, ctx)


def _reference(kind: str, rows: dict[str, torch.Tensor], b: Batch, g: torch.Tensor):
    leaves = {k: t.float().requires_grad_() for k, t in rows.items()}
    ctx = context(layout(b, "packed")[0])
    if kind == "swiglu":
        y = reference.swiglu(leaves["gate"], leaves["up"], ctx)
    elif kind == "silu":
        y = reference.silu(leaves["x"], ctx)
    else:  # the reference builds its tables from ctx.positions (host); run it on the CPU
        leaves = {k: t.detach().cpu().requires_grad_() for k, t in leaves.items()}
        y = reference.rope(leaves["x"], THETA, ctx)
        g = g.cpu()
    y.backward(g.float())
    return y.detach(), {k: t.grad for k, t in leaves.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_matches_fp32_reference(kind: str) -> None:
    rows = _rows(kind, BIG.total)
    g = gen(9, next(iter(rows.values())).shape, 1.0, BF, DEV)
    res = run_layout(_call(kind), BIG, "packed", rows, upstream=g)
    y_ref, grads_ref = _reference(kind, rows, BIG, g)
    assert res.out.dtype == BF
    assert_close(f"{kind} y", res.out, y_ref, "forward_accuracy", "elementwise")
    for k, gr in grads_ref.items():
        assert_close(f"{kind} d{k}", res.grads[k], gr, "gradient_accuracy", "elementwise")


@pytest.mark.parametrize("kind", KINDS)
def test_bits_do_not_depend_on_the_layout(kind: str) -> None:
    rows = _rows(kind, SMALL.total)
    g = gen(9, next(iter(rows.values())).shape, 1.0, BF, DEV)
    packed = run_layout(_call(kind), SMALL, "packed", rows, upstream=g)
    for name in ("rows_alone", "split_1", "permuted", "padded_left"):
        other = run_layout(_call(kind), SMALL, name, rows, upstream=g)
        assert_bitwise(f"{kind} {name}", other.out, packed.out)
        for k in rows:
            assert_bitwise(f"{kind} d{k} {name}", other.grads[k], packed.grads[k])
    for name in ("chunked_5", "decode"):  # inference layouts: first positions > 0 for rope
        assert_bitwise(f"{kind} {name}", run_layout(_call(kind), SMALL, name, rows).out, packed.out)


@pytest.mark.parametrize("kind", ["rope_q", "rope_k"])
def test_rope_table_gives_the_previous_kernels_bits(kind: str) -> None:
    """Pads, odd row counts and positions up to 32k: forward and backward equal the one-kernel rope bit for
    bit; negative control: that kernel with its angle's operands rounded to fp32 gives other bits."""
    from triton_memops_previous import prev_rope

    long_ctx = LayoutContext(torch.zeros(1001, dtype=torch.int64), torch.arange(31000, 32001))
    ctxs = [context(c) for c in layout(BIG, "padded_right")] + [long_ctx]
    for i, ctx in enumerate(ctxs):
        positions = ctx.on(DEV)[1]
        x = _rows(kind, positions.shape[0], seed=10 + i)["x"]
        g = gen(30 + i, x.shape, 1.0, BF, DEV)
        leaf = x.clone().requires_grad_()
        y = pointwise.rope(leaf, THETA, ctx)
        y.backward(g)
        assert_bitwise(f"{kind} y", y.detach(), prev_rope(x, positions, THETA, 1.0))
        assert_bitwise(f"{kind} dx", leaf.grad, prev_rope(g, positions, THETA, -1.0))
        assert not same_bits(y.detach(), prev_rope(x, positions, THETA, 1.0, angle_fp32=True))


@pytest.mark.parametrize("kind", ["silu", "swiglu"])
def test_signed_zeros(kind: str) -> None:
    z = torch.tensor([[0.0, -0.0, 0.0, -0.0, -100.0, 100.0, -200.0, 200.0]], dtype=BF, device=DEV)
    ctx = context(layout(Batch((1,), (1,)), "packed")[0])
    rows = (
        {"x": z}
        if kind == "silu"
        else {"gate": z, "up": torch.tensor([[0.0, 0.0, -0.0, -0.0] * 2], dtype=BF).to(DEV)}
    )
    y = _call(kind)(rows, {}, ctx)
    y_ref, _ = _reference(kind, rows, Batch((1,), (1,)), torch.ones_like(z))
    assert same_bits(y, y_ref.to(BF)), f"{kind}: {y} vs {y_ref}"
    assert torch.equal(torch.signbit(y), torch.signbit(y_ref))


@pytest.mark.parametrize("kind", ["silu", "swiglu", "rope_q"])
def test_declared_ops_and_kernels(kind: str) -> None:
    call = layout(SMALL, "padded_right")[0]
    rows = _rows(kind, len(call.keys))
    g = gen(9, next(iter(rows.values())).shape, 1.0, BF, DEV)
    leaves = {k: t.clone().requires_grad_() for k, t in rows.items()}
    ctx = context(call)
    spec = pointwise.OPS["rope" if kind.startswith("rope") else kind]
    if kind == "rope_q":
        pointwise.rope(rows["x"], THETA, ctx)  # the one-time inverse-frequency table (declared too) first
    check_declared(spec, lambda: _call(kind)(leaves, {}, ctx).backward(g), {"fwd", "bwd"})
    with torch.no_grad():
        check_declared(spec, lambda: _call(kind)(rows, {}, ctx), {"fwd"})


def test_bad_inputs_raise() -> None:
    x = _rows("silu", 3)["x"]
    ctx = context(layout(Batch((3,), (1,)), "packed")[0])
    for f in (
        lambda: pointwise.silu(x.cpu(), ctx),
        lambda: pointwise.swiglu(x, x.cpu(), ctx),
        lambda: pointwise.silu(x[:, ::2], ctx),
        lambda: pointwise.rope(x.view(3, 96, 128)[:, :, :64], THETA, ctx),
        lambda: pointwise.rope(x.view(3, 96, 128)[:, :, :127], THETA, ctx),
    ):
        with pytest.raises(KernelInputError):
            f()


def test_plain_forwards_match_operators() -> None:
    rows = _rows("swiglu", 257)
    ctx = context(layout(Batch((257,), (1,)), "packed")[0])
    assert same_bits(
        pointwise.swiglu_forward(rows["gate"], rows["up"]), pointwise.swiglu(rows["gate"], rows["up"], ctx)
    )
    x = _rows("rope_q", 257)["x"]
    pos = ctx.positions.to(DEV)
    assert same_bits(pointwise.rope_forward(x, pos, THETA), pointwise.rope(x, THETA, ctx))
