"""The Hopper attention forward's ping-pong schedules (4, and 6 with 128-key blocks: two warpgroups taking turns
around each MMA issue, csrc/sm90/attention_sm90.cu) on an sm_90 device, apart from the other schedules' tests and
run after them: a fault in their barrier turns would hang rather than fail. Each one's bits must be those of its
key block's overlapped schedule (the turns order issues only): 4 gives schedule 1's, 6 the wide schedule 5's; also
with NaN slots past the keys, and 100 reruns must agree.
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
LENGTHS = (1, 31, 32, 33, 63, 64, 65, 127, 128, 129, 300)
#: each ping-pong schedule and the overlapped schedule of its key block, whose bits it must give
TWINS = {4: 1, 6: 5}


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


def test_the_ping_pong_schedules_are_those_of_128_row_blocks() -> None:
    assert set(att.PING_PONG) == set(TWINS)
    for s in att.PING_PONG:
        assert s in att.schedules(128) and s not in att.schedules(64)
        assert att.key_block(s) == att.key_block(TWINS[s])


@pytest.mark.parametrize("schedule", sorted(TWINS))
def test_ping_pong_gives_its_twins_bits(schedule: int) -> None:
    assert_bitwise("ping-pong", _run(128, schedule), _run(64, TWINS[schedule]))


@pytest.mark.parametrize("schedule", sorted(TWINS))
def test_the_control_another_sample_changes_the_bits(schedule: int) -> None:
    with pytest.raises(AssertionError):
        assert_bitwise("ping-pong", _run(128, schedule, seed=1), _run(64, TWINS[schedule]))


@pytest.mark.parametrize("schedule", sorted(TWINS))
def test_ping_pong_keeps_nan_slots_out(schedule: int) -> None:
    got = _run(128, schedule, k_extra=att.key_block(schedule))
    assert bool(torch.isfinite(got).all())
    assert_bitwise("NaN tail", got, _run(128, schedule))


@pytest.mark.parametrize("schedule", sorted(TWINS))
def test_ping_pong_is_identical_run_to_run(schedule: int) -> None:
    first = _run(128, schedule)
    for _ in range(100):
        assert_bitwise("rerun", _run(128, schedule), first)
