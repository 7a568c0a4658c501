"""`integrations.device_sampler.DeviceGumbelSampler`: Gumbel-max on the logits' device, noise a pure function of
(seed, request id, position, vocab id). Each property has its control: a sampler keyed by the batch index, a
sampler without noise, a multiplication done the naive way."""

from __future__ import annotations

import random

import pytest
import torch

from ws1_kernels import KernelInputError
from ws1_kernels.integrations import rollout
from ws1_kernels.integrations.device_sampler import DeviceGumbelSampler, fmix32, mulmod32, uniforms


def test_the_modular_product_is_exact() -> None:
    """(x * c) mod 2^32 in 16-bit halves equals Python's exact integer product for 32-bit x and c."""
    rng = random.Random(0)
    xs = [rng.randrange(1 << 32) for _ in range(2000)] + [0, 1, (1 << 32) - 1]
    for c in (0x85EBCA6B, 0xC2B2AE35, (1 << 32) - 1):
        got = mulmod32(torch.tensor(xs, dtype=torch.int64), c).tolist()
        assert got == [(x * c) % (1 << 32) for x in xs]
    # control: the naive int64 product of two large 32-bit values leaves int64's range (Python's ints show it)
    assert max(xs) * 0xC2B2AE35 >= 1 << 63


def test_the_finaliser_is_a_bijection_on_a_sample() -> None:
    x = torch.arange(0, 1 << 16, dtype=torch.int64) * 65537
    h = fmix32(x)
    assert int(h.min()) >= 0 and int(h.max()) < 1 << 32
    assert h.unique().numel() == x.numel()


def test_uniforms_lie_strictly_inside_zero_one() -> None:
    u = uniforms(torch.tensor([0, 1, 2**31, 2**32 - 1], dtype=torch.int64), 4096)
    assert u.dtype == torch.float64 and float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01


class _BatchIndexKeys(DeviceGumbelSampler):
    """The mistake the keying prevents: noise keyed by the row's index in the batch."""

    def keys(self, rows, request_ids, positions):  # type: ignore[no-untyped-def]
        return super().keys(rows, torch.arange(rows, dtype=torch.int64), positions)


@pytest.mark.parametrize(
    ("sampler_type", "invariant"), [(DeviceGumbelSampler, True), (_BatchIndexKeys, False)]
)
def test_a_row_samples_the_same_token_in_any_batch(sampler_type: type, invariant: bool) -> None:
    """Row (request 7, position 12) alone, then third in a batch of other requests: same token and noise."""
    torch.manual_seed(0)
    logits = torch.randn(6, 257, dtype=torch.float32)
    ids, pos = [3, 9, 7, 1, 4, 2], [5, 12, 12, 40, 0, 7]
    s = sampler_type(seed=11)
    batch = s.sample(logits, ids, pos)
    alone = s.sample(logits[2:3], [7], [12])
    flipped = s.sample(logits.flip(0), ids[::-1], pos[::-1]).flip(0)
    same = int(alone[0]) == int(batch[2]) and torch.equal(batch, flipped)
    if invariant:
        assert same
        n_batch = s.noise(torch.tensor(ids), torch.tensor(pos), 257)[2]
        n_alone = s.noise(torch.tensor([7]), torch.tensor([12]), 257)[0]
        assert torch.equal(n_batch.view(torch.int64), n_alone.view(torch.int64))
    else:  # the control: keyed by the row's place, the token moves with the batch
        assert not same


@pytest.mark.parametrize(("temperature", "noisy"), [(1.0, True), (0.0, False)])
def test_frequencies_follow_the_softmax(temperature: float, noisy: bool) -> None:
    """20000 draws of one row under different keys: each token's frequency within 0.015 of softmax(logits); greedy
    (temperature 0, the control) always takes the largest logit and fails the same check."""
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).repeat(20000, 1)
    s = DeviceGumbelSampler(seed=5, temperature=temperature)
    tokens = s.sample(logits, list(range(20000)), [9] * 20000)
    freq = torch.bincount(tokens, minlength=4).double() / 20000
    p = torch.softmax(logits[0].double(), dim=0)
    close = bool((freq - p).abs().max() < 0.015)
    assert close == noisy, (freq.tolist(), p.tolist())


def test_the_seed_changes_the_draws() -> None:
    logits = torch.zeros(64, 1000)
    a = DeviceGumbelSampler(seed=1).sample(logits, list(range(64)), [3] * 64)
    b = DeviceGumbelSampler(seed=2).sample(logits, list(range(64)), [3] * 64)
    assert not torch.equal(a, b) and torch.equal(
        a, DeviceGumbelSampler(seed=1).sample(logits, list(range(64)), [3] * 64)
    )


@pytest.mark.parametrize(
    ("kwargs", "call", "message"),
    [
        ({"seed": 1, "temperature": -1.0}, None, "temperature must be >= 0"),
        ({"seed": -1}, None, "seed must be >= 0"),
        ({"seed": 1}, (torch.zeros(2, 4), [0], [0, 1]), "one request id and one position per row"),
        ({"seed": 1}, (torch.zeros(1, 4), [-1], [0]), "must be >= 0"),
    ],
)
def test_bad_input_is_one_line(kwargs, call, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(KernelInputError, match=message) as exc:
        s = DeviceGumbelSampler(**kwargs)
        if call is not None:
            s.sample(*call)
    assert "\n" not in str(exc.value)


def test_the_engine_samples_on_it_the_same_tokens_in_any_schedule(rollout_model_and_fixture) -> None:  # type: ignore[no-untyped-def]
    model, fx = rollout_model_and_fixture

    def serve(chunk: int, running: int, stagger: int):  # type: ignore[no-untyped-def]
        engine = rollout.Engine(model, DeviceGumbelSampler(11), chunk_size=chunk, max_running=running)
        reqs = [
            rollout.Request(
                s.sample_id,
                s.token_ids[: s.prompt_len].clone(),
                s.length - s.prompt_len,
                stagger * s.sample_id,
            )
            for s in fx.samples
        ]
        return {rid: c.tokens for rid, c in engine.run(reqs).items()}

    assert serve(5, 4, 0) == serve(3, 2, 2)
