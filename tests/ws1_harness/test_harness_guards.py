"""Falsifiability: the harness must see red where a candidate is broken, green where it is not.

Each way a gate has gone falsely green in execution has a negative control here: a row-mixing op, a batched
call split in secret, chunking that does not reach the op, padding that never pads, a fallback to another op,
a kernel that records one id and runs another (docs/design.md lists them).
The units run in-process at the `tiny` model widths on the `primary` fixture (4 samples, 8 layouts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import guard_profiles as gp
import pytest
import torch
from planted import run_planted

from ws1_contract import load_contract
from ws1_harness.run.adapters import build_adapters
from ws1_harness.run.unit import CandidateUnderTest, UnitResult, run_unit
from ws1_kernels import LayoutContext, launches, reference
from ws1_workload import build_fixture, build_layout, load_manifest

MANIFEST = load_manifest()
CONTRACT = load_contract()
MODEL = MANIFEST.model("tiny")
ADAPTERS = build_adapters(MODEL)
FIXTURE = build_fixture(MANIFEST, "primary")


class _AnyOp(frozenset):  # type: ignore[type-arg]
    """Declares every op: isolates a value failure from the dispatch watch in tests that break values."""

    def __contains__(self, item: object) -> bool:
        return True


ANY_OP = _AnyOp()


def judge(
    op: str,
    fn: Callable[..., torch.Tensor],
    *,
    extra_ops: frozenset[str] = frozenset(),
    kernels: frozenset[str] | None = None,
) -> UnitResult:
    base = gp.portable(op)
    return run_planted(
        op,
        fn,
        FIXTURE,
        prefix="guard",
        declared_kernels=kernels if kernels is not None else frozenset({base.kernel_id}),
        declared_ops=extra_ops if isinstance(extra_ops, _AnyOp) else base.declared_ops | extra_ops,
    )


def statuses(result: UnitResult) -> dict[str, tuple[str, Any]]:
    return {j: (r.status, r.reason_code) for j, r in result.judgments.items()}


def test_row_local_portable_candidate_is_green_on_all_four() -> None:
    result = judge("det_gemm", gp.portable("det_gemm").fn)
    assert statuses(result) == {j: ("green", None) for j in result.judgments}
    assert result.observed_kernels, "the launch log must have seen the kernel"


def test_row_mixing_op_is_red_on_invariance() -> None:
    result = judge("det_gemm", gp.mix_rows(gp.portable("det_gemm").fn), extra_ops=ANY_OP)
    s = statuses(result)
    assert s["forward_invariance"] == ("red", "bits_differ")
    assert s["gradient_invariance"] == ("red", "bits_differ")
    failed = result.judgments["forward_invariance"].diagnostics["failed_layouts"]
    assert "split_1" in failed and "permuted" in failed


def test_batch_size_dependent_gemm_is_red_on_invariance() -> None:
    result = judge("det_gemm", gp.split_k_small_batch, extra_ops=ANY_OP, kernels=frozenset({"guard.split_k"}))
    s = statuses(result)
    assert s["forward_invariance"] == ("red", "bits_differ"), s
    assert s["forward_accuracy"] == (
        "green",
        None,
    )  # accurate, but not invariant: the judgments are independent


def test_split_k_is_seen_on_the_order_probe_rows() -> None:
    """The red comes from the dot-order probe rows: the first differing element is on one of them."""
    from ws1_workload.inputs import hard_row_kind

    result = judge("det_gemm", gp.split_k_small_batch, extra_ops=ANY_OP, kernels=frozenset({"guard.split_k"}))
    fi = result.judgments["forward_invariance"]
    firsts = [
        d["diagnostics"]["first_mismatch_key"]
        for layout in fi.layouts
        for d in layout["diagnostics"].values()
        if d["diagnostics"].get("first_mismatch_key") is not None
    ]
    assert firsts, fi.layouts
    kinds = FIXTURE.hard_rows["det_gemm.x"]
    assert all(hard_row_kind(tuple(key[:2]), kinds) == "dot_order_rows" for key in firsts), firsts


def test_wgrad_accumulator_from_zero_is_red_on_the_wgrad_probe() -> None:
    """A weight gradient summed per call from zero is red on gradient invariance, and the first differing
    element is the probe's dW[0, 0] (ws1_workload.token_probes): decided by construction, not by which of the
    random elements happen to round differently (a few hundred of 131072 here)."""
    fn = gp.main_grad_from_zero(gp.portable("det_gemm").fn)
    result = run_planted(
        "det_gemm",
        fn,
        build_fixture(MANIFEST, "short"),
        prefix="guard",
        declared_kernels=frozenset({gp.portable("det_gemm").kernel_id}),
        declared_ops=ANY_OP,
    )
    s = statuses(result)
    assert s["gradient_invariance"] == ("red", "bits_differ"), s
    assert s["forward_invariance"] == ("green", None) and s["gradient_accuracy"] == ("green", None), s
    firsts = [
        d["diagnostics"]["first_mismatch_index"]
        for layout in result.judgments["gradient_invariance"].layouts
        for name, d in layout["diagnostics"].items()
        if name.endswith("d_weight") and not d["passed"]
    ]
    assert firsts and all(f == [0, 0] for f in firsts), firsts


def test_split_kv_decode_is_red_on_forward_invariance() -> None:
    """Attention that splits the keys in two for decode-sized calls is red on the inference layouts of a
    sample that holds the attention order probe (explicit orders in tests/ws1_workload/test_token_probes.py) makes the
    red certain whatever the random rows do."""
    from ws1_workload.fixtures import make_fixture

    base = gp.portable("attention")
    # one sample long enough for the probe, decoding its last 10 tokens: the long tier's probe sample without
    # the other eight (the whole tier took about 20 s here, on each of the three CPU paths)
    fixture = make_fixture(
        "guard/split_kv",
        [1000],
        [990],
        pad_id=MODEL.pad_id,
        token_id_limit=MANIFEST.token_id_limit,
        hard_rows=MANIFEST.hard_rows,
        token_cases=MANIFEST.token_cases,
    )
    assert fixture.token_edits.get("attention.q") is not None, "the fixture must hold the attention probe"
    result = run_planted(
        "attention",
        gp.split_kv_small_calls,
        fixture,
        prefix="guard",
        declared_kernels=frozenset({base.kernel_id}),
        declared_ops=base.declared_ops | {"aten.nan_to_num"},
    )
    s = statuses(result)
    assert s["forward_invariance"] == ("red", "bits_differ"), s
    assert s["forward_accuracy"] == ("green", None) and s["gradient_invariance"] == ("green", None), s
    failed = result.judgments["forward_invariance"].diagnostics["failed_layouts"]
    assert "decode" in failed and "packed" not in failed, failed


def test_undeclared_stock_op_is_red_even_with_identical_values() -> None:
    result = judge("det_gemm", gp.stock_fallback(gp.portable("det_gemm").fn))
    s = statuses(result)
    assert s["forward_accuracy"] == ("red", "undeclared_op")
    assert s["forward_invariance"] == ("red", "undeclared_op")
    assert "aten.addmm" in result.judgments["forward_accuracy"].diagnostics["undeclared_ops"]


def test_undeclared_kernel_id_is_red() -> None:
    result = judge("det_gemm", gp.portable("det_gemm").fn, kernels=frozenset({"some.other.kernel"}))
    assert statuses(result)["forward_accuracy"] == ("red", "undeclared_kernel")


def test_no_launch_recorded_is_red() -> None:
    base = gp.portable("silu").fn

    def silent(x: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
        with launches.observe():  # swallow nothing: the kernel records into the inner log only
            pass
        return (x.float() * torch.sigmoid(x.float())).to(torch.bfloat16)

    ops = frozenset({"aten.sigmoid", "aten.mul"})
    result = judge("silu", silent, extra_ops=ops)
    assert statuses(result)["forward_accuracy"] == ("red", "no_kernel_observed")
    assert base is not silent


def test_nan_is_caught_by_accuracy() -> None:
    result = judge("rms_norm", gp.nan_one(gp.portable("rms_norm").fn), extra_ops=ANY_OP)
    assert statuses(result)["forward_accuracy"] == ("red", "non_finite")


def test_flipped_zero_sign_is_caught_by_invariance() -> None:
    result = judge("silu", gp.neg_zero_when_alone(gp.portable("silu").fn), extra_ops=ANY_OP)
    s = statuses(result)
    assert s["forward_invariance"] == ("red", "bits_differ")
    failed = result.judgments["forward_invariance"].diagnostics["failed_layouts"]
    assert "split_1" in failed and "padded_right" not in failed


def test_one_ulp_under_one_layout_is_caught() -> None:
    extra = ANY_OP
    result = judge("silu", gp.ulp_when_padded(gp.portable("silu").fn), extra_ops=extra)
    s = statuses(result)
    assert s["forward_accuracy"] == ("green", None)
    assert s["forward_invariance"] == ("red", "bits_differ")
    failed = set(result.judgments["forward_invariance"].diagnostics["failed_layouts"])
    assert failed == {"padded_right", "padded_left"}


def test_missing_backward_is_its_own_failure() -> None:
    result = judge("rms_norm", gp.no_backward(gp.portable("rms_norm").fn))
    s = statuses(result)
    assert s["gradient_accuracy"] == ("red", "missing_backward")
    assert s["gradient_invariance"] == ("red", "missing_backward")
    assert s["forward_invariance"] == ("green", None)


def test_reference_must_be_fp32() -> None:
    base = gp.portable("silu")
    cand = CandidateUnderTest(
        "guard.silu",
        base.fn,
        lambda x, ctx: base.fn(x.to(torch.bfloat16), ctx),
        frozenset({base.kernel_id}),
        base.declared_ops,
        None,
    )
    with pytest.raises(Exception, match="fp32|float32|reference"):
        run_unit(
            cand,
            ADAPTERS["silu"],
            FIXTURE,
            MANIFEST.layouts,
            CONTRACT,
            "elementwise",
            case_id="guard/ref",
            pad_id=MODEL.pad_id,
        )


class _CallRecorder:
    """Wraps a candidate and records the rows, pads and samples of every physical call it receives."""

    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        self.fn = fn
        self.calls: list[tuple[int, int, int]] = []

    def __call__(self, *args: Any) -> torch.Tensor:
        ctx = args[-1]
        sids = ctx.sample_ids
        self.calls.append((len(sids), int((sids < 0).sum()), len({s for s in sids.tolist() if s >= 0})))
        return self.fn(*args)


@pytest.mark.parametrize(
    "layout_name", ["packed", "split_1", "split_half", "chunked", "padded_right", "decode"]
)
def test_adapters_execute_the_physical_layout(layout_name: str) -> None:
    """B=N is one call, micro-batches and chunks split it, padding reaches the op: a layout
    compared with itself would make every invariance verdict void."""
    spec = next(s for s in MANIFEST.layouts if s.name == layout_name)
    recorder = _CallRecorder(gp.portable("silu").fn)
    judge_specs = tuple(s for s in MANIFEST.layouts if s.name in ("packed", layout_name))
    cand = CandidateUnderTest(
        "guard.silu",
        recorder,
        reference.silu,
        frozenset({gp.portable("silu").kernel_id}),
        gp.portable("silu").declared_ops,
        None,
    )
    run_unit(
        cand,
        ADAPTERS["silu"],
        FIXTURE,
        judge_specs,
        CONTRACT,
        "elementwise",
        case_id="guard/calls",
        pad_id=MODEL.pad_id,
    )
    layout = build_layout(FIXTURE, spec)
    n_samples = len(FIXTURE.samples)
    seen = recorder.calls if layout_name == "packed" else recorder.calls[1:]
    assert len(seen) == len(layout.calls)
    if layout_name == "packed":
        assert seen == [(sum(s.length for s in FIXTURE.samples), 0, n_samples)]
    elif layout_name == "split_1":
        assert [c[2] for c in seen] == [1] * n_samples
    elif layout_name == "split_half":
        assert [c[2] for c in seen] == [n_samples // 2, n_samples - n_samples // 2]
    elif layout_name == "chunked":
        assert len(seen) >= 2 and all(c[0] <= n_samples * spec.params["chunk_size"] for c in seen)
    elif layout_name == "padded_right":
        assert len(seen) == 1 and seen[0][1] > 0, "pad rows must reach the op"
    elif layout_name == "decode":
        assert len(seen) > 2 and all(c[0] <= n_samples for c in seen[1:])


def test_harness_judges_the_kernels_own_weight_gradient() -> None:
    """Trap 9: a candidate that declares the main_grad rule but leaves main_grad untouched is red; the harness
    never computes dW itself."""
    from ws1_kernels import registry

    native = registry.resolve("native_torch", "det_gemm", device="cpu")
    base = gp.portable("det_gemm")
    cand = CandidateUnderTest(
        "guard.det_gemm",
        native.fn,
        reference.det_gemm,
        frozenset({native.kernel_id}),
        native.declared_ops,
        base.param_grad_rule,
    )
    result = run_unit(
        cand,
        ADAPTERS["det_gemm"],
        FIXTURE,
        MANIFEST.layouts,
        CONTRACT,
        "gemm",
        case_id="guard/dw",
        pad_id=MODEL.pad_id,
    )
    acc = result.judgments["gradient_accuracy"]
    assert (acc.status, acc.reason_code) == ("red", "tolerance_exceeded")
    assert acc.diagnostics["d_weight"]["passed"] is False
    assert acc.diagnostics["d_x"]["passed"] is True


def test_candidate_for_missing_hardware_is_pending_arch_not_red() -> None:
    """Trap 16: the arch a candidate needs is declared on the candidate; the harness gates on capability."""
    from dataclasses import replace

    from ws1_harness.run.tasks import UnitTask, execute_task
    from ws1_kernels import registry

    sm90 = replace(gp.portable("silu"), profile="guard_sm90", device="cuda", min_arch="sm90")
    registry.register_profile("guard_sm90", [sm90], replace=True)
    records = execute_task(UnitTask("guard_sm90", "silu", "short", model="tiny"))
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the candidate would run")
    assert {(r["status"], r["reason_code"]) for r in records} == {("pending_arch", "arch_unavailable")}
    missing = execute_task(UnitTask("guard_sm90", "rms_norm", "short", model="tiny"))
    assert {(r["status"], r["reason_code"]) for r in missing} == {("red", "candidate_unavailable")}
