"""The step ops' C++ path (``csrc/launch/ws1_launch.cpp`` through ``triton_ops.native``) on the GPU: a replayed
call gives its Python twin's bits, the step scenario (eager, compiled, graph) gives the packed forward's bits on
replays, an observation takes the Python path, and a recipe that disagrees with the compiled kernel is refused.

Needs the module built (``python csrc/launch/setup.py build_ext --build-lib <dir>``) and on the path; the CPU side
of the recording is `test_step_native.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from cuda_only import skip_module_without_cuda

pytestmark = [pytest.mark.gpu, pytest.mark.needs_build, pytest.mark.launch_ext]

skip_module_without_cuda("triton", "transformers")

import torch  # noqa: E402
from step_support import gpu_model, step_mismatches  # noqa: E402

from ws1_kernels import launches  # noqa: E402
from ws1_kernels.integrations.step import step_ops  # noqa: E402
from ws1_kernels.triton_ops import native  # noqa: E402
from ws1_kernels.triton_ops import step_ops as _registers_the_ops  # noqa: E402, F401

PROFILE = "triton_cuda_bf16"
OPS = torch.ops.ws1_triton


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _bf(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed), device="cuda", dtype=torch.bfloat16)


#: per step op, its arguments at M rows
INPUTS: dict[str, Callable[[int], tuple[Any, ...]]] = {
    "embedding": lambda m: (
        torch.randint(0, 1000, (m,), generator=_gen(m), device="cuda"),
        _bf(1000, 512, seed=1),
    ),
    "norm": lambda m: (_bf(m, 4096, seed=m), _bf(4096, seed=2), 1e-6),
    "linear": lambda m: (_bf(m, 4096, seed=m), _bf(1024, 4096, seed=3)),
    "swiglu": lambda m: (_bf(m, 12288, seed=m), _bf(m, 12288, seed=m + 1)),
    # rope passes its cos/sin table (a scratch buffer of the call) and the inverse-frequency table (a constant)
    "rope": lambda m: (_bf(m, 8, 128, seed=m), torch.arange(m, device="cuda"), 1e6),
    # rope in two parts: the table alone (the inverse-frequency constant, its int dim as a key), then the rotation
    "rope_angles": lambda m: (torch.arange(m, device="cuda") * 3, 1e6, 128),
    "rope_rotate": lambda m: (
        _bf(m, 8, 128, seed=m),
        torch.randn(m, 2, 64, generator=_gen(m + 7), device="cuda", dtype=torch.float32),
    ),
    # logp passes its log-sum-exp buffer (scratch) besides the output
    "logp": lambda m: (
        _bf(m, 151936, seed=m),
        torch.randint(0, 151936, (m,), generator=_gen(m), device="cuda"),
    ),
}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def test_the_module_is_loaded_and_open() -> None:
    assert native.available(), (
        "ws1_launch_ext is not importable: build it (csrc/setup.py, WS1_MODULES=launch)"
    )
    assert native.stats()["blocked"] == 0


@pytest.mark.parametrize("m", [1, 5, 16])
@pytest.mark.parametrize("op", sorted(INPUTS))
def test_a_replay_gives_the_python_twin_bits(op: str, m: int) -> None:
    args = INPUTS[op](m)
    first = getattr(OPS, op)(*args)  # a miss: the twin runs and records
    hits = native.stats()["hits"]
    again = getattr(OPS, op)(*args)
    assert native.stats()["hits"] == hits + 1, torch.ops.ws1_launch.last_refusal()
    want = getattr(OPS, f"{op}_py")(*args)
    assert torch.equal(_bits(again), _bits(want)) and torch.equal(_bits(first), _bits(want))


def _fresh_rope(m: int, theta: float) -> tuple[Any, ...]:
    """rope at a key no other test uses (4 heads, its own theta), its tables not yet made."""
    return (_bf(m, 4, 128, seed=m), torch.arange(m, device="cuda"), theta)


def test_rope_replays_from_the_call_that_fills_its_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first call of a fresh key also fills the inverse-frequency table (host ops, a copy to the device): a
    cache fill, whose table is a constant, so the key is still replayable."""
    from ws1_kernels.triton_ops import pointwise

    monkeypatch.setattr(pointwise, "_INV_FREQ", {})
    args = _fresh_rope(9, 5e5)
    OPS.rope(*args)
    hits = native.stats()["hits"]
    out = OPS.rope(*args)
    assert native.stats()["hits"] == hits + 1, torch.ops.ws1_launch.last_refusal()
    assert torch.equal(_bits(out), _bits(OPS.rope_py(*args)))


def test_an_undeclared_table_keeps_rope_on_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control of the test above: the same fill with its table not declared a constant leaves a pointer the
    recording cannot place, so the key stays on the Python path, with the same bits."""
    from ws1_kernels.triton_ops import pointwise

    monkeypatch.setattr(pointwise, "_INV_FREQ", {})
    monkeypatch.setattr(native, "constant", lambda t: t)
    args = _fresh_rope(7, 2.5e5)
    OPS.rope(*args)
    assert "neither an input, the output" in torch.ops.ws1_launch.last_refusal()
    before = native.stats()
    out = OPS.rope(*args)
    after = native.stats()
    assert (after["hits"], after["python_only"]) == (before["hits"], before["python_only"] + 1)
    assert torch.equal(_bits(out), _bits(OPS.rope_py(*args)))


@pytest.mark.parametrize("mode", ["eager", "compiled", "graph"])
def test_the_step_scenario_on_replays_gives_the_packed_forward_bits(mode: str) -> None:
    hits = native.stats()["hits"]
    assert step_mismatches(gpu_model(PROFILE), step_ops(PROFILE), mode) == []
    assert native.stats()["hits"] > hits  # replays really ran


def test_an_observation_takes_the_python_path() -> None:
    args = INPUTS["linear"](7)
    OPS.linear(*args)
    hits = native.stats()["hits"]
    with launches.observe() as log:
        OPS.linear(*args)
    assert native.stats()["hits"] == hits and log.kernels == ["triton:ws1_gemm_fixed_k"]
    OPS.linear(*args)  # control: outside the observation, a replay
    assert native.stats()["hits"] == hits + 1


def test_a_recipe_the_kernel_disagrees_with_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real = native.recipe_for

    def wrong(*a: Any) -> native.LaunchRecipe:
        r = real(*a)
        r.kinds[0] = native.KIND_I32  # the kernel's first parameter is an 8-byte pointer
        return r

    monkeypatch.setattr(native, "recipe_for", wrong)
    args = INPUTS["linear"](37)
    OPS.linear(*args)
    assert "4 as recorded" in torch.ops.ws1_launch.last_refusal()
    before = native.stats()
    out = OPS.linear(*args)
    assert native.stats()["python_only"] == before["python_only"] + 1
    assert torch.equal(_bits(out), _bits(OPS.linear_py(*args)))
    monkeypatch.undo()  # control: the true recipe of another key is stored and replayed
    args = INPUTS["linear"](38)
    OPS.linear(*args)
    hits = native.stats()["hits"]
    OPS.linear(*args)
    assert native.stats()["hits"] == hits + 1


def test_the_split_rope_replays_rope_bits() -> None:
    """The step path's rope (``rope_angles`` once, ``rope_rotate`` for q and k) on replays gives ``rope``'s bits:
    the same two kernels, the same arguments."""
    x, pos, theta = _bf(6, 8, 128, seed=40), torch.arange(100, 106, device="cuda"), 1e6
    want = OPS.rope_py(x, pos, theta)
    for _ in range(2):  # the first call of each key records it
        out = OPS.rope_rotate(x, OPS.rope_angles(pos, theta, 128))
    hits = native.stats()["hits"]
    out = OPS.rope_rotate(x, OPS.rope_angles(pos, theta, 128))
    assert native.stats()["hits"] == hits + 2, torch.ops.ws1_launch.last_refusal()
    assert torch.equal(_bits(out), _bits(want))
    # the control: the table of positions one further on gives other bits
    assert not torch.equal(_bits(OPS.rope_rotate(x, OPS.rope_angles(pos + 1, theta, 128))), _bits(want))
