"""The Hopper attention forward's ping-pong schedule (schedule 4: two warpgroups taking turns around each MMA
issue, csrc/sm90/attention_sm90.cu) on an sm_90 device, apart from the other schedules' tests and run after them:
a fault in its barrier turns would hang rather than fail. Its bits must be the wired schedule's (the turns order
issues only), also with NaN slots past the keys, and 100 reruns must agree.
"""

from __future__ import annotations

import pytest
import torch
from cuda_only import skip_module_without_hopper

pytestmark = [pytest.mark.gpu, pytest.mark.needs_build, pytest.mark.sm90]

skip_module_without_hopper()

from kernels_support import assert_bitwise, packed_attention_rows  # noqa: E402

from ws1_kernels.cuda import attention as generic  # noqa: E402
from ws1_kernels.cuda_sm90 import attention as att  # noqa: E402

DEV = "cuda"
HQ, HKV, D = 32, 8, 128
SCALE = D**-0.5
LENGTHS = (1, 31, 32, 33, 63, 64, 65, 300)
PING_PONG = 4


def _run(rows_per_block: int, schedule: int, k_extra: int = 0, seed: int = 0) -> torch.Tensor:
    ctx, t = packed_attention_rows(LENGTHS, seed, {"q": HQ, "k": HKV, "v": HKV}, D, DEV)
    k, v = t["k"], t["v"]
    if k_extra:  # rows of NaN past the call's keys: the last sample's last box reads them
        nan = torch.full((k_extra, HKV, D), float("nan"), device=DEV, dtype=torch.bfloat16)
        k, v = torch.cat([k, nan]), torch.cat([v, nan])
    tab = generic._tables(ctx, t["q"].shape[0], t["q"].device, rows_per_block // (HQ // HKV))
    return torch.ops.ws1_sm90.attn_fwd(
        t["q"], k, v, tab.key_base, tab.n_keys, tab.blocks, rows_per_block, SCALE, schedule
    )[0]


def test_ping_pong_is_a_schedule_of_128_row_blocks() -> None:
    assert PING_PONG in att.schedules(128) and PING_PONG not in att.schedules(64)


def test_ping_pong_gives_the_wired_schedules_bits() -> None:
    assert_bitwise("ping-pong", _run(128, PING_PONG), _run(64, att.SCHEDULE))


def test_the_control_another_sample_changes_the_bits() -> None:
    with pytest.raises(AssertionError):
        assert_bitwise("ping-pong", _run(128, PING_PONG, seed=1), _run(64, att.SCHEDULE))


def test_ping_pong_keeps_nan_slots_out() -> None:
    got = _run(128, PING_PONG, k_extra=64)
    assert bool(torch.isfinite(got).all())
    assert_bitwise("NaN tail", got, _run(128, PING_PONG))


def test_ping_pong_is_identical_run_to_run() -> None:
    first = _run(128, PING_PONG)
    for _ in range(100):
        assert_bitwise("rerun", _run(128, PING_PONG), first)
