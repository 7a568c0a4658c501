"""The stock packed training call of `ws1 bench --op train_step` (bench/stock.py), on the CPU.

The peer is transformers' own Qwen3 on one packed row with varlen attention (torch's flash varlen kernel on a
GPU; here the same function by one SDPA per sample). Its logits must be each sample's own: the packed call
equals every sample run alone (fp32, 1e-4), and a sample bound moved by one token must break that. The
argument shim for torch's `varlen_attn` is checked against both signatures torch has shipped."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("transformers")

from ws1_harness.run.bench import stock  # noqa: E402

LENGTHS = (5, 3, 7)


@pytest.fixture(scope="module")
def model_and_ids():  # type: ignore[no-untyped-def]
    from ws1_kernels.integrations import qwen3
    from ws1_workload import load_manifest, synthetic_weights, tensor_shapes

    m = load_manifest()
    cfg = dataclasses.replace(m.model("tiny"), num_layers=2)
    weights = {k: v.float() for k, v in synthetic_weights(m, "tiny", names=tensor_shapes(cfg)).items()}
    model = stock.stock_model(qwen3.qwen3_config(cfg), weights, "cpu", attn=stock.PER_SAMPLE)
    ids = torch.randint(0, int(cfg.vocab), (sum(LENGTHS),), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        alone = []
        for a, n in zip((0, 5, 8), LENGTHS, strict=True):
            ref = stock.stock_model(qwen3.qwen3_config(cfg), weights, "cpu", attn="eager")
            alone.append(ref(input_ids=ids[None, a : a + n]).logits[0])
    return model, ids, torch.cat(alone)


def test_the_packed_stock_call_gives_each_samples_own_logits(model_and_ids) -> None:  # type: ignore[no-untyped-def]
    model, ids, alone = model_and_ids
    with torch.no_grad():
        got = model(input_ids=ids[None], **stock.packed_kwargs(LENGTHS, "cpu")).logits[0]
    assert float((got - alone).abs().max()) < 1e-4


def test_a_sample_bound_one_token_off_is_seen(model_and_ids) -> None:  # type: ignore[no-untyped-def]
    model, ids, alone = model_and_ids
    kw = stock.packed_kwargs(LENGTHS, "cpu")
    kw["cu_seq_lens_q"] = kw["cu_seq_lens_k"] = torch.tensor([0, 6, 8, 15])
    with torch.no_grad():
        got = model(input_ids=ids[None], **kw).logits[0]
    assert float((got - alone).abs().max()) > 1e-3


def _qkv(hq: int = 4, hkv: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    t, d = 6, 8
    return (torch.randn(t, hq, d, generator=g), torch.randn(t, hkv, d, generator=g),
            torch.randn(t, hkv, d, generator=g), torch.tensor([0, 2, 6]))  # fmt: skip


def test_the_varlen_shim_speaks_the_older_signature() -> None:
    seen: dict = {}

    def old(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, return_aux=None):  # type: ignore[no-untyped-def]
        seen.update(k_heads=k.shape[1], is_causal=is_causal, cu_dtype=cu_q.dtype, max_q=max_q)
        return q

    q, k, v, cu = _qkv()
    stock.varlen_call(old, q, k, v, cu, 4, 8**-0.5)
    assert seen == {"k_heads": 4, "is_causal": True, "cu_dtype": torch.int32, "max_q": 4}


def test_the_varlen_shim_speaks_the_newer_signature() -> None:
    seen: dict = {}

    def new(
        q,
        k,
        v,
        cu_q,
        cu_k,
        max_q,
        max_k,
        *,
        return_aux=None,
        scale=None,
        window_size=(-1, -1),
        enable_gqa=False,
    ):  # type: ignore[no-untyped-def]
        seen.update(k_heads=k.shape[1], window=window_size, gqa=enable_gqa, scale=scale)
        return q

    q, k, v, cu = _qkv()
    stock.varlen_call(new, q, k, v, cu, 4, 0.25)
    assert seen == {"k_heads": 2, "window": (-1, 0), "gqa": True, "scale": 0.25}


def test_a_varlen_without_a_causal_argument_is_refused() -> None:
    def bare(q, k, v, cu_q, cu_k, max_q, max_k):  # type: ignore[no-untyped-def]
        return q

    q, k, v, cu = _qkv()
    with pytest.raises(RuntimeError, match="neither is_causal nor window_size"):
        stock.varlen_call(bare, q, k, v, cu, 4, 8**-0.5)


class _OnceTimer:
    name = "once"

    def __call__(self, fn, *, grad_to_none=(), label=""):  # type: ignore[no-untyped-def]
        fn()
        return 1.0


def _train_row(attn: str):  # type: ignore[no-untyped-def]
    from ws1_harness.run.bench import steps as ST
    from ws1_workload import load_manifest

    cfg = load_manifest().model("tiny")
    models = ST.build_models("portable_cpu", cfg, 1, "cpu")
    p = ST.StepPoint("train_step", 12, 1, lengths=(5, 7))
    return ST.measure_point(
        "portable_cpu", "cpu", _OnceTimer(), models, p, ST.stock_kernel_ids(), stock_train=attn
    )


def test_a_train_row_with_the_stock_packed_peer_runs_and_records_it() -> None:
    """The peer side runs (forward and backward on the packed row) and the row says what it was; on the CPU
    its attention is the per-sample stand-in, which the peer check refuses (never a ratio against it)."""
    row = _train_row(stock.PER_SAMPLE)
    assert row.candidate_ms == 1.0 and row.peer_ms == 1.0
    assert row.step["peer_attention"]["implementation"] == stock.PER_SAMPLE
    assert "not torch's varlen flash attention" in row.errors["peer_path"] and row.status == "error"


def test_the_stock_train_check_passes_varlen_flash_and_names_the_rest() -> None:
    from ws1_harness.run.bench.steps import stock_train_problems

    m = torch.nn.Linear(1, 1)
    assert stock_train_problems(m, stock.VARLEN, ["flash_fwd_kernel<...>"], "cuda") == []
    assert stock_train_problems(m, stock.VARLEN, ["fmha_cutlassF"], "cuda") == [
        "no flash attention kernel observed in the peer's call"
    ]
    m.ws1_runtime = object()  # type: ignore[assignment]
    assert stock_train_problems(m, stock.VARLEN, ["flash"], "cuda") == [
        "the peer model is swapped onto ws1 candidates"
    ]
