"""The rollout engine on the step path with CUDA graphs (``integrations.step_runner``), on the GPU: the tokens
and logprobs it records are, bit for bit, those of the engine on the call path (``forward_call``, the judged
path), with decode steps replayed from graph buckets (pad rows included) and prefill steps run eagerly.

The Triton profile runs here without the extension; ``cuda_bf16`` joins when the extension is built. The
control gives every row of every step one key fewer (in the graphs too: the plan is captured) and must change
the logprobs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from cuda_only import skip_module_without_cuda

pytestmark = [pytest.mark.gpu]

skip_module_without_cuda("triton", "transformers")

from step_support import gpu_model, raw_bits  # noqa: E402

from ws1_kernels.integrations import rollout, step_runner  # noqa: E402
from ws1_kernels.integrations.device_sampler import DeviceGumbelSampler  # noqa: E402

BUCKETS = (1, 2, 4)


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    return gpu_model("triton_cuda_bf16")


def _run(model, path: str) -> tuple[dict[int, tuple[list[int], torch.Tensor]], rollout.Engine]:  # type: ignore[no-untyped-def]
    """Five requests, three slots, prompts in chunks of 4: mixed steps, decode steps of 1 to 3 rows."""
    g = torch.Generator().manual_seed(3)
    vocab = model.lm_head.weight.shape[0]
    reqs = [
        rollout.Request(r, torch.randint(0, vocab, (n,), generator=g), new, r)
        for r, (n, new) in enumerate(((6, 5), (3, 7), (9, 3), (1, 6), (4, 4)))
    ]
    eng = rollout.Engine(
        model, DeviceGumbelSampler(5), chunk_size=4, max_running=3, path=path,
        graph_buckets=BUCKETS if path == "step" else (),
    )  # fmt: skip
    done = eng.run(reqs)
    return {rid: (c.tokens, c.logprob_tensor) for rid, c in done.items()}, eng


def test_graph_decode_records_the_call_paths_bits(model) -> None:  # type: ignore[no-untyped-def]
    call, _ = _run(model, "call")
    step, eng = _run(model, "step")
    assert eng.runner is not None and eng.runner.replays > 0 and eng.runner.eager_steps > 0
    assert sorted(eng.runner.graphs) != []  # at least one bucket captured
    assert sorted(step) == sorted(call)
    for rid in call:
        assert step[rid][0] == call[rid][0]
        assert torch.equal(raw_bits(step[rid][1]), raw_bits(call[rid][1]))


def test_graph_decode_one_key_short_changes_the_logprobs(model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    call, _ = _run(model, "call")
    real = step_runner.StepPlan.from_device

    def short(slots, positions, max_len):  # type: ignore[no-untyped-def]
        plan = real(slots, positions, max_len)
        return dataclasses.replace(plan, n_keys=(plan.n_keys - 1).clamp(min=1))

    monkeypatch.setattr(step_runner.StepPlan, "from_device", staticmethod(short))
    step, _ = _run(model, "step")
    assert any(
        step[r][0] != call[r][0] or not torch.equal(raw_bits(step[r][1]), raw_bits(call[r][1])) for r in call
    )
