"""Make the shared test support importable as ``kernels_support`` (tests/ws1_kernels is not a package)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402


@pytest.fixture
def seq_dot(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tl.dot`` = the accumulator plus each k's products in ascending k (restored after the test)."""
    from kernels_support import sequential_dot
    from triton.runtime import interpreter as interp

    monkeypatch.setattr(interp.InterpreterBuilder, "create_dot", sequential_dot)


@pytest.fixture(scope="module")
def rollout_model_and_fixture():  # type: ignore[no-untyped-def]
    """(the tiny model cut to one layer on portable_cpu, the primary tier's fixture): the rollout engine's tests."""
    import dataclasses

    pytest.importorskip("transformers")
    from ws1_kernels.integrations import qwen3
    from ws1_workload import build_fixture, load_manifest, synthetic_weights, tensor_shapes

    m = load_manifest()
    cfg = dataclasses.replace(m.model("tiny"), num_layers=1)
    weights = synthetic_weights(m, "tiny", names=tensor_shapes(cfg))
    model = qwen3.build_model(qwen3.qwen3_config(cfg), weights, "portable_cpu")
    return model, build_fixture(m, "primary", "tiny")


@pytest.fixture(scope="module")
def triton_fp32_small() -> tuple:  # type: ignore[type-arg]
    """(config, weights): the tiny model cut to one layer and a 640-token vocabulary. The interpreter runs the
    lm_head in Python: at the tiny model's 5000 tokens it was most of each step's time."""
    import dataclasses as dc

    from ws1_workload import load_manifest, synthetic_weights, tensor_shapes

    m = load_manifest()
    cfg = dc.replace(m.model("tiny"), num_layers=1, vocab=640)
    weights = synthetic_weights(m, "tiny", names=tensor_shapes(cfg))  # the tiny model's: 5000 vocab rows
    vocab_rows = ("model.embed_tokens.weight", "lm_head.weight")
    return cfg, {k: (v[: cfg.vocab].clone() if k in vocab_rows else v) for k, v in weights.items()}


@pytest.fixture(scope="module")
def triton_fp32_model(triton_fp32_small):  # type: ignore[no-untyped-def]
    """The drop-in on ``triton_cuda_bf16``'s kernels with fp32 CPU tensors: the judged path of these tests.

    fp32 because the interpreter's bf16 ``tl.dot`` is not faithful (it returns values off by orders of
    magnitude, so bf16 logits would be noise and every logprob 0). The candidates that take bf16 only
    (det_gemm, lm_head, attention, logp) are replaced by their fp32 twins: the same entry points with
    ``allow_fp32``, so the same validation, tables and kernels. The registry refuses a CUDA profile on the CPU
    (fail-closed); that refusal is lifted while the candidates are resolved, and only then."""
    import torch

    from ws1_kernels import registry
    from ws1_kernels.integrations import qwen3
    from ws1_kernels.triton_ops import attention as att
    from ws1_kernels.triton_ops import gemm, logprob

    cfg, weights = triton_fp32_small
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "_device_reason", lambda cand, device: None)
        m = qwen3.build_model(qwen3.qwen3_config(cfg), weights, "triton_cuda_bf16", dtype=torch.float32)
    fns = qwen3.runtime_of(m).fns
    fns["det_gemm"] = lambda x, w, ctx: gemm.linear("fp32 twin", x, w, ctx, allow_fp32=True)
    fns["lm_head"] = fns["det_gemm"]
    fns["attention"] = lambda q, k, v, scale, ctx: att._attention(q, k, v, scale, ctx, allow_fp32=True)
    fns["logp"] = lambda logits, t, ctx: logprob.logp_apply("fp32 twin", logits, t, ctx, allow_fp32=True)
    return m
