"""`ws1 chain`: rollout against trainer on the whole (tiny, one-layer) model, each judgment with its negative control.

In process, the short tier, one layer. Planted candidates wrap the portable ones so that exactly one property
breaks: a batch-variant forward (parity), a batch-variant backward (gradient invariance), a consistent but wrong
forward (logprob accuracy).
"""

from __future__ import annotations

import json

import pytest
import teeth_profiles as tp
import torch

pytest.importorskip("transformers")

from ws1_harness.cli import main  # noqa: E402
from ws1_harness.run.chain import Chain, ChainSettings  # noqa: E402
from ws1_kernels import portable  # noqa: E402
from ws1_kernels.integrations import qwen3  # noqa: E402

BUMP = 1.0 + 2.0**-6  # a bf16-visible relative change


@pytest.fixture(scope="module")
def chain() -> Chain:
    return Chain(ChainSettings(profile="portable_cpu", model="tiny", layers=1, tiers=("short",)))


def _judgment(cell, name):
    return next(j for j in cell.judgments if j.name == name)


def _planted(chain: Chain, operator: str, fn, label: str):
    model = chain.model()
    qwen3.runtime_of(model).override(operator, fn, label)
    return chain.cell("short", model=model)


def row_count_gemm(x, weight, ctx):
    """Batch-variant: the output depends on whether the call has an odd number of rows."""
    out = portable.det_gemm(x, weight, ctx)
    return out * BUMP if x.shape[0] % 2 else out


def row_count_backward_norm(x, weight, eps, ctx):
    """Forward exact, backward batch-variant: the gradient is bumped in calls of an odd number of rows."""
    return tp.ScaleGrad.apply(portable.rms_norm(x, weight, eps, ctx), BUMP if x.shape[0] % 2 else 1.0)


def wrong_swiglu(gate, up, ctx):
    """Batch-invariant but wrong: gate * up without the SiLU."""
    return (gate.float() * up.float()).to(torch.bfloat16)


def test_portable_chain_passes_with_exact_parity(chain):
    cell = chain.cell("short")
    assert cell.status == "green", cell.to_json()
    parity = _judgment(cell, "parity")
    assert {r["max_abs_dlogp"] for r in parity.detail["layouts"].values()} == {0.0}
    assert all(r["bitwise_equal"] for r in parity.detail["layouts"].values())
    assert set(parity.detail["layouts"]) == {s.name for s in chain.training}  # every training layout
    assert cell.rollout["requests_joined_after_step_0"]  # the rollout really batched continuously
    assert cell.first_divergence is None


def test_a_batch_variant_candidate_fails_parity_at_its_node(chain):
    cell = _planted(chain, "det_gemm", row_count_gemm, "row-count gemm")
    assert "parity" in cell.failed
    d = cell.first_divergence
    assert d["judgment"] == "parity" and d["operator"] == "det_gemm" and d["layer"] == 0
    assert d["phase"] == "forward" and d["token"][0] >= 0


def test_a_batch_variant_backward_fails_gradient_invariance_only(chain):
    cell = _planted(chain, "rms_norm", row_count_backward_norm, "row-count norm backward")
    assert cell.failed == ("gradient_invariance", "op_watch")  # the wrapper is also an undeclared op
    d = cell.first_divergence
    assert d["judgment"] == "gradient_invariance" and d["phase"] == "backward"
    assert d["node"].startswith("model.layers.0.")


def test_a_wrong_but_invariant_candidate_fails_logprob_accuracy(chain):
    cell = _planted(chain, "swiglu", wrong_swiglu, "swiglu without silu")
    assert "logprob_accuracy" in cell.failed and "parity" not in cell.failed
    assert cell.first_divergence["judgment"] == "logprob_accuracy"
    assert cell.first_divergence["node"] is None  # the matrix judges each operator's own accuracy
    assert "gradient_accuracy" in cell.failed  # the wrong forward carries into every gradient too


def scaled_backward_norm(x, weight, eps, ctx):
    """Forward exact and batch-invariant, backward 10 % too large: only the gradients are wrong."""
    return tp.ScaleGrad.apply(portable.rms_norm(x, weight, eps, ctx), 1.1)


def test_a_wrong_but_invariant_backward_fails_gradient_accuracy(chain):
    cell = _planted(chain, "rms_norm", scaled_backward_norm, "rms_norm backward x1.1")
    assert cell.failed == ("gradient_accuracy", "op_watch")  # the wrapper is also an undeclared op
    grad = _judgment(cell, "gradient_accuracy")
    worst = max(p["rel_l2"] for p in grad.detail["parameters"].values())
    assert worst > grad.detail["thresholds"]["grad_rel_l2"]
    assert cell.first_divergence["judgment"] == "gradient_accuracy"


def test_a_correct_chain_is_within_the_chain_gradient_thresholds(chain):
    grad = _judgment(chain.cell("short"), "gradient_accuracy")
    th = grad.detail["thresholds"]
    assert grad.judged and grad.passed
    for row in grad.detail["parameters"].values():
        assert 0 < row["rel_l2"] <= th["grad_rel_l2"] and row["rel_max_abs"] <= th["grad_rel_max_abs"]


def test_native_torch_fails_with_its_first_diverging_node():
    cell = Chain(ChainSettings(profile="native_torch", model="tiny", layers=1, tiers=("short",))).cell(
        "short"
    )
    assert cell.status == "red" and "parity" in cell.failed
    assert not _judgment(cell, "op_watch").judged  # stock: recorded, not judged
    d = cell.first_divergence
    assert d["node"] and d["operator"] and d["layer"] == 0 and len(d["token"]) == 2


def test_cli_writes_the_result_and_exits_zero_on_pass(tmp_path, capsys):
    argv = ["chain", "--profile", "portable_cpu", "--layers", "1", "--tier", "short", "--out", str(tmp_path)]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "chain-portable_cpu-tiny-L1.json").read_text())  # a ws1 evidence file
    assert doc["finalised"] and doc["cells"] == [] and doc["chain_cells_digest"].startswith("sha256:")
    assert doc["provenance"]["git_commit"] and doc["contract"]["fingerprint"].startswith("sha256:")
    assert [(c["tier"], c["status"]) for c in doc["chain_cells"]] == [("short", "green")]
    # the recorded command names no machine path (the out folder is a tmp dir: its absolute path must not appear)
    assert str(tmp_path) not in doc["command"] and "--out" in doc["command"]
    # never overwritten silently
    assert main(argv) == 2
    assert "exists" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tier", "nope"], "unknown tier"),
        (["--layers", "9"], "--layers 9"),
        (["--model", "nope"], "unknown model"),
    ],
)
def test_cli_bad_input_exits_two_with_one_line(tmp_path, capsys, extra, message):
    assert main(["chain", "--profile", "portable_cpu", "--out", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_on_host_moves_every_gradient_with_its_bits_and_keeps_absent_ones():
    """The 36-layer run moves the packed layout's gradients off the device before the fp32 reference: the
    figures computed afterwards must see the same bits, and an absent gradient must stay absent (it fails)."""
    from ws1_harness.run.chain import TrainRun, gradient_figures, on_host

    g = torch.tensor([1.0, -0.0, 3.5e-8, float("nan")])
    run = TrainRun("packed", torch.zeros(2), {"w": g, "missing": None})
    moved = on_host(run)
    assert moved.grads["missing"] is None
    assert moved.grads["w"].device.type == "cpu"
    assert torch.equal(moved.grads["w"].view(torch.int32), g.view(torch.int32))
    assert moved.logprobs is run.logprobs and moved.layout == "packed"
    # a negative control: the moved gradient is judged, not skipped: its NaN still makes it non-finite
    assert gradient_figures(moved.grads["w"], torch.ones(4))["finite"] is False


def _reference_run(chain: Chain, spec_name: str, *, on_host_: bool, scale: float = 1.0):
    from ws1_harness.run import chain_train
    from ws1_kernels.integrations import qwen3 as q3
    from ws1_workload import build_fixture

    fx = build_fixture(chain.manifest, "short", "tiny")
    spec = next(s for s in chain.training if s.name == spec_name)
    model = chain.reference_model()
    run = chain_train.train(model, fx, spec, chain.upstream(fx) * scale, device="cpu", grads_on_host=on_host_)
    left_on_params = [n for n, g in q3.param_grads(model).items() if g is not None]
    return run, left_on_params


@pytest.mark.parametrize("layout", ["packed", "split_1"])
def test_reference_gradients_moved_as_they_arrive_keep_their_bits(chain, layout):
    """The fp32 reference's gradients go to the host during the backward (summed there across the calls of a
    layout of several calls): the same bits as gradients left on the parameters, and nothing left on the device.
    The control: another upstream gradient gives other bits, so the equality is not vacuous."""
    from ws1_harness.run.chain_train import same_bits

    kept, on_params = _reference_run(chain, layout, on_host_=False)
    moved, left = _reference_run(chain, layout, on_host_=True)
    assert on_params and left == []
    assert kept.grads.keys() == moved.grads.keys()
    for name, g in kept.grads.items():
        assert g is not None and moved.grads[name] is not None, name
        assert moved.grads[name].device.type == "cpu"
        assert same_bits(moved.grads[name], g), name
    other, _ = _reference_run(chain, layout, on_host_=True, scale=0.5 + 2.0**-10)
    assert not all(same_bits(other.grads[n], g) for n, g in kept.grads.items())


def test_the_packed_gradients_wait_on_the_host_and_invariance_still_sees_a_flip(chain):
    """Each layout is compared with the packed layout's gradients one parameter at a time, the packed ones on the
    host (`on_host`). The control: one flipped bit in one parameter is found."""
    from ws1_harness.run.chain_train import TrainRun, grad_invariance, on_host

    g = torch.linspace(-1, 1, 64)
    packed = on_host(TrainRun("packed", torch.zeros(1), {"a": g.clone(), "b": g.clone()}))
    same = TrainRun("split_1", torch.zeros(1), {"a": g.clone(), "b": g.clone()})
    assert grad_invariance(packed, same) == {"a": True, "b": True}
    flipped = g.clone()
    flipped.view(torch.int32)[7] ^= 1
    assert grad_invariance(packed, TrainRun("split_1", torch.zeros(1), {"a": g.clone(), "b": flipped})) == {
        "a": True,
        "b": False,
    }
