"""Every batch-invariant profile (each one with candidates but the stock baseline; portable_cpu on a CPU, Triton
where the registry finds its GPU) gives the same bits for a row whatever the batch; the stock baseline does not.

Every comparison restores logical order first and compares integer views.  Training layouts are compared on the
output, the token gradients and the parameter gradient (``main_grad`` across micro-batch splits and
permutation); inference layouts (chunked prefill with a key prefix, decode) and one-row-per-call on the output.
"""

from __future__ import annotations

import pytest
import torch
from kernels_support import INFERENCE, OP_CLASS, TRAINING, Batch, assert_bitwise, bits, layout, make_case, run
from profiles_support import BATCH_INVARIANT_PROFILES, resolve_or_skip

from ws1_kernels import registry

DIMS = dict(hidden=192, vocab=1500, inter=160, heads=4, kv_heads=2, head_dim=64)
# lengths cross the 16/32/48/64 blocks (WGRAD_BLOCK, QUERY_BLOCK, ROW_BLOCK, KEY_BLOCK)
BATCH = Batch((7, 70, 3, 33, 17), (3, 20, 1, 30, 5))


@pytest.fixture(scope="module")
def canonical():
    cache = {}

    def get(profile, op):
        if (profile, op) not in cache:
            cand = resolve_or_skip(profile, op)
            case = make_case(op, BATCH, DIMS, seed=3)
            cache[profile, op] = (
                cand,
                case,
                run(cand.fn, case, BATCH, layout(BATCH, "packed"), rule=cand.param_grad_rule),
            )
        return cache[profile, op]

    return get


@pytest.mark.parametrize("lay", [t for t in TRAINING if t != "packed"])
@pytest.mark.parametrize("op", sorted(OP_CLASS))
@pytest.mark.parametrize("profile", BATCH_INVARIANT_PROFILES)
def test_training_layouts_bitwise(canonical, profile: str, op: str, lay: str) -> None:
    cand, case, ref = canonical(profile, op)
    res = run(cand.fn, case, BATCH, layout(BATCH, lay), rule=cand.param_grad_rule)
    assert_bitwise(f"{op} {lay} out", res.out, ref.out)
    for name in ref.grads:
        assert_bitwise(f"{op} {lay} d{name}", res.grads[name], ref.grads[name])
    for name in ref.pgrads:
        assert ref.pgrads[name].abs().max() > 0
        assert_bitwise(f"{op} {lay} main_grad {name}", res.pgrads[name], ref.pgrads[name])


# attention has no rows_alone case: its rows are not independent, decode is its one-row-per-sample layout
@pytest.mark.parametrize(
    ("op", "lay"),
    [
        (op, lay)
        for op in sorted(OP_CLASS)
        for lay in (*INFERENCE, "chunked_1", "chunked_40", "rows_alone")
        if not (op == "attention" and lay == "rows_alone")
    ],
)
@pytest.mark.parametrize("profile", BATCH_INVARIANT_PROFILES)
def test_inference_layouts_and_rows_alone_bitwise(canonical, profile: str, op: str, lay: str) -> None:
    cand, case, ref = canonical(profile, op)
    res = run(cand.fn, case, BATCH, layout(BATCH, lay), rule=cand.param_grad_rule, backward=False)
    assert_bitwise(f"{op} {lay} out", res.out, ref.out)


@pytest.mark.parametrize("profile", BATCH_INVARIANT_PROFILES)
def test_attention_prefill_chunked_decode_same_bits(canonical, profile: str) -> None:
    """The guard the key-block design exists for: prefill, chunked prefill (prefix) and decode agree."""
    cand, case, ref = canonical(profile, "attention")
    outs = {
        lay: run(cand.fn, case, BATCH, layout(BATCH, lay), rule=None, backward=False).out
        for lay in ("chunked_5", "chunked_64", "decode")
    }
    for lay, out in outs.items():
        assert_bitwise(f"attention {lay}", out, ref.out)
    assert layout(BATCH, "decode")[-1].keys and len(layout(BATCH, "decode")) > 30


def _stock_variant_shape():
    """A CPU fp32 GEMM shape where a row alone and the same row in a batch give different bits."""
    for m, k, n in ((64, 512, 512), (32, 1024, 256), (128, 256, 1024), (16, 4096, 512)):
        g = torch.Generator().manual_seed(m + k + n)
        a, w = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
        full = torch.mm(a, w)
        for r in range(m):
            if not torch.equal(bits(torch.mm(a[r : r + 1], w)[0]), bits(full[r])):
                return m, k, n, r
    return None


def test_stock_cpu_mm_is_batch_variant() -> None:
    """The baseline's variance is real: stock fp32 mm changes a row's bits with M."""
    found = _stock_variant_shape()
    assert found is not None, "no batch-variant shape found for stock torch.mm"


def test_portable_det_gemm_is_invariant_where_stock_mm_is_not() -> None:
    m, k, n, r = _stock_variant_shape()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    from kernels_support import context

    fn = registry.resolve("portable_cpu", "det_gemm").fn
    full = fn(x, w, context(layout(Batch((m,), (1,)), "packed")[0]))
    alone = fn(x[r : r + 1], w, context(layout(Batch((1,), (1,)), "packed")[0]))
    assert torch.equal(bits(alone[0]), bits(full[r]))
    stock_full = torch.mm(x.float(), w.float().t())
    stock_alone = torch.mm(x[r : r + 1].float(), w.float().t())
    assert not torch.equal(bits(stock_alone[0]), bits(stock_full[r]))
