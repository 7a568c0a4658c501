"""The Hopper attention backward (`torch.ops.ws1_sm90.attn_bwd`, csrc/sm90/attention_bwd_sm90.cu) on an sm_90
device, Qwen3-8B widths: the `cuda_bf16_sm90` candidate's backward.

What only the chip can show: the gradients are right against the fp32 reference at the contract's gradient
tolerance, on short samples and on one long enough to reuse the streamed tiles' slots many times; a sample's dQ,
dK and dV have the same bits in a packed call and in a micro-batch of its own (its key blocks and row blocks are
fixed in its own positions); 100 reruns give the same bits; the candidate's autograd runs this backward and records
its id. Each comparison has a control that must be seen.
"""

from __future__ import annotations

import pytest
import torch
from cuda_only import skip_module_without_hopper

pytestmark = [pytest.mark.gpu, pytest.mark.needs_build, pytest.mark.sm90]

skip_module_without_hopper()

from kernels_support import assert_bitwise, assert_close, packed_attention_rows  # noqa: E402

from ws1_kernels import LayoutContext, reference  # noqa: E402
from ws1_kernels.cuda import attention as generic  # noqa: E402
from ws1_kernels.cuda_sm90 import attention as att  # noqa: E402

DEV = "cuda"
HQ, HKV, D = 32, 8, 128
SCALE = D**-0.5
LENGTHS = (1, 15, 16, 17, 63, 64, 65, 200)  # straddle the 16-token row blocks and the 64-key blocks


def _call(lengths: tuple[int, ...], seed: int) -> tuple[LayoutContext, dict[str, torch.Tensor]]:
    return packed_attention_rows(lengths, seed, {"q": HQ, "k": HKV, "v": HKV, "dout": HQ}, D, DEV)


def _forward(t: dict[str, torch.Tensor], ctx: LayoutContext) -> tuple[torch.Tensor, torch.Tensor]:
    tab = generic._tables(ctx, t["q"].shape[0], t["q"].device, 64 // (HQ // HKV))
    return torch.ops.ws1_sm90.attn_fwd(
        t["q"], t["k"], t["v"], tab.key_base, tab.n_keys, tab.blocks, 64, SCALE, att.SCHEDULE
    )


def _grads(t: dict[str, torch.Tensor], ctx: LayoutContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    o, lse = _forward(t, ctx)
    return att.hopper_backward(t["q"], t["k"], t["v"], o, t["dout"], lse, SCALE, ctx)


def test_the_extension_lists_the_backward_kernels_without_spills() -> None:
    from ws1_kernels import cuda_sm90

    found = {r["name"]: r for r in cuda_sm90.kernel_attributes()}
    for name in (
        "ws1_sm90_attn_bwd_dq",
        "ws1_sm90_attn_bwd_dv",
        "ws1_sm90_attn_bwd_dk",
        "ws1_sm90_attn_bwd_dkv",
    ):
        assert name in found and found[name]["local_bytes"] == 0 and not found[name]["error"], found.get(name)


def _assert_right(lengths: tuple[int, ...], seed: int) -> None:
    """dq, dk and dv against the fp32 reference, every miss named before the test fails."""
    ctx, t = _call(lengths, seed)
    got = _grads(t, ctx)
    q, k, v = (t[n].float().requires_grad_(True) for n in ("q", "k", "v"))
    reference.attention(q, k, v, SCALE, ctx).backward(t["dout"].float())
    misses = []
    for name, g, want in zip(("dq", "dk", "dv"), got, (q.grad, k.grad, v.grad), strict=True):
        try:
            assert_close(name, g, want, "gradient_accuracy", "attention")
        except AssertionError as e:
            misses.append(str(e))
    assert not misses, "; ".join(misses)


def test_the_gradients_are_right_against_the_fp32_reference() -> None:
    _assert_right(LENGTHS, 0)


def test_a_long_sample_is_right_against_the_fp32_reference() -> None:
    """1024 tokens: 16 key blocks a row block walks, 64 row blocks a key block walks, each slot refilled often."""
    _assert_right((1024, 77), 3)


def test_the_candidate_runs_this_backward_and_records_it() -> None:
    from ws1_kernels.launches import observe

    ctx, t = _call(LENGTHS, 4)
    q, k, v = (t[n].clone().requires_grad_(True) for n in ("q", "k", "v"))
    with observe() as log:
        att.attention(q, k, v, SCALE, ctx).backward(t["dout"])
    assert log.events == [(att.KERNEL, "fwd"), (att.BWD_KERNEL, "bwd")]
    for name, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), _grads(t, ctx), strict=True):
        assert_bitwise(name, got, want)
    # the control: the generic backward on the same forward is another computation, with other bits
    o, lse = _forward(t, ctx)
    tab = generic._tables(ctx, t["q"].shape[0], t["q"].device, 64 // (HQ // HKV))
    dq_gen, _, _ = torch.ops.ws1.attn_bwd(
        t["q"], t["k"], t["v"], o, t["dout"], lse, tab.key_base, tab.n_keys, tab.q_end, SCALE
    )
    with pytest.raises(AssertionError):
        assert_bitwise("dq", dq_gen, q.grad)


def test_the_control_a_wrong_scale_is_not_close() -> None:
    ctx, t = _call(LENGTHS, 0)
    o, lse = _forward(t, ctx)
    dq, _, _ = att.hopper_backward(t["q"], t["k"], t["v"], o, t["dout"], lse, SCALE * 1.5, ctx)
    q, k, v = (t[n].float().requires_grad_(True) for n in ("q", "k", "v"))
    reference.attention(q, k, v, SCALE, ctx).backward(t["dout"].float())
    with pytest.raises(AssertionError):
        assert_close("dq", dq, q.grad, "gradient_accuracy", "attention")


def _split_bits(lengths: tuple[int, ...]) -> list[tuple[torch.Tensor, ...]]:
    """Each sample's (dq, dk, dv) from a packed call of all, and from a call of its own (a micro-batch of one)."""
    ctx, t = _call(lengths, 1)
    packed = _grads(t, ctx)
    out = []
    start = 0
    for s, n in enumerate(lengths):
        one = {k: x[start : start + n].contiguous() for k, x in t.items()}
        alone = _grads(one, LayoutContext(torch.zeros(n, dtype=torch.int64), torch.arange(n)))
        out.append((*(g[start : start + n] for g in packed), *alone))
        start += n
        del s
    return out


def test_a_sample_gets_the_same_gradient_bits_packed_and_alone() -> None:
    for pq, pk, pv, aq, ak, av in _split_bits(LENGTHS):
        assert_bitwise("dq", aq, pq)
        assert_bitwise("dk", ak, pk)
        assert_bitwise("dv", av, pv)


def test_the_control_a_missing_key_block_is_seen() -> None:
    """A work list without the last key block leaves that block's dK and dV at zero: the comparison sees it."""
    ctx, t = _call(LENGTHS, 1)
    o, lse = _forward(t, ctx)
    tab = generic._tables(ctx, t["q"].shape[0], t["q"].device, 64 // (HQ // HKV))
    kb = att.key_blocks(ctx, t["q"].device)[:-1].contiguous()
    args = (t["q"], t["k"], t["v"], o, t["dout"], lse, tab.key_base, tab.n_keys, tab.blocks)
    _, dk_cut, _ = torch.ops.ws1_sm90.attn_bwd(*args, kb, SCALE)
    _, dk, _ = _grads(t, ctx)
    with pytest.raises(AssertionError):
        assert_bitwise("dk", dk_cut, dk)


@pytest.mark.parametrize(("lengths", "seed"), [(LENGTHS, 5), ((1024, 77), 6)])
def test_dk_and_dv_in_one_walk_give_the_bits_of_one_kernel_each(lengths: tuple[int, ...], seed: int) -> None:
    ctx, t = _call(lengths, seed)
    o, lse = _forward(t, ctx)
    args = (t["q"], t["k"], t["v"], o, t["dout"], lse, SCALE, ctx)
    fused, apart = att.hopper_backward(*args, fuse_dkv=True), att.hopper_backward(*args, fuse_dkv=False)
    for name, a, b in zip(("dq", "dk", "dv"), fused, apart, strict=True):
        assert_bitwise(name, a, b)
    # the control: the fused walk without the last key block leaves that block's dK and dV at zero, and is seen
    tab = generic._tables(ctx, t["q"].shape[0], t["q"].device, 64 // (HQ // HKV))
    kb = att.key_blocks(ctx, t["q"].device)[:-1].contiguous()
    cut = torch.ops.ws1_sm90.attn_bwd(
        t["q"], t["k"], t["v"], o, t["dout"], lse, tab.key_base, tab.n_keys, tab.blocks, kb, SCALE, True
    )
    with pytest.raises(AssertionError):
        assert_bitwise("dv", cut[2], apart[2])


def test_the_backward_is_identical_run_to_run() -> None:
    ctx, t = _call(LENGTHS, 2)
    first = _grads(t, ctx)
    for _ in range(100):
        for a, b in zip(_grads(t, ctx), first, strict=True):
            assert_bitwise("rerun", a, b)
