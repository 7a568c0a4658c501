"""Bad input is refused with a one-line KernelInputError (a ValueError), never a wrong answer or a crash."""

from __future__ import annotations

import pytest
import torch
from kernels_support import OP_CLASS, Batch, context, layout, make_case
from profiles_support import CANDIDATE_PROFILES, MAIN_GRAD_PROFILES, resolve_or_skip

from ws1_kernels import KernelInputError, LayoutContext, reference

DIMS = dict(hidden=64, vocab=200, inter=48, heads=4, kv_heads=2, head_dim=16)
BATCH = Batch((3, 4), (1, 2))
# every profile the registry knows with candidates (one refused here for hardware alone is skipped), and the fp32
# references, which check their inputs the same way
PROFILES = (*CANDIDATE_PROFILES, "reference")


def _fn(profile: str, op: str):
    return getattr(reference, op) if profile == "reference" else resolve_or_skip(profile, op).fn


def _args(case, rows=None, ints=None, params=None):
    src = {"row": rows or case.rows, "int": ints or case.ints, "param": params or case.params}
    return [val if kind == "scalar" else src[kind][val] for kind, val in case.args]


def _raises(fn, *args) -> str:
    with pytest.raises(KernelInputError) as info:
        fn(*args)
    msg = str(info.value)
    assert "\n" not in msg and ": " in msg
    assert isinstance(info.value, ValueError)
    return msg


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("op", sorted(OP_CLASS))
def test_wrong_dtype_shape_and_ctx_length(profile: str, op: str) -> None:
    fn = _fn(profile, op)
    case = make_case(op, BATCH, DIMS)
    ctx = context(layout(BATCH, "packed")[0])
    first = case.args[0]
    if first[0] == "row" and profile != "reference":
        bad = {**case.rows, first[1]: case.rows[first[1]].to(torch.float16)}
        _raises(fn, *_args(case, rows=bad), ctx)
    if first[0] == "row":
        bad = {**case.rows, first[1]: case.rows[first[1]].unsqueeze(0)}
        _raises(fn, *_args(case, rows=bad), ctx)
    short = LayoutContext(ctx.sample_ids[:-1], ctx.positions[:-1])
    assert "rows" in _raises(fn, *_args(case), short)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("op", sorted(OP_CLASS))
def test_empty_batch(profile: str, op: str) -> None:
    fn = _fn(profile, op)
    case = make_case(op, BATCH, DIMS)
    empty = LayoutContext(torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64))
    rows = {k: t[:0] for k, t in case.rows.items()}
    ints = {k: t[:0] for k, t in case.ints.items()}
    assert "empty" in _raises(fn, *_args(case, rows=rows or None, ints=ints or None), empty)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("op", ["embedding", "logp", "linear_logp"])
@pytest.mark.parametrize("bad_id", [-1, "vocab"])
def test_out_of_range_ids(profile: str, op: str, bad_id) -> None:
    fn = _fn(profile, op)
    case = make_case(op, BATCH, DIMS)
    ctx = context(layout(BATCH, "packed")[0])
    name = next(iter(case.ints))
    ids = case.ints[name].clone()
    ids[2] = DIMS["vocab"] if bad_id == "vocab" else bad_id
    msg = _raises(fn, *_args(case, ints={name: ids}), ctx)
    assert str(int(ids[2])) in msg
    _raises(fn, *_args(case, ints={name: case.ints[name].int()}), ctx)  # int32 ids


@pytest.mark.parametrize("profile", PROFILES)
def test_context_errors(profile: str) -> None:
    case = make_case("silu", BATCH, DIMS)
    fn = _fn(profile, "silu")
    x = case.rows["x"]
    n = x.shape[0]
    gap = LayoutContext(torch.zeros(n, dtype=torch.int64), torch.tensor([0, 1, 3, 4, 5, 6, 7]))
    assert "consecutive" in _raises(fn, x, gap)
    split = LayoutContext(torch.tensor([0, 0, 1, 1, 0, 0, 0]), torch.tensor([0, 1, 0, 1, 2, 3, 4]))
    assert "contiguous" in _raises(fn, x, split)
    badpad = LayoutContext(torch.tensor([0, 0, 0, -1, 1, 1, 1]), torch.tensor([0, 1, 2, 3, 0, 1, 2]))
    assert "pad" in _raises(fn, x, badpad)
    f32 = LayoutContext(torch.zeros(n), torch.arange(n))
    assert "int64" in _raises(fn, x, f32)


@pytest.mark.parametrize("profile", PROFILES)
def test_attention_prefix_must_match_positions(profile: str) -> None:
    fn = _fn(profile, "attention")
    case = make_case("attention", BATCH, DIMS)
    q, k, v = (case.rows[n][:2] for n in "qkv")
    ids, pos = torch.tensor([0, 0]), torch.tensor([3, 4])
    assert "kv_prefix" in _raises(fn, q, k, v, 0.25, LayoutContext(ids, pos))
    wrong = {0: (k[:1].repeat(3, 1, 1), v[:1].repeat(2, 1, 1))}
    _raises(fn, q, k, v, 0.25, LayoutContext(ids, pos, wrong))
    gqa = case.rows["k"][:2, :1].repeat(1, 3, 1)  # 3 kv heads do not divide 4 query heads
    _raises(fn, q, gqa, gqa, 0.25, context(layout(Batch((2,), (1,)), "packed")[0]))


@pytest.mark.parametrize("profile", MAIN_GRAD_PROFILES)
def test_main_grad_of_wrong_dtype_is_refused(profile: str) -> None:
    case = make_case("det_gemm", BATCH, DIMS)
    w = case.params["weight"].clone().requires_grad_(True)
    w.main_grad = torch.zeros(w.shape, dtype=torch.bfloat16)
    fn = _fn(profile, "det_gemm")
    assert "main_grad" in _raises(fn, case.rows["x"], w, context(layout(BATCH, "packed")[0]))


@pytest.mark.parametrize("profile", MAIN_GRAD_PROFILES)
def test_main_grad_not_contiguous_is_refused(profile: str) -> None:
    """The shared check of every sample_blocks_main_grad backend: a strided buffer would be written wrongly."""
    case = make_case("det_gemm", BATCH, DIMS)
    w = case.params["weight"].clone().requires_grad_(True)
    w.main_grad = torch.zeros((w.shape[1], w.shape[0]), dtype=torch.float32).t()
    fn = _fn(profile, "det_gemm")
    assert "contiguous" in _raises(fn, case.rows["x"], w, context(layout(BATCH, "packed")[0]))
