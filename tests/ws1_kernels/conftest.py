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
