"""The stock decode peer of `ws1 bench --op decode_step` (bench/decode_graph.py), on the CPU without graphs.

The peer is transformers' own Qwen3 with a StaticCache at one decode position. Its logprob must be the model's:
with the cache filled from a real prefill of the first C tokens, the decode at position C gives the full
forward's logprob there (fp32, 1e-4). The control fills the cache with another request's keys and must miss."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("transformers")

from ws1_harness.run.bench import decode_graph as dg  # noqa: E402

B, C = 3, 7


@pytest.fixture(scope="module")
def stock_and_prefill():  # type: ignore[no-untyped-def]
    from transformers import DynamicCache

    from ws1_kernels.integrations import qwen3
    from ws1_workload import load_manifest, synthetic_weights, tensor_shapes

    m = load_manifest()
    cfg = dataclasses.replace(m.model("tiny"), num_layers=2)
    weights = {k: v.float() for k, v in synthetic_weights(m, "tiny", names=tensor_shapes(cfg)).items()}
    model = dg.stock_model(qwen3.qwen3_config(cfg), weights, "cpu")
    ids = torch.randint(0, int(cfg.vocab), (B, C + 1), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, int(cfg.vocab), (B,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=ids).logits[:, C].float(), -1).gather(1, targets[:, None])[
            :, 0
        ]
        dc = DynamicCache(config=model.config)
        model(input_ids=ids[:, :C], past_key_values=dc, use_cache=True)
    # [B, Hkv, C, D] -> the sides' [B, C, Hkv, D]
    kv = [(layer.keys.transpose(1, 2), layer.values.transpose(1, 2)) for layer in dc.layers]
    return model, ids, targets, full, kv


def test_the_stock_peer_decodes_the_models_logprob(stock_and_prefill) -> None:  # type: ignore[no-untyped-def]
    model, ids, targets, full, kv = stock_and_prefill
    side = dg.stock_side(model, B, C, targets, graphs=False, ids=ids[:, C], kv=lambda i: kv[i])
    assert side.record["cache"] == "StaticCache" and side.record["mode"] == "eager"
    assert float((side.call() - full).abs().max()) < 1e-4


def test_a_stock_peer_on_another_requests_keys_misses(stock_and_prefill) -> None:  # type: ignore[no-untyped-def]
    model, ids, targets, full, kv = stock_and_prefill
    rolled = [(k.roll(1, 0), v.roll(1, 0)) for k, v in kv]
    side = dg.stock_side(model, B, C, targets, graphs=False, ids=ids[:, C], kv=lambda i: rolled[i])
    assert float((side.call() - full).abs().max()) > 1e-3


def test_every_call_decodes_the_same_position(stock_and_prefill) -> None:  # type: ignore[no-untyped-def]
    """A timed loop (a graph replay) calls the step again and again: each call must decode position C."""
    model, ids, targets, full, kv = stock_and_prefill
    side = dg.stock_side(model, B, C, targets, graphs=False, ids=ids[:, C], kv=lambda i: kv[i])
    first, second = side.call(), side.call()
    assert torch.equal(first, second) and float((second - full).abs().max()) < 1e-4


def test_a_cache_whose_length_runs_on_is_seen(stock_and_prefill, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The control: without resetting the static layers' running length, the second call is not the first
    (this transformers writes at that length) or fails outright (past the cache)."""
    model, ids, targets, full, kv = stock_and_prefill
    probe = dg.fill_static_cache(
        model, B, C + 1, lambda i: (kv[i][0].transpose(1, 2), kv[i][1].transpose(1, 2))
    )
    if not hasattr(probe.layers[0], "cumulative_length"):
        pytest.skip("this transformers writes a static cache at cache_position: nothing runs on")
    side = dg.stock_side(model, B, C, targets, graphs=False, ids=ids[:, C], kv=lambda i: kv[i])
    monkeypatch.setattr(dg, "set_static_length", lambda cache, length: None)
    first = side.call()
    try:
        second = side.call()
    except (IndexError, RuntimeError):
        return
    assert not torch.equal(first, second)


def test_the_peer_check_passes_the_stock_graph_and_names_each_weakening(stock_and_prefill) -> None:  # type: ignore[no-untyped-def]
    from ws1_harness.run.bench.steps import graph_peer_problems

    model = stock_and_prefill[0]
    good = {"cache": "StaticCache", "mode": "cuda_graph"}
    assert graph_peer_problems(model, good) == []
    assert graph_peer_problems(model, {**good, "cache": "DynamicCache"}) == [
        "the peer's cache is 'DynamicCache', not StaticCache"
    ]
    assert graph_peer_problems(model, {**good, "mode": "eager"}) == ["the peer ran 'eager', not a CUDA graph"]


class _NoProfiler:
    """torch's profiler stand-in on a CPU host (a CUDA-only profiler has nothing to record there)."""

    def __init__(self, **_kw: object) -> None:
        pass

    def __enter__(self) -> _NoProfiler:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def events(self) -> list[object]:
        return []


def _train_like() -> tuple[torch.Tensor, object]:
    w = torch.ones(3, requires_grad=True)

    def call() -> None:
        (w * 2).sum().backward()

    return w, call


def test_a_training_peer_is_observed_with_autograd_on(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from ws1_harness.run.bench import stock

    monkeypatch.setattr(torch.profiler, "profile", _NoProfiler)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    w, call = _train_like()
    assert stock.observed_cuda_kernels(call, grad=True) == []
    assert w.grad is not None and float(w.grad.sum()) == 6.0


def test_a_training_peer_observed_without_autograd_fails(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The control: the old observation (no_grad) cannot run a backward, which is what left the train_step row
    on the H200 without a peer."""
    from ws1_harness.run.bench import stock

    monkeypatch.setattr(torch.profiler, "profile", _NoProfiler)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    _, call = _train_like()
    with pytest.raises(RuntimeError, match="does not require grad"):
        stock.observed_cuda_kernels(call)


def _seen_during_call(model, read, **side_kwargs):  # type: ignore[no-untyped-def]
    """``read()`` at the start of the stock side's decode call (its cache's initialising call left out): (the
    logprobs, what was read, the side's record)."""
    seen: list[object] = []
    handle = model.register_forward_pre_hook(lambda _m, _a: seen.append(read()))
    try:
        side = dg.stock_side(model, B, C, side_kwargs.pop("targets"), graphs=False, **side_kwargs)
        seen.clear()  # the cache's initialising call
        out = side.call()
    finally:
        handle.remove()
    return out, seen, side.record


def _env_during_calls(model, **side_kwargs):  # type: ignore[no-untyped-def]
    import os

    out, seen, _ = _seen_during_call(model, lambda: os.environ.get(dg.FORCE_GQA_ENV), **side_kwargs)
    return out, seen


def test_the_forced_gqa_peer_runs_with_transformers_switch_on(stock_and_prefill, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The stronger stock (SDPA's own grouped-query attention) runs with the switch set during its call only, and
    still decodes the model's logprob; the control: the default peer runs with it unset."""
    model, ids, targets, full, kv = stock_and_prefill
    monkeypatch.delenv(dg.FORCE_GQA_ENV, raising=False)
    out, seen = _env_during_calls(model, targets=targets, ids=ids[:, C], kv=lambda i: kv[i], force_gqa=True)
    assert seen == ["1"] and float((out - full).abs().max()) < 1e-4
    import os

    assert dg.FORCE_GQA_ENV not in os.environ  # restored after the call
    out, seen = _env_during_calls(model, targets=targets, ids=ids[:, C], kv=lambda i: kv[i])
    assert seen == [None]


def _cudnn_sdp_during_call(model, **side_kwargs):  # type: ignore[no-untyped-def]
    return _seen_during_call(model, torch.backends.cuda.cudnn_sdp_enabled, **side_kwargs)


def test_the_peer_without_cudnn_runs_with_cudnn_sdpa_off(stock_and_prefill) -> None:  # type: ignore[no-untyped-def]
    """The variant leaves cuDNN's SDPA out during its call only, records so, and still decodes the model's logprob;
    the control: the default peer's call runs with torch's default selection (cuDNN allowed)."""
    model, ids, targets, full, kv = stock_and_prefill
    assert torch.backends.cuda.cudnn_sdp_enabled()
    out, seen, record = _cudnn_sdp_during_call(
        model, targets=targets, ids=ids[:, C], kv=lambda i: kv[i], no_cudnn=True
    )
    assert seen == [False] and float((out - full).abs().max()) < 1e-4
    assert "MATH" in record["sdpa_backends"] and torch.backends.cuda.cudnn_sdp_enabled()  # restored
    out, seen, record = _cudnn_sdp_during_call(model, targets=targets, ids=ids[:, C], kv=lambda i: kv[i])
    assert seen == [True] and record["sdpa_backends"] == "torch's default selection"


def test_every_decode_row_times_the_peer_without_cudnn(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from ws1_harness.run.bench.steps import peer_variants

    monkeypatch.setattr(dg, "forced_gqa_supported", lambda: False)
    assert peer_variants() == ("default", "sdpa_no_cudnn")
    monkeypatch.setattr(dg, "forced_gqa_supported", lambda: True)
    assert peer_variants() == ("default", "sdpa_no_cudnn", "sdpa_gqa")


def test_the_switch_restores_a_value_the_caller_set(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import os

    monkeypatch.setenv(dg.FORCE_GQA_ENV, "0")
    with dg.sdpa_gqa(True):
        assert os.environ[dg.FORCE_GQA_ENV] == "1"
    assert os.environ[dg.FORCE_GQA_ENV] == "0"
    with dg.sdpa_gqa(False):
        assert dg.FORCE_GQA_ENV not in os.environ
    assert os.environ[dg.FORCE_GQA_ENV] == "0"


def test_the_row_is_judged_against_the_faster_peer_that_ran() -> None:
    from ws1_harness.run.bench.steps import StepSide, faster_peer

    assert faster_peer({"default": StepSide(ms=9.0), "sdpa_gqa": StepSide(ms=4.0)}) == "sdpa_gqa"
    assert faster_peer({"default": StepSide(ms=3.0), "sdpa_gqa": StepSide(ms=4.0)}) == "default"
    # a variant that failed is never the peer, however fast its partial figure
    assert faster_peer({"default": StepSide(ms=9.0), "sdpa_gqa": StepSide(ms=1.0, error="oom")}) == "default"
    assert faster_peer({"default": StepSide(error="oom")}) == "default"


def test_the_variant_is_found_where_transformers_can_be_told(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A release that reads the switch, or one that asks the decider (5.17, on the device, lacks the switch): the
    variant runs. The control: a module with neither gives one peer. Judged on planted modules, so the verdict does
    not depend on the installed release."""
    from types import SimpleNamespace

    def planted(source: str, **attrs: object) -> None:
        monkeypatch.setattr(dg, "_sdpa_module", lambda: SimpleNamespace(**attrs))
        monkeypatch.setattr(dg.inspect, "getsource", lambda _m: source)

    planted(f'os.environ.get("{dg.FORCE_GQA_ENV}", "0")')
    assert dg.forced_gqa_supported()
    planted("return attention_mask is None", **{dg.GQA_DECIDER: lambda mask, key: mask is None})
    assert dg.forced_gqa_supported()
    planted("return attention_mask is None")  # the control
    assert not dg.forced_gqa_supported()


def test_the_decider_answers_yes_during_the_forced_call_only(stock_and_prefill, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """In the variant's call transformers' decider is the variant's (so a release without the switch runs SDPA's
    grouped-query attention too), and the logprob is still the model's; the control: the default call asks the
    release's own decider, which is back after the forced call."""
    from transformers.integrations import sdpa_attention

    model, ids, targets, full, kv = stock_and_prefill
    own = getattr(sdpa_attention, dg.GQA_DECIDER)
    monkeypatch.delenv(dg.FORCE_GQA_ENV, raising=False)

    def call(**forced: bool):  # type: ignore[no-untyped-def]
        read = lambda: getattr(sdpa_attention, dg.GQA_DECIDER)  # noqa: E731
        return _seen_during_call(model, read, targets=targets, ids=ids[:, C], kv=lambda i: kv[i], **forced)

    out, seen, record = call(force_gqa=True)
    assert seen == [dg._always_gqa] and float((out - full).abs().max()) < 1e-4
    assert dg.GQA_DECIDER in record["gqa"] and getattr(sdpa_attention, dg.GQA_DECIDER) is own
    _, seen, _ = call()
    assert seen == [own]


def test_the_top_kernels_are_ranked_by_device_time() -> None:
    """The decode rows record where a step's device time goes (`stock.rank_kernels` over the profiler's averages):
    device kernels by total time, host-only entries left out. The control: a host entry with a large CPU time and
    no device time is not ranked."""
    from types import SimpleNamespace as NS

    from ws1_harness.run.bench.stock import rank_kernels

    cuda, cpu = NS(name="CUDA"), NS(name="CPU")
    avgs = [
        NS(key="aten::copy_", device_time_total=0.0, device_type=cpu, count=40, cpu_time_total=9e6),
        NS(key="elementwise_copy_kernel", device_time_total=3000.0, device_type=cuda, count=72),
        NS(key="cudnn_sdpa_fprop", device_time_total=1200.5, device_type=cuda, count=36),
        NS(key="gemv", device_time_total=5000.0, device_type=cuda, count=253),
    ]
    ranked = rank_kernels(avgs, top=2)
    assert ranked == [
        {"name": "gemv", "us": 5000.0, "calls": 253},
        {"name": "elementwise_copy_kernel", "us": 3000.0, "calls": 72},
    ]
    assert "aten::copy_" not in [r["name"] for r in rank_kernels(avgs, top=8)]
