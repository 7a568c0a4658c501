"""The rollout engine: continuous batching, chunked prefill, decode, and a sampler keyed by (request, position).

Cheap: the tiny model cut to one layer, the short and primary tiers' prompts, in process.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("transformers")

from ws1_kernels import KernelInputError  # noqa: E402
from ws1_kernels.integrations import rollout  # noqa: E402


@pytest.fixture(scope="module")
def model_and_fixture(rollout_model_and_fixture):  # type: ignore[no-untyped-def]
    return rollout_model_and_fixture


def _requests(fx, stagger: int):
    return [
        rollout.Request(
            s.sample_id, s.token_ids[: s.prompt_len].clone(), s.length - s.prompt_len, stagger * s.sample_id
        )
        for s in fx.samples
    ]


class BatchIndexSampler(rollout.GumbelSampler):
    """The mistake the keying prevents: noise keyed by the row's index in the batch."""

    def key(self, row, request_id, position):
        return (self.seed, row, position)


def _serve(model, fx, sampler, **schedule):
    engine = rollout.Engine(
        model, sampler, chunk_size=schedule.pop("chunk_size"), max_running=schedule.pop("max_running")
    )
    done = engine.run(_requests(fx, schedule.pop("stagger")))
    return (
        {rid: c.tokens for rid, c in done.items()},
        {rid: c.logprob_tensor for rid, c in done.items()},
        engine.trace,
    )


SCHEDULES = (
    {"chunk_size": 5, "max_running": 4, "stagger": 0},  # everyone at once
    {"chunk_size": 3, "max_running": 2, "stagger": 2},  # staggered, at most two in flight
)


def test_batch_composition_never_changes_a_sampled_token(model_and_fixture):
    model, fx = model_and_fixture
    runs = [_serve(model, fx, rollout.GumbelSampler(11), **dict(s)) for s in SCHEDULES]
    assert runs[0][0] == runs[1][0]
    for rid in runs[0][1]:  # and the recorded logprobs are the same bits
        assert torch.equal(runs[0][1][rid], runs[1][1][rid])
    # negative control: a sampler keyed by the batch index samples other tokens once the batch changes
    bad = [_serve(model, fx, BatchIndexSampler(11), **dict(s)) for s in SCHEDULES]
    assert bad[0][0] != bad[1][0]


def test_requests_join_and_leave_between_steps_with_chunked_prefill(model_and_fixture):
    model, fx = model_and_fixture
    tokens, logprobs, trace = _serve(
        model, fx, rollout.GumbelSampler(3), chunk_size=4, max_running=2, stagger=1
    )
    joined_late = {rid for st in trace for rid in st.joined if st.step > 0}
    left_early = {rid for st in trace[:-1] for rid in st.left}
    assert joined_late and left_early
    # a request waits for a free slot: the third one joins only after one has left
    third = next(st.step for st in trace if 2 in st.joined)
    assert any(st.left for st in trace if st.step < third)
    # some step holds a prefill chunk beside another request's decode token
    assert any({n > 1 for _r, _p, n in st.rows} == {True, False} for st in trace)
    # no prefill chunk exceeds the chunk size, every completion is as long as asked, one logprob per token
    assert all(n <= 4 for st in trace for _r, _p, n in st.rows)
    for s in fx.samples:
        assert len(tokens[s.sample_id]) == s.length
        assert logprobs[s.sample_id].shape == (s.length - s.prompt_len,)
        assert bool((logprobs[s.sample_id] <= 0).all())


def test_bad_requests_are_refused(model_and_fixture):
    model, fx = model_and_fixture
    engine = rollout.Engine(model, rollout.GumbelSampler(0), chunk_size=4)
    good = _requests(fx, 0)
    engine.run(good[:1])  # a valid request is served
    dup = [good[0], dataclasses.replace(good[1], request_id=good[0].request_id)]
    with pytest.raises(KernelInputError, match="distinct"):
        engine.run(dup)
    with pytest.raises(KernelInputError, match="outside"):
        engine.run([dataclasses.replace(good[0], prompt=torch.tensor([10**6]))])
