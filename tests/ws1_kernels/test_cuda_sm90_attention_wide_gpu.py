"""The Hopper attention forward's wide schedule (schedule 5: logical key blocks of 128, m64n128 S tiles, a producer
warpgroup handing its registers to the consumers by setmaxnreg; csrc/sm90/attention_sm90.cu) on an sm_90 device.

Its bits are its own (the online softmax rescales once per 128 keys, not per 64), so it is compared with itself:
a row's bits must not depend on the CTA it lands in (64- or 128-row blocks, one token a CTA as the step path runs
it), values past a row's keys in a 128-key box never reach it, the values are right against the fp32 reference at
the contract's tolerance, lse is the row's, and 100 reruns agree. That the wide kernel really ran is observed in
the CUDA profiler's kernel names, not taken from the schedule number. Its ping-pong twin (schedule 6) is tested
with the other ping-pong schedule, last (test_cuda_sm90_attention_pingpong_gpu.py).
"""

from __future__ import annotations

import re

import pytest
import torch
from cuda_only import skip_module_without_hopper

pytestmark = [pytest.mark.gpu, pytest.mark.needs_build, pytest.mark.sm90]

skip_module_without_hopper()

from kernels_support import assert_bitwise, assert_close, packed_attention_rows, sm90_attn_fwd  # noqa: E402

from ws1_kernels import LayoutContext, reference  # noqa: E402
from ws1_kernels.cuda_sm90 import attention as att  # noqa: E402

DEV = "cuda"
HQ, HKV, D = 32, 8, 128
GROUP = HQ // HKV
SCALE = D**-0.5
#: straddle the 128-key blocks (and the 64-key ones) and the 16- and 32-token row blocks
LENGTHS = (1, 31, 63, 64, 65, 127, 128, 129, 300)
WIDE = 5
#: the overlapped loop on 64-key blocks (the narrow twin), whatever is wired
NARROW = 1


def _packed(seed: int = 0) -> tuple[LayoutContext, dict[str, torch.Tensor]]:
    return packed_attention_rows(LENGTHS, seed, {"q": HQ, "k": HKV, "v": HKV}, D, DEV)


def _run(
    rows: dict[str, torch.Tensor],
    ctx: LayoutContext,
    block_rows: int | None,
    schedule: int = WIDE,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of the op over the packed call: row blocks of ``block_rows`` rows, or None for one token a CTA."""
    return sm90_attn_fwd(rows, ctx, block_rows, schedule, k, v)


def _wide_kernels_ran(fn) -> list[str]:  # type: ignore[no-untyped-def]
    """The attention forward kernels with 128-key blocks (template argument 128) that one call launched."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type.name == "CUDA"}
    return sorted(n for n in names if "attn_fwd" in n and (re.search(r",\s*128\s*>", n) or "Li128E" in n))


def test_the_wide_schedule_is_the_128_key_one() -> None:
    assert att.key_block(WIDE) == 128 and att.key_block(NARROW) == 64
    assert WIDE in att.schedules(64) and WIDE in att.schedules(128)


def test_the_wide_kernel_really_runs() -> None:
    ctx, rows = _packed()
    assert _wide_kernels_ran(lambda: _run(rows, ctx, 128))


def test_the_control_the_narrow_schedule_runs_no_wide_kernel() -> None:
    ctx, rows = _packed()
    assert not _wide_kernels_ran(lambda: _run(rows, ctx, 64, schedule=NARROW))


@pytest.mark.parametrize("block_rows", [128, None])
def test_a_row_gets_the_same_bits_in_any_cta(block_rows: int | None) -> None:
    """128-row blocks (two consumer warpgroups) and one token a CTA (the step path) against 64-row blocks: rows of
    a block whose later rows need more keys walk those extra blocks fully masked, unchanged bit for bit."""
    ctx, rows = _packed()
    assert_bitwise(f"{block_rows} rows", _run(rows, ctx, block_rows)[0], _run(rows, ctx, 64)[0])


def test_the_control_another_sample_changes_the_bits() -> None:
    ctx, rows = _packed()
    _, other = _packed(seed=1)
    with pytest.raises(AssertionError):
        assert_bitwise("other", _run(other, ctx, 128)[0], _run(rows, ctx, 64)[0])


def test_nan_slots_past_a_rows_keys_never_reach_it() -> None:
    """128 NaN rows after the call's keys: the last sample's last 128-key box reads them."""
    ctx, rows = _packed()
    nan = torch.full((128, HKV, D), float("nan"), device=DEV, dtype=torch.bfloat16)
    k, v = torch.cat([rows["k"], nan]), torch.cat([rows["v"], nan])
    for block_rows in (64, 128, None):
        got = _run(rows, ctx, block_rows, k=k, v=v)[0]
        assert bool(torch.isfinite(got).all())
        assert_bitwise("NaN tail", got, _run(rows, ctx, block_rows)[0])


def test_the_wide_forward_is_right_against_the_fp32_reference() -> None:
    ctx, rows = _packed()
    want = reference.attention(*(rows[k].float() for k in ("q", "k", "v")), SCALE, ctx)
    assert_close("out", _run(rows, ctx, 128)[0], want, "forward_accuracy", "attention")


def test_the_control_a_wrong_scale_is_not_close() -> None:
    ctx, rows = _packed()
    want = reference.attention(*(rows[k].float() for k in ("q", "k", "v")), SCALE * 1.5, ctx)
    with pytest.raises(AssertionError):
        assert_close("out", _run(rows, ctx, 128)[0], want, "forward_accuracy", "attention")


def test_the_lse_is_the_rows_log_sum_exp() -> None:
    """The backward reads lse: the row's own log-sum-exp of the scaled scores (fp32, loose bound)."""
    ctx, rows = _packed()
    lse = _run(rows, ctx, 128)[1]
    q, k = rows["q"].float(), rows["k"].float()
    start = 0
    for n in LENGTHS:
        kk = k[start : start + n].repeat_interleave(GROUP, dim=1)
        s = torch.einsum("thd,uhd->htu", q[start : start + n], kk) * SCALE
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=DEV).triu(1), float("-inf"))
        torch.testing.assert_close(lse[start : start + n], torch.logsumexp(s, dim=-1).T, atol=2e-3, rtol=1e-4)
        start += n


def test_a_long_sample_matches_across_block_sizes() -> None:
    """4096 tokens in one sample: 32 key blocks for the last rows, the ring's two slots reused many times."""
    n = 4096
    ctx = LayoutContext(torch.zeros(n, dtype=torch.int64), torch.arange(n))
    g = torch.Generator().manual_seed(1)
    rows = {
        name: torch.randn((n, h, D), generator=g).to(torch.bfloat16).to(DEV)
        for name, h in (("q", HQ), ("k", HKV), ("v", HKV))
    }
    assert_bitwise("long", _run(rows, ctx, 128)[0], _run(rows, ctx, 64)[0])


def test_the_wide_forward_is_identical_run_to_run() -> None:
    ctx, rows = _packed()
    first = _run(rows, ctx, 128)[0]
    for _ in range(100):
        assert_bitwise("rerun", _run(rows, ctx, 128)[0], first)
