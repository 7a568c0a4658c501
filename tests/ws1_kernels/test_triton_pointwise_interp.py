"""silu, swiglu and rope of the Triton profile under TRITON_INTERPRET=1 (fp32, small shapes).

One property per test: accuracy against the fp32 reference (forward and backward), a row alone equals the row
in a batch bit for bit, rope takes its positions from the context (chunked and padded calls give the packed
bits), signed zeros follow the reference, needs_input_grad, bad input, declared ops and kernels, and the
two-kernel rope (cos/sin table, then rotation) gives the bits of the one-kernel rope it replaced.
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

F, NH, D, THETA = 48, 4, 16, 1e6
BATCHES = {1: Batch((1,), (1,)), 3: Batch((2, 1), (1, 1)), 17: Batch((12, 5), (3, 2))}
OPS = ("silu", "swiglu", "rope")


def _pw():
    from ws1_kernels.triton_ops import pointwise

    return pointwise


def _rows(op: str, n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    if op == "silu":
        return {"x": gen(seed, (n, F), 3.0)}
    if op == "swiglu":
        return {"gate": gen(seed, (n, F), 3.0), "up": gen(seed + 1, (n, F))}
    return {"x": gen(seed, (n, NH, D))}


def _call(op: str):
    fn = getattr(_pw(), op)
    if op == "swiglu":
        return lambda r, p, ctx: fn(r["gate"], r["up"], ctx)
    if op == "rope":
        return lambda r, p, ctx: fn(r["x"], THETA, ctx)
    return lambda r, p, ctx: fn(r["x"], ctx)


def _reference(op: str, rows: dict[str, torch.Tensor], b: Batch, g: torch.Tensor):
    leaves = {k: t.clone().requires_grad_() for k, t in rows.items()}
    ctx = context(layout(b, "packed")[0])
    if op == "swiglu":
        y = reference.swiglu(leaves["gate"], leaves["up"], ctx)
    elif op == "rope":
        y = reference.rope(leaves["x"], THETA, ctx)
    else:
        y = reference.silu(leaves["x"], ctx)
    y.backward(g)
    return y.detach(), {k: t.grad for k, t in leaves.items()}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", sorted(BATCHES))
def test_forward_and_backward_match_reference(op: str, n: int) -> None:
    b = BATCHES[n]
    rows = _rows(op, b.total)
    g = gen(9, next(iter(rows.values())).shape)
    res = run_layout(_call(op), b, "packed", rows, upstream=g)
    y_ref, grads_ref = _reference(op, rows, b, g)
    assert res.out.dtype == torch.float32
    assert_close(f"{op} y", res.out, y_ref, "forward_accuracy", "elementwise")
    for k, gr in grads_ref.items():
        assert_close(f"{op} d{k}", res.grads[k], gr, "gradient_accuracy", "elementwise")
    if op == "rope":  # angles, cos/sin and rotation follow the reference's rounding points exactly
        assert same_bits(res.out, y_ref) and same_bits(res.grads["x"], grads_ref["x"])


@pytest.mark.parametrize("op", OPS)
def test_row_alone_equals_row_in_batch(op: str) -> None:
    b = BATCHES[17]
    rows = _rows(op, b.total)
    packed = run_layout(_call(op), b, "packed", rows).out
    for name in ("rows_alone", "padded_left"):
        assert_bitwise(f"{op} {name}", run_layout(_call(op), b, name, rows).out, packed)


def test_rope_positions_come_from_the_context() -> None:
    """Chunked calls (first position > 0) and permuted samples give the packed bits; shifted ones do not."""
    b = BATCHES[17]
    rows = _rows("rope", b.total)
    g = gen(9, rows["x"].shape)
    packed = run_layout(_call("rope"), b, "packed", rows, upstream=g)
    for name in ("chunked_5", "permuted"):
        other = run_layout(_call("rope"), b, name, rows, upstream=g if name == "permuted" else None)
        assert_bitwise(f"rope {name}", other.out, packed.out)
        if name == "permuted":
            assert_bitwise("rope dx permuted", other.grads["x"], packed.grads["x"])
    # negative control: the same rows at positions shifted by one give other bits
    x = rows["x"]
    ctx = context(layout(b, "packed")[0])
    shifted = type(ctx)(ctx.sample_ids, ctx.positions + 1)
    assert not same_bits(_pw().rope(x, THETA, shifted), packed.out)


@pytest.mark.parametrize("name", ["packed", "padded_right", "chunked_5"])
def test_rope_table_gives_the_previous_kernels_bits(name: str) -> None:
    """Odd row counts, pad rows and chunk offsets: forward and backward equal the one-kernel rope bit for bit;
    negative control: that kernel with its angle's operands rounded to fp32 gives other bits."""
    from triton_memops_previous import prev_rope

    for i, call in enumerate(layout(BATCHES[17], name)):
        ctx = context(call)
        x = gen(20 + i, (len(call.keys), NH, D))
        g = gen(40 + i, x.shape)
        leaf = x.clone().requires_grad_()
        y = _pw().rope(leaf, THETA, ctx)
        y.backward(g)
        assert_bitwise(f"rope y {name}", y.detach(), prev_rope(x, ctx.positions, THETA, 1.0))
        assert_bitwise(f"rope dx {name}", leaf.grad, prev_rope(g, ctx.positions, THETA, -1.0))
        assert not same_bits(y.detach(), prev_rope(x, ctx.positions, THETA, 1.0, angle_fp32=True))


def test_rope_table_is_built_once_per_context() -> None:
    """q and k of every layer share one cos/sin table per call: the second call launches the rotation only."""
    from ws1_kernels import launches

    ctx = context(layout(BATCHES[3], "packed")[0])
    x = _rows("rope", 3)["x"]
    with launches.observe() as first:
        _pw().rope(x, THETA, ctx)
    with launches.observe() as second:
        _pw().rope(x, THETA, ctx)
    assert first.kernels == ["triton:ws1_rope_angles", "triton:ws1_rope_rotate"]
    assert second.kernels == ["triton:ws1_rope_rotate"]
    with launches.observe() as other_theta:  # negative control: another theta is another table
        _pw().rope(x, THETA / 2, ctx)
    assert other_theta.kernels == first.kernels


def test_rope_pads_use_position_zero() -> None:
    x = _rows("rope", 3)["x"]
    ctx = type(context(layout(BATCHES[1], "packed")[0]))(torch.tensor([0, -1, 1]), torch.tensor([0, -1, 0]))
    y = _pw().rope(x, THETA, ctx)
    assert same_bits(y[1], _pw().rope_forward(x[1:2], torch.tensor([0]), THETA)[0])


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # numpy's exp(200) in the interpreter
@pytest.mark.parametrize("op", ["silu", "swiglu"])
def test_signed_zeros_follow_the_reference(op: str) -> None:
    z = torch.tensor([0.0, -0.0, 0.0, -0.0, -100.0, 100.0, -200.0, 200.0])  # exp exact: 1, inf or 0
    ctx = context(layout(Batch((1,), (1,)), "packed")[0])
    if op == "silu":
        rows = {"x": z[None].clone()}
    else:  # every sign pair of (gate, up), and nonzero gates against signed zero ups
        rows = {"gate": z[None].clone(), "up": torch.tensor([[0.0, 0.0, -0.0, -0.0, 0.0, -0.0, -0.0, 0.0]])}
    g = torch.tensor([[1.0, -1.0, -0.0, 0.0, -0.0, 1.0, 1.0, -1.0]])
    leaves = {k: t.clone().requires_grad_() for k, t in rows.items()}
    y = _call(op)(leaves, {}, ctx)
    y.backward(g)
    y_ref, grads_ref = _reference(op, rows, Batch((1,), (1,)), g)
    assert same_bits(y, y_ref), f"{op}: {y} vs {y_ref}"
    for k, gr in grads_ref.items():
        assert same_bits(leaves[k].grad, gr), f"{op} d{k}: {leaves[k].grad} vs {gr}"
    if op == "silu":
        assert bool(torch.signbit(y[0, 1])) and not bool(torch.signbit(y[0, 0]))


def test_swiglu_needs_input_grad_is_honoured() -> None:
    rows = _rows("swiglu", 3)
    g = gen(9, rows["gate"].shape)
    ctx = context(layout(BATCHES[3], "packed")[0])
    full = run_layout(_call("swiglu"), BATCHES[3], "packed", rows, upstream=g)
    gate = rows["gate"].clone().requires_grad_()
    _pw().swiglu(gate, rows["up"], ctx).backward(g)
    assert same_bits(gate.grad, full.grads["gate"])
    up = rows["up"].clone().requires_grad_()
    _pw().swiglu(rows["gate"], up, ctx).backward(g)
    assert same_bits(up.grad, full.grads["up"])


def test_bad_inputs_raise() -> None:
    pw = _pw()
    ctx3 = context(layout(BATCHES[3], "packed")[0])
    x = gen(0, (3, F))
    xr = gen(0, (3, NH, D))
    bad = [
        lambda: pw.silu(x.half(), ctx3),
        lambda: pw.silu(x[None], ctx3),
        lambda: pw.silu(x.t().contiguous().t(), ctx3),
        lambda: pw.silu(x[:0], ctx3),
        lambda: pw.silu(x[:2], ctx3),
        lambda: pw.swiglu(x, x[:, :-1], ctx3),
        lambda: pw.swiglu(x, x.to(torch.bfloat16), ctx3),
        lambda: pw.rope(xr, 0.0, ctx3),
        lambda: pw.rope(xr[..., :-1], THETA, ctx3),
        lambda: pw.rope(x, THETA, ctx3),
        lambda: pw.rope(xr.transpose(0, 1).contiguous().transpose(0, 1), THETA, ctx3),
        lambda: pw.swiglu_forward(x, x[:2]),
        lambda: pw.rope_forward(xr, torch.zeros(3, dtype=torch.int32), THETA),
    ]
    for i, f in enumerate(bad):
        with pytest.raises(KernelInputError) as info:
            f()
        assert "\n" not in str(info.value), i


@pytest.mark.parametrize("op", OPS)
def test_declared_ops_and_kernels(op: str) -> None:
    pw = _pw()
    call = layout(BATCHES[17], "padded_right")[0]
    rows = _rows(op, len(call.keys))
    g = gen(9, next(iter(rows.values())).shape)
    leaves = {k: t.clone().requires_grad_() for k, t in rows.items()}
    ctx = context(call)
    check_declared(pw.OPS[op], lambda: _call(op)(leaves, {}, ctx).backward(g), {"fwd", "bwd"})
    with torch.no_grad():
        check_declared(pw.OPS[op], lambda: _call(op)(rows, {}, ctx), {"fwd"})


def test_plain_forwards_match_operators() -> None:
    pw = _pw()
    rows = _rows("swiglu", 3)
    ctx = context(layout(BATCHES[3], "packed")[0])
    assert same_bits(pw.swiglu_forward(rows["gate"], rows["up"]), pw.swiglu(rows["gate"], rows["up"], ctx))
    x = _rows("rope", 3)["x"]
    assert same_bits(pw.rope_forward(x, ctx.positions, THETA), pw.rope(x, THETA, ctx))
