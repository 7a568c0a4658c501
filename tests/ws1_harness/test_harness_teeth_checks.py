"""The harness checks behind the regression suite, one property each, at the `tiny` widths on `short`.

Every call observed (a silent call is red with its index), inputs and parameters unchanged bit for bit, every
reason of a cell kept, a wrong output shape reported as such, verdicts that survive a later crash, and the
manifest's hard-row inputs naming real operator inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import teeth_profiles as tp
import torch
from planted import run_planted

from ws1_contract import load_contract
from ws1_harness.run.adapters import build_adapters
from ws1_harness.run.unit import UnitResult
from ws1_kernels import LayoutContext
from ws1_workload import build_fixture, load_manifest

MANIFEST = load_manifest()
CONTRACT = load_contract()
MODEL = MANIFEST.model("tiny")
ADAPTERS = build_adapters(MODEL)
FIXTURE = build_fixture(MANIFEST, "short", "tiny")


def judge(op: str, fn: Callable[..., torch.Tensor], extra_ops: frozenset[str] = tp.WRAPPER_OPS) -> UnitResult:
    base = tp.portable(op)
    return run_planted(
        op,
        fn,
        FIXTURE,
        prefix="teeth",
        declared_kernels=base.all_kernel_ids,
        declared_ops=base.declared_ops | extra_ops,
    )


def reasons(result: UnitResult, judgment: str) -> list[str]:
    jr = result.judgments[judgment]
    return list(jr.diagnostics.get("reasons", [jr.reason_code]))


def test_a_silent_call_is_red_with_its_index() -> None:
    result = judge(
        "silu", tp.silu_silent_small_calls, tp.WRAPPER_OPS | {"aten.sigmoid", "aten.sigmoid_backward"}
    )
    fa = result.judgments["forward_accuracy"]
    assert (fa.status, fa.reason_code) == ("red", "no_kernel_observed")
    silent = fa.diagnostics["silent_calls"]
    assert silent and all(set(c) == {"layout", "call"} for c in silent)
    assert any(c["layout"] == "decode" for c in silent)
    # the other calls did record the kernel: the union alone would have hidden the silent ones
    assert result.observed_kernels == [tp.portable("silu").kernel_id]


def test_a_weight_written_through_data_is_red() -> None:
    result = judge("rms_norm", tp.rms_norm_writes_weight)
    fa = result.judgments["forward_accuracy"]
    assert "input_modified" in reasons(result, "forward_accuracy")
    assert fa.diagnostics["modified"][0] == {
        "layout": "packed",
        "tensor": "weight",
        "call": 0,
        "pass": "forward",
    }


def test_an_input_written_in_place_is_red_on_the_pass_that_wrote_it() -> None:
    base = tp.portable("silu").fn

    class _ZeroInputInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[override]
            ctx.x = x
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):  # type: ignore[override]
            ctx.x.data[0].zero_()  # the candidate scribbles over its input during backward
            return g

    def fn(x: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
        return base(_ZeroInputInBackward.apply(x), ctx)

    result = judge("silu", fn, tp.WRAPPER_OPS | {"aten.zero_", "aten.select"})
    assert "input_modified" in reasons(result, "gradient_accuracy")
    assert "input_modified" not in reasons(result, "forward_accuracy")


def test_unchanged_inputs_raise_nothing() -> None:
    """Negative control of the check: the portable candidate leaves every input as it got it."""
    result = judge("rms_norm", tp.portable("rms_norm").fn)
    assert all(jr.status == "green" for jr in result.judgments.values())


def test_a_numeric_failure_and_an_undeclared_op_are_both_kept() -> None:
    base = tp.portable("silu").fn

    def fn(x: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
        torch.addmm(torch.zeros(1), x[:1].float(), x[:1].float().t())  # undeclared stock op
        return base(x, ctx) * 1.5  # and a wrong value

    result = judge("silu", fn)
    fa = result.judgments["forward_accuracy"]
    assert fa.reason_code == "tolerance_exceeded"  # the comparison is the first reason
    assert set(reasons(result, "forward_accuracy")) == {"tolerance_exceeded", "undeclared_op"}
    assert fa.layouts and fa.layouts[0]["checks"][0]["reason_code"] == "tolerance_exceeded"


def test_an_extra_output_row_is_shape_mismatch_on_all_four() -> None:
    result = judge("silu", tp.silu_extra_row)
    for judgment, jr in result.judgments.items():
        assert (jr.status, jr.reason_code) == ("red", "shape_mismatch"), (judgment, jr.diagnostics)
    detail = result.judgments["forward_accuracy"].diagnostics["output"]["diagnostics"]
    assert detail["actual_shape"][0] == detail["expected_shape"][0] + 1


def test_verdicts_survive_a_later_crash() -> None:
    base = tp.portable("silu").fn

    def fn(x: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
        if ctx.sample_ids.shape[0] != FIXTURE.total_tokens:  # every layout but a full unpadded batch
            raise RuntimeError("boom")
        return base(x, ctx)

    result = judge("silu", fn)
    assert result.judgments["forward_accuracy"].status == "green"
    assert result.judgments["gradient_accuracy"].status == "green"
    fi = result.judgments["forward_invariance"]
    assert (fi.status, fi.reason_code) == ("error", "exception")
    assert "split_1" in fi.diagnostics["crashed_layouts"]


def test_a_backward_crash_keeps_the_forward_verdicts() -> None:
    base = tp.portable("silu").fn

    class _Crash(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[override]
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):  # type: ignore[override]
            raise RuntimeError("backward boom")

    result = judge("silu", lambda x, ctx: base(_Crash.apply(x), ctx))
    assert result.judgments["forward_accuracy"].status == "green"
    assert result.judgments["forward_invariance"].status == "green"
    ga = result.judgments["gradient_accuracy"]
    assert (ga.status, ga.reason_code) == ("error", "exception")


def test_a_stock_bf16_gemm_is_not_the_declared_fp32_mm() -> None:
    result = judge("det_gemm", tp.det_gemm_flinear)
    assert "undeclared_op" in reasons(result, "forward_accuracy")
    assert "aten.mm:bf16" in result.judgments["forward_accuracy"].diagnostics["undeclared_ops"]


def _float_inputs() -> set[str]:
    """Every generated float tensor of a unit: the float token inputs and the upstream gradient (`<op>.upstream`,
    which holds dx's order probes)."""
    inputs = {
        f"{a.operator}.{t.name}" for a in ADAPTERS.values() for t in a.token_inputs if t.kind == "float"
    }
    return inputs | {f"{op}.upstream" for op in ADAPTERS}


def test_every_hard_row_input_is_an_operator_input() -> None:
    """A misspelt input in the manifest would leave its hard rows silently unused."""
    assert set(MANIFEST.hard_rows) <= _float_inputs()
    assert "rms_norm.y" not in _float_inputs()  # negative control of the check itself


def test_hard_rows_reach_the_operator_inputs() -> None:
    from ws1_harness.run.unit import logical_inputs

    inputs: Any = logical_inputs(ADAPTERS["rms_norm"], FIXTURE, "teeth/rows", MODEL.pad_id, False)
    x = inputs.tokens["x"].float()
    zero_rows = (x == 0).all(dim=1)
    assert bool(zero_rows.any())
    assert bool(torch.signbit(x[zero_rows]).any()) and not bool(torch.signbit(x[zero_rows]).all())
    ms = x.pow(2).mean(dim=1)
    assert bool(((ms > MODEL.rms_eps / 4) & (ms < MODEL.rms_eps * 4)).any())
