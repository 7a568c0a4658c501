"""The fp32 weight cache of portable_cpu never serves stale values, holds one weight at most and is released on
request."""

from __future__ import annotations

import torch

from ws1_kernels.portable import clear_fp32_cache, fp32_cache_bytes
from ws1_kernels.portable._blocks import fp32_weight


def test_cache_returns_the_same_values_as_a_fresh_conversion() -> None:
    w = torch.randn(64, 32).to(torch.bfloat16)
    first = fp32_weight(w)
    assert torch.equal(first.view(torch.int32), w.float().view(torch.int32))
    assert fp32_weight(w) is first  # cached while the tensor lives unchanged


def test_in_place_write_invalidates_the_cache() -> None:
    w = torch.randn(64, 32).to(torch.bfloat16)
    before = fp32_weight(w).clone()
    w.add_(1.0)
    after = fp32_weight(w)
    assert not torch.equal(before, after)
    assert torch.equal(after, w.float())


def test_write_through_a_view_invalidates_the_cache() -> None:
    w = torch.randn(64, 32).to(torch.bfloat16)
    fp32_weight(w)
    w[3:5].mul_(2.0)  # views share the version counter
    assert torch.equal(fp32_weight(w), w.float())


def test_a_new_tensor_never_sees_the_copy_of_a_dead_one() -> None:
    for seed in range(5):
        w = torch.randn(64, 32, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
        assert torch.equal(fp32_weight(w), w.float())
        del w


def test_write_through_data_invalidates_the_cache() -> None:
    """A trainer syncing weights writes through `.data`, which bumps no version counter: the content decides."""
    w = torch.randn(64, 32).to(torch.bfloat16)
    version = w._version
    fp32_weight(w)
    w.data.copy_(torch.randn(64, 32).to(torch.bfloat16))
    assert w._version == version  # the write the version key alone cannot see
    assert torch.equal(fp32_weight(w), w.float())


def test_sign_of_zero_is_content() -> None:
    w = torch.zeros(8, 8, dtype=torch.bfloat16)
    fp32_weight(w)
    w.data[0, 0] = -0.0  # equal as numbers, different bits
    assert torch.signbit(fp32_weight(w)[0, 0])


def test_cache_holds_one_weight_at_most() -> None:
    """Converting a second weight frees the first: the bytes held are the last weight's copy and snapshot only."""
    first = torch.randn(64, 32).to(torch.bfloat16)
    second = torch.randn(16, 8).to(torch.bfloat16)
    fp32_weight(first)
    assert fp32_cache_bytes() == first.numel() * (4 + 2)  # the control: the first weight is held
    fp32_weight(second)
    assert fp32_cache_bytes() == second.numel() * (4 + 2)


def test_clear_releases_the_copy() -> None:
    w = torch.randn(64, 32).to(torch.bfloat16)
    held = fp32_weight(w)
    assert fp32_cache_bytes() > 0  # the control: something to release
    assert clear_fp32_cache() == w.numel() * (4 + 2)
    assert fp32_cache_bytes() == 0
    again = fp32_weight(w)
    assert again is not held and torch.equal(again, held)  # converted afresh, same values


def test_dead_weight_releases_the_copy() -> None:
    w = torch.randn(64, 32).to(torch.bfloat16)
    fp32_weight(w)
    assert fp32_cache_bytes() > 0
    del w
    assert fp32_cache_bytes() == 0
