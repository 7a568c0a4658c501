"""The Hopper attention forward (`torch.ops.ws1_sm90.attn_fwd`, csrc/sm90/attention_sm90.cu) on an sm_90 device,
Qwen3-8B widths.

What only the chip can show: a row's bits do not depend on the CTA it lands in (the candidate's 128-row blocks on
two warpgroups, 64-row blocks on one, the step path's one token a CTA, a decode call after a prefix); values past a
row's keys that TMA brings in with a box (another sample's keys, stale or NaN cache slots) never reach it; the
values are right against the fp32 reference at the contract's tolerance; and 100 reruns give the same bits. Each
bit comparison has a control that must be seen. The whole operator's accuracy and layout invariance stay the
matrix's judgment (`ws1 matrix --profile cuda_bf16_sm90 --op attention`).
"""

from __future__ import annotations

import pytest
import torch
from cuda_only import skip_module_without_hopper

pytestmark = [pytest.mark.gpu, pytest.mark.needs_build, pytest.mark.sm90]

skip_module_without_hopper()

from kernels_support import (  # noqa: E402
    assert_bitwise,
    assert_close,
    assert_decode_after_prefix,
    packed_attention_rows,
    sm90_attn_fwd,
)

from ws1_kernels import LayoutContext, cuda_sm90, reference  # noqa: E402
from ws1_kernels.cuda import attention as generic  # noqa: E402
from ws1_kernels.cuda_sm90 import attention as att  # noqa: E402

DEV = "cuda"
HQ, HKV, D = 32, 8, 128
GROUP = HQ // HKV
SCALE = D**-0.5
LENGTHS = (1, 31, 32, 33, 63, 64, 65, 300)  # straddle the 64-key blocks and the 16- and 32-token row blocks
#: ping-pong's tests are test_cuda_sm90_attention_pingpong_gpu.py's, run last: a fault in its barrier turns would
#: hang rather than fail, and must not hold up these; the wide schedules' (128-key blocks, bits of their own) are
#: test_cuda_sm90_attention_wide_gpu.py's
APART = (*att.PING_PONG, *att.WIDE)
#: the overlapped loop on 64-key blocks: the bits every schedule of that key block must give, wired or not
NARROW = 1


def _packed(seed: int = 0) -> tuple[LayoutContext, dict[str, torch.Tensor]]:
    return packed_attention_rows(LENGTHS, seed, {"q": HQ, "k": HKV, "v": HKV}, D, DEV)


def _run(
    rows: dict[str, torch.Tensor],
    ctx: LayoutContext,
    block_rows: int | None,
    k=None,  # type: ignore[no-untyped-def]
    v=None,  # type: ignore[no-untyped-def]
    schedule: int | None = None,
) -> torch.Tensor:
    """The op over the packed call: row blocks of ``block_rows`` query rows, or None for one token a CTA; the wired
    schedule, or where it cannot take the block size (Q in registers at 128 rows), the overlapped loop on 2 slots."""
    if schedule is None:
        schedule = att.SCHEDULE if att.SCHEDULE in att.schedules(block_rows or 64) else 1
    return sm90_attn_fwd(rows, ctx, block_rows, schedule, k, v)[0]


def test_the_extension_lists_every_variant_without_spills() -> None:
    found = {r["name"]: r for r in cuda_sm90.kernel_attributes()}
    names = [f"ws1_sm90_attn_fwd_{r}{s}" for r in (64, 128) for s in ("", "_overlap", "_overlap3")]
    wide = ["ws1_sm90_attn_fwd_64_wide", "ws1_sm90_attn_fwd_128_wide", "ws1_sm90_attn_fwd_128_wide_pingpong"]
    for name in [*names, "ws1_sm90_attn_fwd_64_qregs", "ws1_sm90_attn_fwd_128_pingpong", *wide]:
        assert name in found, sorted(found)
        assert found[name]["local_bytes"] == 0 and not found[name]["error"], found[name]


@pytest.mark.parametrize("block_rows", [64, 128])
def test_a_row_gets_the_same_bits_in_a_row_block_and_alone(block_rows: int) -> None:
    """Row blocks of 16 or 32 tokens against one token a CTA: rows of a block whose later rows need more keys walk
    those extra blocks fully masked, which must leave them unchanged bit for bit."""
    ctx, rows = _packed()
    assert_bitwise(f"{block_rows}-row blocks", _run(rows, ctx, block_rows), _run(rows, ctx, None))


@pytest.mark.parametrize(
    ("schedule", "block_rows"),
    [(s, r) for r in (64, 128, None) for s in att.schedules(r or 64) if s not in APART],
)
def test_every_narrow_schedule_gives_the_overlapped_loops_bits(schedule: int, block_rows: int | None) -> None:
    """The plain and the overlapped loops, on 2 or 3 slots, with Q in shared memory or in registers, do the same
    operations per row in the same order: each gives the bits of the overlapped loop at 64-row blocks."""
    ctx, rows = _packed()
    want = _run(rows, ctx, 64, schedule=NARROW)
    assert_bitwise(f"schedule {schedule}", _run(rows, ctx, block_rows, schedule=schedule), want)


@pytest.mark.parametrize(("schedule", "block_rows"), [(3, 128), (4, 64), (6, 64)])
def test_a_schedule_refuses_the_block_size_it_cannot_take(schedule: int, block_rows: int) -> None:
    """Q in registers at two warpgroups does not fit an SM's sub-partitions, and ping-pong needs two warpgroups: a
    clear error, not a failed launch."""
    ctx, rows = _packed()
    with pytest.raises(RuntimeError, match="does not take"):
        _run(rows, ctx, block_rows, schedule=schedule)


def test_a_short_key_count_changes_the_bits() -> None:
    """Negative control of the bit comparison: a block table that cuts the last sample's keys short is seen."""
    ctx, rows = _packed()
    t = generic._tables(ctx, rows["q"].shape[0], rows["q"].device, att.BLOCK_ROWS // GROUP)
    cut = t.blocks.clone()
    cut[-1, 2] -= 1  # the last block's key count one short: its last row loses its own key
    got = torch.ops.ws1_sm90.attn_fwd(
        rows["q"], rows["k"], rows["v"], t.key_base, t.n_keys, cut, att.BLOCK_ROWS, SCALE, att.SCHEDULE
    )[0]
    with pytest.raises(AssertionError):
        assert_bitwise("cut", got, _run(rows, ctx, att.BLOCK_ROWS))


def _with_nan_tail(rows: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v with 64 rows of NaN after the call's keys: the last sample's last key block reads them whole."""
    nan = torch.full((64, HKV, D), float("nan"), device=DEV, dtype=torch.bfloat16)
    return torch.cat([rows["k"], nan]), torch.cat([rows["v"], nan])


@pytest.mark.parametrize("schedule", [s for s in att.SCHEDULES if s not in APART])
def test_nan_slots_past_a_rows_keys_never_reach_it(schedule: int) -> None:
    """A cache's stale slots can hold anything: a box past the last sample's keys reads NaN rows, and the row's
    bits must be those of the call without them."""
    ctx, rows = _packed()
    k, v = _with_nan_tail(rows)
    for block_rows in (r for r in (64, 128, None) if schedule in att.schedules(r or 64)):
        got = _run(rows, ctx, block_rows, k, v, schedule)
        assert bool(torch.isfinite(got).all())
        assert_bitwise("NaN tail", got, _run(rows, ctx, block_rows, schedule=schedule))


def test_the_control_a_key_count_into_the_nan_slots_is_seen() -> None:
    """The fixture's control: one key more for the last row reaches a NaN slot, so the slots are really read."""
    ctx, rows = _packed()
    k, v = _with_nan_tail(rows)
    t = generic._tables(ctx, rows["q"].shape[0], rows["q"].device, 1)
    n_keys = t.n_keys.clone()
    n_keys[-1] += 1
    got = torch.ops.ws1_sm90.attn_fwd(
        rows["q"], k, v, t.key_base, n_keys, None, att.STEP_BLOCK_ROWS, SCALE, att.SCHEDULE
    )[0]
    assert bool(torch.isnan(got[-1]).any())


def test_decode_after_a_prefix_gives_the_packed_bits() -> None:
    """Each sample's last token decoded alone, its earlier keys as the kv prefix, through the candidate."""
    _, rows = _packed()
    assert_decode_after_prefix(att.attention, rows, LENGTHS, SCALE)


def test_the_step_op_gives_the_candidates_bits() -> None:
    """The step path's attention (one token a CTA, no host table) against the candidate's packed call."""
    from ws1_kernels.cuda_sm90.step_ops import STEP_OPS

    ctx, rows = _packed()
    t = generic._tables(ctx, rows["q"].shape[0], rows["q"].device, 1)
    step = STEP_OPS.attention(rows["q"], rows["k"], rows["v"], t.key_base, t.n_keys, SCALE)
    assert_bitwise("step", step, att.attention(rows["q"], rows["k"], rows["v"], SCALE, ctx))


def test_the_forward_is_right_against_the_fp32_reference() -> None:
    ctx, rows = _packed()
    got = att.attention(rows["q"], rows["k"], rows["v"], SCALE, ctx)
    want = reference.attention(*(rows[k].float() for k in ("q", "k", "v")), SCALE, ctx)
    assert_close("out", got, want, "forward_accuracy", "attention")


def test_the_control_a_wrong_scale_is_not_close() -> None:
    ctx, rows = _packed()
    got = att.attention(rows["q"], rows["k"], rows["v"], SCALE * 1.5, ctx)
    want = reference.attention(*(rows[k].float() for k in ("q", "k", "v")), SCALE, ctx)
    with pytest.raises(AssertionError):
        assert_close("out", got, want, "forward_accuracy", "attention")


def test_the_lse_is_the_rows_log_sum_exp() -> None:
    """The backward reads lse: it must be the row's own log-sum-exp of the scaled scores (fp32, loose bound)."""
    ctx, rows = _packed()
    t = generic._tables(ctx, rows["q"].shape[0], rows["q"].device, att.BLOCK_ROWS // GROUP)
    _, lse = torch.ops.ws1_sm90.attn_fwd(
        rows["q"], rows["k"], rows["v"], t.key_base, t.n_keys, t.blocks, att.BLOCK_ROWS, SCALE, att.SCHEDULE
    )
    q, k = rows["q"].float(), rows["k"].float()
    start = 0
    for n in LENGTHS:
        kk = k[start : start + n].repeat_interleave(GROUP, dim=1)  # [n, HQ, D]
        s = torch.einsum("thd,uhd->htu", q[start : start + n], kk) * SCALE
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=DEV).triu(1), float("-inf"))
        want = torch.logsumexp(s, dim=-1).T  # [n, HQ]
        torch.testing.assert_close(lse[start : start + n], want, atol=2e-3, rtol=1e-4)
        start += n


def test_the_backward_runs_and_its_gradients_are_finite() -> None:
    """The Hopper backward through the candidate's autograd, at the fixture's widths: accuracy is the matrix's and
    the backward tests' (test_cuda_sm90_attention_bwd_gpu.py), this is the wiring."""
    ctx, rows = _packed()
    q, k, v = (rows[n].clone().requires_grad_(True) for n in ("q", "k", "v"))
    att.attention(q, k, v, SCALE, ctx).float().square().sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and bool(torch.isfinite(t.grad).all())


def test_the_forward_is_identical_run_to_run() -> None:
    ctx, rows = _packed()
    first = _run(rows, ctx, att.BLOCK_ROWS)
    for _ in range(100):
        assert_bitwise("rerun", _run(rows, ctx, att.BLOCK_ROWS), first)


def test_a_long_sample_matches_across_block_sizes() -> None:
    """4096 tokens in one sample (64 key blocks for the last rows, the ring's slots reused many times)."""
    n = 4096
    ctx = LayoutContext(torch.zeros(n, dtype=torch.int64), torch.arange(n))
    g = torch.Generator().manual_seed(1)
    rows = {
        name: torch.randn((n, h, D), generator=g).to(torch.bfloat16).to(DEV)
        for name, h in (("q", HQ), ("k", HKV), ("v", HKV))
    }
    assert_bitwise("long", _run(rows, ctx, 128), _run(rows, ctx, 64))
