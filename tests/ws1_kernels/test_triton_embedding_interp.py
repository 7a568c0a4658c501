"""embedding of the Triton profile under TRITON_INTERPRET=1 (small shapes).

The forward is a copy and the backward adds bf16 upstream rows in fp32, both exact in the interpreter (only
fp32-to-bf16 rounding is unfaithful there), so bf16 weights are used and main_grad is compared bit for bit
with the portable candidate, whose per-element sequence of fp32 additions the kernel reproduces.
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

from ws1_kernels import KernelInputError, portable, reference

pytestmark = [pytest.mark.interp, needs_interpreter]

V, H = 40, 64
BATCHES = {1: Batch((1,), (1,)), 3: Batch((2, 1), (1, 1)), 17: Batch((12, 5), (3, 2))}


def _emb():
    from ws1_kernels.triton_ops import embedding

    return embedding


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    """Ids with repeats (a small pool), and both ends of the vocabulary."""
    pool = torch.tensor([0, V - 1, 7, 7, 13, 0, V - 1, 21])
    ids = pool[torch.randint(0, len(pool), (n,), generator=torch.Generator().manual_seed(seed))]
    ids[0] = 0
    if n > 1:
        ids[-1] = V - 1
    return ids


def _call(fn=None):
    fn = fn or _emb().embedding
    return lambda r, p, ctx: fn(r["ids"], p["weight"], ctx)


def _weight(dtype=torch.bfloat16) -> torch.Tensor:
    return gen(1, (V, H), 1.0, dtype)


@pytest.mark.parametrize("n", sorted(BATCHES))
def test_forward_copies_and_main_grad_matches_reference(n: int) -> None:
    b = BATCHES[n]
    ids, w = _ids(b.total), _weight()
    g = gen(9, (b.total, H), 1.0, torch.bfloat16)
    res = run_layout(_call(), b, "packed", {}, {"weight": w}, {"ids": ids}, upstream=g)
    assert same_bits(res.out, w[ids])  # an exact gather
    wr = w.float().requires_grad_()
    reference.embedding(ids, wr, context(layout(b, "packed")[0])).backward(g.float())
    assert res.params["weight"].grad is None
    assert_close("embedding dW", res.params["weight"].main_grad, wr.grad, "gradient_accuracy", "elementwise")


def test_main_grad_equals_the_portable_candidate_bit_for_bit() -> None:
    b = Batch((12, 5, 9), (3, 2, 4))
    ids, w = _ids(b.total), _weight()
    g = gen(9, (b.total, H), 1.0, torch.bfloat16)
    start = gen(11, (V, H), 2.0)
    ours = run_layout(_call(), b, "packed", {}, {"weight": w}, {"ids": ids}, upstream=g, main_grad=start)
    port = run_layout(
        _call(portable.embedding), b, "packed", {}, {"weight": w}, {"ids": ids}, upstream=g, main_grad=start
    )
    assert_bitwise("main_grad vs portable", ours.params["weight"].main_grad, port.params["weight"].main_grad)


def test_main_grad_over_micro_batches_equals_one_call() -> None:
    b = Batch((12, 5, 9), (3, 2, 4))
    ids, w = _ids(b.total), _weight()
    g = gen(9, (b.total, H), 1.0, torch.bfloat16)
    start = gen(11, (V, H), 2.0)
    kw = dict(ints={"ids": ids}, upstream=g, main_grad=start)
    one = run_layout(_call(), b, "packed", {}, {"weight": w}, **kw).params["weight"].main_grad
    for name in ("split_1", "split_half", "permuted", "padded_left"):
        other = run_layout(_call(), b, name, {}, {"weight": w}, **kw).params["weight"].main_grad
        assert_bitwise(f"main_grad {name}", other, one)
    # negative control: the samples' occurrences added in descending sample order change some bits
    mg = start.clone()
    for s in reversed(range(len(b.lengths))):
        lo, n = b.offsets[s], b.lengths[s]
        r = run_layout(
            _call(),
            Batch((n,), (1,)),
            "packed",
            {},
            {"weight": w},
            {"ids": ids[lo : lo + n]},
            upstream=g[lo : lo + n],
            main_grad=mg,
        )
        mg = r.params["weight"].main_grad
    assert not same_bits(mg, one), "negative control: occurrence order left no trace"


def test_repeated_ids_are_summed() -> None:
    """Every occurrence of an id lands in its row; rows of absent ids stay as they were."""
    b = BATCHES[17]
    ids = torch.tensor([V - 1] * 9 + [0] * 8)
    w = _weight()
    g = torch.ones(b.total, H, dtype=torch.bfloat16)
    res = run_layout(_call(), b, "packed", {}, {"weight": w}, {"ids": ids}, upstream=g)
    mg = res.params["weight"].main_grad
    assert bool((mg[V - 1] == 9).all()) and bool((mg[0] == 8).all()) and not mg[1 : V - 1].any()


def test_only_pads_and_no_weight_grad() -> None:
    emb = _emb()
    w = _weight().requires_grad_()
    w.main_grad = torch.zeros(V, H)
    pads = type(context(layout(BATCHES[1], "packed")[0]))(torch.tensor([-1, -1]), torch.tensor([-1, -1]))
    emb.embedding(torch.tensor([3, 4]), w, pads).float().sum().backward()
    assert not w.main_grad.any()
    y = emb.embedding(torch.tensor([3]), _weight(), context(layout(BATCHES[1], "packed")[0]))
    assert not y.requires_grad


def test_bad_inputs_raise() -> None:
    emb = _emb()
    ctx3 = context(layout(BATCHES[3], "packed")[0])
    w = _weight()
    ok = torch.tensor([0, 1, V - 1])
    bad = [
        lambda: emb.embedding(torch.tensor([0, -1, 2]), w, ctx3),
        lambda: emb.embedding(torch.tensor([0, V, 2]), w, ctx3),
        lambda: emb.embedding(ok.int(), w, ctx3),
        lambda: emb.embedding(ok[None], w, ctx3),
        lambda: emb.embedding(ok[:0], w, ctx3),
        lambda: emb.embedding(ok[:2], w, ctx3),
        lambda: emb.embedding(ok, w.half(), ctx3),
        lambda: emb.embedding(ok, w[0], ctx3),
        lambda: emb.embedding(ok, w.t().contiguous().t(), ctx3),
        lambda: emb.embedding([0, 1, 2], w, ctx3),
    ]
    for i, f in enumerate(bad):
        with pytest.raises(KernelInputError) as info:
            f()
        assert "\n" not in str(info.value), i


def test_declared_ops_and_kernels() -> None:
    emb = _emb()
    call = layout(BATCHES[17], "padded_right")[0]
    n = len(call.keys)
    ids = _ids(n)
    w = _weight().requires_grad_()
    g = gen(9, (n, H), 1.0, torch.bfloat16)
    ctx = context(call)
    check_declared(emb.OPS["embedding"], lambda: emb.embedding(ids, w, ctx).backward(g), {"fwd", "bwd"})
    assert w.main_grad.dtype == torch.float32 and w.grad is None
    with torch.no_grad():
        check_declared(emb.OPS["embedding"], lambda: emb.embedding(ids, w, ctx), {"fwd"})
