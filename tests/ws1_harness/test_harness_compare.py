"""Every comparator rule: raw bits (NaN, signed zero, one ulp, shape, dtype) and the tolerance rule's edges."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ws1_harness.run.compare import (
    ComparatorError,
    Comparison,
    ReferenceDtypeError,
    _words,
    bitwise_equal,
    raw_bits_equal,
    tolerance_check,
)

FLOATS = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
INT_VIEW = {
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


def _sample(dtype: torch.dtype, shape=(4, 5)) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)


def _next_up(t: torch.Tensor, index: tuple[int, ...]) -> torch.Tensor:
    """A copy of `t` with one element moved by exactly one ulp (integer view + 1 on a positive element)."""
    out = t.clone()
    iv = out.view(INT_VIEW[t.dtype])
    iv[index] = iv[index] + 1
    return out


@pytest.mark.parametrize("dtype", FLOATS)
def test_identical_tensors_pass(dtype: torch.dtype) -> None:
    a = _sample(dtype)
    result = bitwise_equal(a, a.clone())
    assert result.passed and result.reason_code is None
    assert result.diagnostics["n_mismatch"] == 0 and result.diagnostics["n_total"] == a.numel()


@pytest.mark.parametrize("dtype", (torch.int64, torch.int32, torch.bool))
def test_integer_tensors_compared_as_is(dtype: torch.dtype) -> None:
    a = torch.arange(12).reshape(3, 4).to(dtype)
    assert bitwise_equal(a, a.clone()).passed
    b = a.clone()
    b[1, 2] = (~b[1, 2]) if dtype == torch.bool else b[1, 2] + 1
    result = bitwise_equal(b, a)
    assert not result.passed and result.reason_code == "bits_differ"
    assert result.diagnostics["first_mismatch_index"] == [1, 2]


@pytest.mark.parametrize("dtype", FLOATS)
def test_one_ulp_change_is_caught(dtype: torch.dtype) -> None:
    a = _sample(dtype).abs() + 1
    b = _next_up(a, (2, 3))
    assert not torch.equal(a.view(INT_VIEW[dtype]), b.view(INT_VIEW[dtype]))
    result = bitwise_equal(b, a, keys=[(10, 0), (10, 1), (11, 0), (11, 1)])
    assert not result.passed and result.reason_code == "bits_differ"
    d = result.diagnostics
    assert d["n_mismatch"] == 1
    assert d["first_mismatch_index"] == [2, 3]
    assert d["first_mismatch_key"] == [11, 0]
    assert d["max_ulp"] == 1


@pytest.mark.parametrize("dtype", FLOATS)
def test_signed_zero_differs(dtype: torch.dtype) -> None:
    pos = torch.zeros(3, dtype=dtype)
    neg = pos.clone()
    neg[1] = -0.0
    assert bool((pos == neg).all())  # the trap: numerically equal
    result = bitwise_equal(neg, pos)
    assert not result.passed and result.reason_code == "bits_differ"
    assert result.diagnostics["first_mismatch_index"] == [1]


@pytest.mark.parametrize("dtype", FLOATS)
def test_nan_policy_identical_bits_only(dtype: torch.dtype) -> None:
    a = _sample(dtype, (6,))
    with_nan = a.clone()
    with_nan[2] = float("nan")
    # NaN against a number: caught
    result = bitwise_equal(with_nan, a)
    assert not result.passed and result.reason_code == "bits_differ"
    assert result.diagnostics["first_mismatch_index"] == [2]
    # NaN against the identical NaN bit pattern: equal
    assert bitwise_equal(with_nan, with_nan.clone()).passed
    # NaN against a NaN with another payload (or sign): differ
    other = with_nan.clone()
    iv = other.view(INT_VIEW[dtype])
    iv[2] = iv[2] ^ 1  # flip the lowest mantissa bit: still a NaN, other payload
    assert torch.isnan(other[2])
    assert not bitwise_equal(other, with_nan).passed


# how a compared tensor is cut from a contiguous 32-element buffer, and whether the 8-byte word path applies to it
LAYOUTS = {
    "contiguous": (lambda t: t[:8], True),
    "odd_bytes": (lambda t: t[:3], False),  # 3 bf16 = 6 bytes, 3 fp32 = 12: not whole words
    "offset": (lambda t: t[1:9], False),  # starts one element into the storage
    "strided": (lambda t: t[:16].view(8, 2).t(), False),  # not contiguous
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_raw_bits_equal_sees_one_bit_on_every_layout(dtype: torch.dtype, layout: str) -> None:
    """The word path (8-byte integers) and the same-width path judge one predicate, equal raw bits: on every layout
    a signed zero, another NaN payload and the low bit of the last element are each seen."""
    cut, words = LAYOUTS[layout]
    at = [int(i) for i in cut(torch.arange(32)).reshape(-1)]  # the storage index of each element, in order
    base = _sample(dtype, (32,))
    base[at[0]] = 0.0
    a = cut(base)
    assert (_words(a) is not None) == words
    assert raw_bits_equal(a, cut(base.clone()))
    signed_zero = base.clone()
    signed_zero[at[0]] = -0.0
    assert bool((cut(signed_zero) == a).all())  # numerically equal: only the bits differ
    low_bit = base.clone()
    low_bit.view(INT_VIEW[dtype])[at[-1]] ^= 1
    nan = base.clone()
    nan[at[-1]] = float("nan")
    other_nan = nan.clone()
    other_nan.view(INT_VIEW[dtype])[at[-1]] ^= 1
    assert torch.isnan(other_nan[at[-1]])
    assert raw_bits_equal(cut(nan), cut(nan.clone()))
    for name, changed, than in (("signed zero", signed_zero, base), ("low bit", low_bit, base),
                                ("NaN payload", other_nan, nan)):  # fmt: skip
        assert not raw_bits_equal(cut(changed), cut(than)), name
        assert not bitwise_equal(cut(changed), cut(than)).passed, name
    assert not raw_bits_equal(a, a.double())  # another dtype
    assert not raw_bits_equal(a, a.reshape(-1)[: a.numel() - 1])  # another shape


def test_shape_mismatch_is_a_failure_with_reason() -> None:
    a = _sample(torch.bfloat16, (4, 5))
    result = bitwise_equal(a[:3], a)
    assert not result.passed and result.reason_code == "shape_mismatch"
    assert result.diagnostics["actual_shape"] == [3, 5]


def test_dtype_mismatch_is_a_failure_with_reason() -> None:
    a = _sample(torch.float32)
    result = bitwise_equal(a.to(torch.bfloat16), a)
    assert not result.passed and result.reason_code == "dtype_mismatch"


def test_unsupported_dtype_raises() -> None:
    a = torch.zeros(2, dtype=torch.complex64)
    with pytest.raises(ComparatorError):
        bitwise_equal(a, a)


# ------------------------------------------------------------------------------------------ tolerance rule


def test_edges_on_both_sides(forward_spec) -> None:
    """Largest passing candidate passes; the next representable value fails."""
    atol, rtol = forward_spec.atol, forward_spec.rtol
    ref = torch.tensor([1.0, -3.0, 0.0, 1000.0], dtype=torch.float32)
    bound = [atol + rtol * abs(float(r)) for r in ref]
    cand_ok = ref.clone()
    for i, r in enumerate(ref.tolist()):
        c = torch.tensor(r + bound[i], dtype=torch.float64).to(torch.float32)
        while abs(float(c) - r) > bound[i]:  # fp32 rounding went past the edge: step back inside
            c = torch.nextafter(c, torch.tensor(r, dtype=torch.float32))
        cand_ok[i] = c
    assert tolerance_check(cand_ok, ref, forward_spec).passed
    for i in range(ref.numel()):
        bad = cand_ok.clone()
        bad[i] = torch.nextafter(cand_ok[i], torch.tensor(math.inf))
        result = tolerance_check(bad, ref, forward_spec, keys=[(i, 0) for i in range(4)])
        assert not result.passed and result.reason_code == "tolerance_exceeded"
        assert result.diagnostics["n_mismatch"] == 1
        assert result.diagnostics["first_mismatch_index"] == [i]
        assert result.diagnostics["first_mismatch_key"] == [i, 0]
        # The lower edge too
        low = ref.clone()
        low[i] = ref[i] - (cand_ok[i] - ref[i])
        if abs(float(low[i]) - float(ref[i])) <= bound[i]:
            assert tolerance_check(low, ref, forward_spec).passed


def test_identical_bf16_values_pass_and_report_zero_distance(forward_spec) -> None:
    cand = _sample(torch.bfloat16)
    result = tolerance_check(cand, cand.to(torch.float32), forward_spec)
    assert result.passed
    assert result.diagnostics["max_abs"] == 0.0 and result.diagnostics["max_ulp"] == 0


def test_diagnostics_ulp_in_candidate_dtype(forward_spec) -> None:
    ref = torch.ones(3, dtype=torch.float32)
    cand = _next_up(torch.ones(3, dtype=torch.bfloat16), (1,))
    result = tolerance_check(cand, ref, forward_spec)
    assert result.diagnostics["max_ulp"] == 1
    assert result.diagnostics["max_abs"] == pytest.approx(2.0**-7)


@pytest.mark.parametrize("ref_dtype", (torch.bfloat16, torch.float16, torch.float64))
def test_reference_must_be_fp32(forward_spec, ref_dtype: torch.dtype) -> None:
    cand = _sample(torch.bfloat16)
    with pytest.raises(ReferenceDtypeError):
        tolerance_check(cand, cand.to(ref_dtype), forward_spec)


def test_shape_mismatch_in_tolerance_check(forward_spec) -> None:
    cand = _sample(torch.bfloat16)
    result = tolerance_check(cand[:2], cand.to(torch.float32), forward_spec)
    assert not result.passed and result.reason_code == "shape_mismatch"


def test_bitwise_spec_is_not_a_tolerance(bitwise_spec) -> None:
    cand = _sample(torch.bfloat16)
    with pytest.raises(ComparatorError):
        tolerance_check(cand, cand.to(torch.float32), bitwise_spec)


@pytest.mark.parametrize(
    ("cand_value", "ref_value", "passes"),
    [
        (math.nan, 1.0, False),
        (math.inf, 1.0, False),
        (-math.inf, 1.0, False),
        (1.0, math.nan, False),
        (1.0, math.inf, False),
        (math.nan, math.nan, True),
        (math.inf, math.inf, True),
        (-math.inf, -math.inf, True),
        (math.inf, -math.inf, False),
        (math.nan, math.inf, False),
    ],
)
def test_non_finite_rule(forward_spec, cand_value: float, ref_value: float, passes: bool) -> None:
    ref = torch.tensor([0.5, ref_value, 2.0], dtype=torch.float32)
    cand = torch.tensor([0.5, cand_value, 2.0], dtype=torch.bfloat16)
    result = tolerance_check(cand, ref, forward_spec)
    assert result.passed is passes
    if not passes:
        assert result.reason_code == "non_finite"
        assert result.diagnostics["first_mismatch_index"] == [1]
    json.dumps(result.to_json(), allow_nan=False)


def test_to_json_is_strict_json_with_non_finite_diagnostics() -> None:
    comp = Comparison(False, "non_finite", {"max_abs": math.inf, "max_rel": math.nan, "n": 1})
    out = comp.to_json()
    assert out["diagnostics"]["max_abs"] == "inf" and out["diagnostics"]["max_rel"] == "nan"
    assert json.loads(json.dumps(out, allow_nan=False)) == out


def test_fast_fp32_rule_agrees_with_fp64_rule_at_the_boundary() -> None:
    """The fp32 fast path must give the fp64 rule's verdict element by element, right at the bound."""
    import torch

    from ws1_harness.run import compare as C

    class Spec:
        mode, atol, rtol = "tolerance", 5e-2, 2e-2

    gen = torch.Generator().manual_seed(7)
    ref = torch.randn(1 << 14, generator=gen)
    bound = Spec.atol + Spec.rtol * ref.double().abs()
    # candidates exactly on the bound and one fp32 step either side of it
    on = (ref.double() + bound).float()
    inside = torch.nextafter(on, ref)
    outside = torch.nextafter(on, torch.full_like(on, float("inf")))
    for cand in (on, inside, outside, ref + 1e-3):
        fast = C._fast_tolerance(cand, ref, Spec.atol, Spec.rtol)
        exact_bad = (cand.double() - ref.double()).abs() > Spec.atol + Spec.rtol * ref.double().abs()
        assert fast is not None
        assert fast.diagnostics["n_mismatch"] == int(exact_bad.sum())
        assert fast.passed == (int(exact_bad.sum()) == 0)


def test_large_tensors_are_compared_in_chunks_with_the_same_verdict() -> None:
    import torch

    from ws1_harness.run import compare as C

    class Spec:
        mode, atol, rtol = "tolerance", 1e-3, 0.0

    ref = torch.zeros(64, 1024)
    cand = ref.clone()
    cand[50, 7] = 0.5
    old = C.CHUNK_ELEMENTS
    C.CHUNK_ELEMENTS = 4096
    try:
        chunked = C.tolerance_check(cand, ref, Spec(), keys=[(9, r) for r in range(64)])
        bits = C.bitwise_equal(cand, ref)
    finally:
        C.CHUNK_ELEMENTS = old
    assert not chunked.passed and chunked.diagnostics["chunks"] == 16
    assert chunked.diagnostics["first_mismatch_index"] == [50, 7]
    assert chunked.diagnostics["first_mismatch_key"] == [9, 50]
    assert chunked.diagnostics["n_mismatch"] == 1
    assert not bits.passed and bits.reason_code == "bits_differ"


def test_large_bit_mismatch_keeps_its_verdict_with_cheap_diagnostics(monkeypatch) -> None:
    import torch

    from ws1_harness.run import compare as C

    monkeypatch.setattr(C, "ULP_DIAGNOSTIC_LIMIT", 16)
    a = torch.zeros(8, 8)
    b = a.clone()
    b[5, 2] = 0.25
    result = C.bitwise_equal(b, a)
    assert not result.passed and result.reason_code == "bits_differ"
    assert result.diagnostics["first_mismatch_index"] == [5, 2]
    assert result.diagnostics["max_abs"] == 0.25
    assert result.diagnostics["max_ulp"] is None
