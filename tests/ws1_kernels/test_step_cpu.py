"""The step path (``integrations.step``) on the CPU with fp32 textbook ops: its bookkeeping and its tables.

The kernels' bits are the GPU test's business (``test_step_gpu.py``); here the cache slots, the plan and the
scenario's rows are checked against one packed ``forward_call`` of the fp32 reference drop-in, to 1e-5, with a
negative control that shifts every row's key count by one."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from step_support import REFERENCE_STEP_OPS, packed_logits, run_steps, sequences  # noqa: E402

from ws1_kernels import KernelInputError  # noqa: E402
from ws1_kernels.integrations import qwen3  # noqa: E402
from ws1_kernels.integrations.step import SlabCache, StepPlan, plan_rows, step_ops  # noqa: E402
from ws1_kernels.rope_math import rope_tables, rotate  # noqa: E402
from ws1_kernels.step_ops import StepOps  # noqa: E402


@pytest.fixture(scope="module")
def model(tiny_one_layer):  # type: ignore[no-untyped-def]
    _m, cfg, weights, _fx = tiny_one_layer
    return qwen3.build_model(qwen3.qwen3_config(cfg), weights, qwen3.REFERENCE_PROFILE)


def _close(a: dict, b: dict) -> float:
    assert set(a) <= set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_steps_give_the_packed_forward_rows(model) -> None:  # type: ignore[no-untyped-def]
    seqs = sequences(model.lm_head.weight.shape[0], "cpu")
    ref = packed_logits(model, seqs)
    got = run_steps(model, REFERENCE_STEP_OPS, seqs)
    assert set(got) == set(ref)  # every (request, position) of the three sequences came out of a step
    assert _close(got, ref) < 1e-4


def test_a_plan_one_key_short_is_seen(model) -> None:  # type: ignore[no-untyped-def]
    seqs = sequences(model.lm_head.weight.shape[0], "cpu")
    ref = packed_logits(model, seqs)

    def short(plan: StepPlan) -> StepPlan:
        return dataclasses.replace(plan, n_keys=(plan.n_keys - 1).clamp(min=1))

    assert _close(run_steps(model, REFERENCE_STEP_OPS, seqs, tamper=short), ref) > 1e-3


def _cache(slots: int = 2, max_len: int = 4) -> SlabCache:
    return SlabCache.allocate(1, slots, max_len, 1, 2, device="cpu", dtype=torch.float32)


def test_a_freed_slot_goes_to_the_next_request_and_a_full_cache_refuses() -> None:
    c = _cache()
    assert (c.join(10), c.join(11)) == (0, 1)
    with pytest.raises(KernelInputError, match="all 2 slots"):
        c.join(12)
    c.leave(10)
    assert c.join(12) == 0 and c.length[12] == 0
    with pytest.raises(KernelInputError, match="already holds"):
        c.join(12)
    with pytest.raises(KernelInputError, match="holds no slot"):
        c.leave(10)


def test_plan_rows_advance_lengths_and_pad_into_the_scratch_slot() -> None:
    c = _cache()
    c.join(10)
    c.join(11)
    slots, pos = plan_rows(c, [11, 10], [2, 1], pad_to=5)
    assert slots.tolist() == [1, 1, 0, 2, 2] and pos.tolist() == [0, 1, 0, 0, 0]
    assert c.length == {10: 1, 11: 2}
    plan = StepPlan.from_device(slots, pos, c.max_len)
    assert plan.rows.tolist() == [4, 5, 0, 8, 8] and plan.key_base.tolist() == [4, 4, 0, 8, 8]
    assert plan.n_keys.tolist() == [1, 2, 1, 1, 1] and plan.n_keys.dtype == torch.int32


@pytest.mark.parametrize(
    ("rids", "counts", "pad_to", "needle"),
    [
        ([99], [1], None, "holds no slot"),
        ([10], [0], None, "at least 1"),
        ([10], [5], None, "past its slab"),
        ([10], [3], 2, "do not fit a bucket"),
    ],
)
def test_bad_steps_are_one_line(rids, counts, pad_to, needle) -> None:  # type: ignore[no-untyped-def]
    c = _cache()
    c.join(10)
    with pytest.raises(KernelInputError, match=needle) as info:
        plan_rows(c, rids, counts, pad_to=pad_to)
    assert "\n" not in str(info.value)


def test_a_profile_without_step_ops_is_refused() -> None:
    with pytest.raises(KernelInputError, match="no inference step ops"):
        step_ops("portable_cpu")


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"path": "graph"}, "path must be one of"),
        ({"graph_buckets": (4,)}, "graph_buckets need path='step'"),
    ],
)
def test_bad_engine_paths_are_one_line(model, kwargs, needle) -> None:  # type: ignore[no-untyped-def]
    from ws1_kernels.integrations import rollout

    with pytest.raises(KernelInputError, match=needle) as exc:
        rollout.Engine(model, rollout.GumbelSampler(0), chunk_size=2, **kwargs)
    assert "\n" not in str(exc.value)


def test_the_step_path_refuses_a_profile_without_step_ops(rollout_model_and_fixture) -> None:  # type: ignore[no-untyped-def]
    from ws1_kernels.integrations.step_runner import StepRunner

    portable, _fx = rollout_model_and_fixture
    with pytest.raises(KernelInputError, match="'portable_cpu' has no inference step ops"):
        StepRunner(portable, slots=1, max_len=4)


def test_the_hopper_step_ops_are_the_generic_ones_with_the_hopper_gemm_logp_and_attention() -> None:
    """Built from the generic table: every op but ``linear``, ``logp`` and ``attention`` is the very same function
    (the control: those three are not: the rollout's GEMM, attention and logprob are the profile's own kernels, as
    its candidates run them), and the op watch's namespaces cover both libraries."""
    generic, hopper = step_ops("cuda_bf16"), step_ops("cuda_bf16_sm90")
    same = [
        f
        for f in ("embedding", "norm", "rope", "attention", "swiglu", "logp", "linear")
        if getattr(hopper, f) is getattr(generic, f)
    ]
    assert same == ["embedding", "norm", "rope", "swiglu"]
    assert hopper.namespaces == ("ws1", "ws1_sm90")


def _counting_ops(split: bool) -> tuple[StepOps, dict[str, int]]:
    """The reference ops with every rope call, and every step (one embedding a step), counted; ``split``: rope in
    two parts, the angles (cos and sin of ``rope_tables``) then the rotation."""
    calls = {"step": 0, "rope": 0, "angles": 0, "rotate": 0}
    ref = REFERENCE_STEP_OPS

    def count(name: str, fn: Any) -> Any:
        def counted(*args: Any) -> Any:
            calls[name] += 1
            return fn(*args)

        return counted

    split_ops: dict[str, Any] = {}
    if split:
        split_ops = {
            "rope_angles": count("angles", lambda pos, theta, dim: torch.stack(rope_tables(pos, dim, theta))),
            "rope_rotate": count("rotate", lambda x, t: rotate(x.float(), t[0], t[1]).to(x.dtype)),
        }
    ops = dataclasses.replace(
        ref, embedding=count("step", ref.embedding), rope=count("rope", ref.rope), **split_ops
    )
    return ops, calls


def test_a_split_rope_makes_its_angles_once_per_step(model) -> None:  # type: ignore[no-untyped-def]
    """With ``rope_angles``/``rope_rotate`` the step makes the table once and rotates q and k of every layer with
    it, the same rows as ``rope`` per call."""
    seqs = sequences(model.lm_head.weight.shape[0], "cpu")
    ops, calls = _counting_ops(split=True)
    got = run_steps(model, ops, seqs)
    layers = len(model.model.layers)
    assert calls["step"] > 1 and calls["rope"] == 0
    assert calls["angles"] == calls["step"] and calls["rotate"] == 2 * layers * calls["step"]
    assert _close(got, run_steps(model, REFERENCE_STEP_OPS, seqs)) == 0.0


def test_the_control_an_unsplit_rope_is_called_for_q_and_k_of_every_layer(model) -> None:  # type: ignore[no-untyped-def]
    seqs = sequences(model.lm_head.weight.shape[0], "cpu")
    ops, calls = _counting_ops(split=False)
    run_steps(model, ops, seqs)
    assert calls["angles"] == 0 and calls["rope"] == 2 * len(model.model.layers) * calls["step"] > 0


def test_a_half_split_rope_is_refused() -> None:
    with pytest.raises(KernelInputError, match="rope_angles and rope_rotate come together"):
        dataclasses.replace(REFERENCE_STEP_OPS, rope_angles=lambda p, t, d: p)
