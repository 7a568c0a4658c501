"""`ws1 bench`'s second backward peer for a `sample_blocks_main_grad` candidate: dW accumulated into an fp32
`main_grad` by the peer too, so a GEMM row can say how much of its shortfall is the kernel and how much the rule.

CPU tests check the peer's math, which rows get it, and its arithmetic with a fake timer (never a speed). The
GPU test checks the CUDA form (one cuBLAS addmm with fp32 C = D, in place) against the fp32 definition.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fake_timer import FakeTimer

from ws1_harness.run.bench import cases, records
from ws1_harness.run.bench.runner import Options, collect

BF = torch.bfloat16


TIMES = {"candidate": 2.0, "peer": 1.0, "peer_main_grad": 1.5, "copy": 1.0, "mm": 1.0}


def _gemm_operands(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Small integers in bf16: every product and every partial sum is an integer far below 2**24, exact in
    fp32 in any order, so the CPU tests' equalities hold whatever the host's BLAS blocks or vectorises."""
    g = torch.Generator(device=device).manual_seed(3)

    def ints(*shape: int) -> torch.Tensor:
        return torch.randint(-4, 5, shape, generator=g, device=device).to(BF)

    return ints(24, 40), ints(16, 40), ints(24, 16)


def _run_peer(
    x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, calls: int
) -> tuple[torch.Tensor, torch.Tensor]:
    xl, wl = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    wl.main_grad = torch.zeros(w.shape, dtype=torch.float32, device=w.device)  # type: ignore[attr-defined]
    for _ in range(calls):
        xl.grad = None
        out = cases.CASES["det_gemm"].stock_main_grad({"x": xl, "weight": wl}, None)  # type: ignore[misc]
        torch.autograd.backward(out, dy)
    assert wl.grad is None  # the rule: dW goes to main_grad alone
    assert xl.grad is not None
    return xl.grad, wl.main_grad  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------- the peer's math


def test_the_peer_accumulates_dw_in_fp32_into_main_grad() -> None:
    x, w, dy = _gemm_operands("cpu")
    dx, mg = _run_peer(x, w, dy, calls=2)
    one = dy.t().double() @ x.double()  # exact: integers (see _gemm_operands)
    assert torch.equal(mg.double(), one + one)  # accumulated twice, in fp32
    assert torch.equal(dx.double(), dy.double() @ w.double())  # dx is the GEMM of dy and w (exact here too)


def test_control_one_call_is_not_two() -> None:
    """The equality above sees accumulation: one call gives half of it, not the same tensor."""
    x, w, dy = _gemm_operands("cpu")
    _, once = _run_peer(x, w, dy, calls=1)
    _, twice = _run_peer(x, w, dy, calls=2)
    assert torch.count_nonzero(once).item() > 0
    assert not torch.equal(once, twice)


# ---------------------------------------------------------------------------------------------- which rows


def _collect(tmp_path: Path, profile: str, ops: tuple[str, ...]) -> tuple[dict, FakeTimer]:
    timer = FakeTimer(TIMES)
    opts = Options(
        profile=profile, device="cpu", model="tiny", out=tmp_path, ops=ops, shapes=("o", "lm_head", "vocab"),
        ms=(1,), copy_mib=1.0, mm_n=16,
    )  # fmt: skip
    doc = collect(opts, ["bench"], timer=timer, progress=None)
    records.validate(doc, "collect")
    return doc, timer


def test_a_main_grad_candidates_gemm_backward_rows_carry_the_second_peer(tmp_path: Path) -> None:
    doc, timer = _collect(tmp_path, "portable_cpu", ("det_gemm", "lm_head"))
    bwd = [r for r in doc["rows"] if r["phase"] == "bwd"]
    assert [(r["op"], r["shape"]) for r in bwd] == [("det_gemm", "o"), ("lm_head", "lm_head")]
    for r in bwd:
        assert r["param_grad_rule"] == "sample_blocks_main_grad"
        pm = r["peer_main_grad"]
        assert pm["ms"] == 1.5 and pm["ratio"] == pytest.approx(1.5 / 2.0) and pm["error"] is None
        assert r["ratio"] == pytest.approx(0.5)  # the verdict's ratio stays against the first peer
    assert timer.labels.count("peer_main_grad") == 2
    assert all(r["peer_main_grad"] is None for r in doc["rows"] if r["phase"] == "fwd")


def test_control_an_autograd_candidate_and_an_op_without_the_peer_get_none(tmp_path: Path) -> None:
    doc, timer = _collect(tmp_path, "native_torch", ("det_gemm",))
    assert [r["param_grad_rule"] for r in doc["rows"]] == ["autograd_accumulate"] * 2
    doc2, timer2 = _collect(tmp_path, "portable_cpu", ("logp",))  # main_grad profile, op with no weight
    assert all(r["peer_main_grad"] is None for r in doc["rows"] + doc2["rows"])
    assert "peer_main_grad" not in timer.labels + timer2.labels
    assert "## Backward against a peer" not in records.render_markdown(doc)


def test_an_error_in_the_second_peer_leaves_the_row_and_its_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(t: dict, p: object) -> torch.Tensor:
        raise RuntimeError("second peer broken on purpose")

    case = cases.CASES["det_gemm"]
    monkeypatch.setitem(cases.CASES, "det_gemm", type(case)(**{**case.__dict__, "stock_main_grad": broken}))
    doc, _ = _collect(tmp_path, "portable_cpu", ("det_gemm",))
    bwd = doc["rows"][1]
    assert bwd["status"] == "ok" and bwd["ratio"] == pytest.approx(0.5) and bwd["target_met"] is not None
    assert bwd["peer_main_grad"]["ms"] is None and bwd["peer_main_grad"]["ratio"] is None
    assert "second peer broken on purpose" in bwd["peer_main_grad"]["error"]
    assert "error: RuntimeError: second peer broken on purpose" in records.render_markdown(doc)


def test_the_markdown_shows_both_ratios(tmp_path: Path) -> None:
    doc, _ = _collect(tmp_path, "portable_cpu", ("det_gemm",))
    md = records.render_markdown(doc)
    assert "## Backward against a peer that accumulates into fp32 main_grad" in md
    assert "| det_gemm | o | 1 | 2.0000 | 1.0000 | 0.50 | 1.5000 | 0.75 |  |" in md


# ---------------------------------------------------------------------------------------------- CUDA form


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_the_peer_is_one_in_place_fp32_addmm() -> None:
    """On CUDA the peer's dW is cuBLAS's addmm with out_dtype fp32 into main_grad itself (beta = 1): main_grad
    holds the product summed twice (integer operands: exact in any order)."""
    x, w, dy = _gemm_operands("cuda")
    dx, mg = _run_peer(x, w, dy, calls=2)
    assert mg.dtype == torch.float32
    # integers: exact in fp32 whatever cuBLAS's order, so equal to the float64 product
    assert torch.equal(mg.double(), (dy.t().double() @ x.double()) * 2)
    assert torch.equal(dx.double(), dy.double() @ w.double())
