"""The recording side of the step ops' C++ path (`triton_ops.native`), on stand-ins for Triton's compiled kernel:
what a captured launch becomes, and every reason a call is kept on the Python path.

Each refusal has its control: the stand-in launch that `test_a_launch_maps_to_its_recipe` accepts, changed in one
respect. The C++ replay itself (and its check against the kernel's own parameter list) runs on a GPU:
`test_step_native_gpu.py`.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from ws1_kernels import launches
from ws1_kernels.triton_ops import native
from ws1_kernels.triton_ops.native import (
    KIND_CONST,
    KIND_F32,
    KIND_I32,
    KIND_I64,
    KIND_INPUT,
    KIND_NULL,
    KIND_OUTPUT,
    KIND_SCRATCH,
    AtenWatch,
    Buffers,
    NotReplayable,
    check_output,
    recipe_for,
)


@dataclass(frozen=True)
class _Meta:
    num_warps: int = 4
    shared: int = 1024
    num_ctas: int = 1
    cluster_dims: tuple[int, int, int] = (1, 1, 1)
    launch_cooperative_grid: bool = False
    launch_pdl: bool = False
    global_scratch_size: int = 0
    profile_scratch_size: int = 0


SIGNATURE = {
    "x": "*bf16",
    "w": "*bf16",
    "out": "*bf16",
    "bias": "*fp32",
    "m": "i32",
    "one": "constexpr",
    "k": "i64",
    "eps": "fp32",
    "BLOCK": "constexpr",
}


@dataclass
class _Src:
    signature: dict[str, str] = field(default_factory=lambda: dict(SIGNATURE))


@dataclass
class _Compiled:
    metadata: _Meta = field(default_factory=_Meta)
    src: _Src = field(default_factory=_Src)
    function: Any = 0xABC


X = torch.zeros(4, 8, dtype=torch.bfloat16)
W = torch.zeros(16, 8, dtype=torch.bfloat16)
OUT = torch.empty(4, 16, dtype=torch.bfloat16)


def _args(**change: Any) -> list[Any]:
    values = {"x": X, "w": W, "out": OUT, "bias": None, "m": 4, "one": 1, "k": 8, "eps": 1e-6, "BLOCK": 64}
    values.update(change)
    return list(values.values())


def test_a_launch_maps_to_its_recipe() -> None:
    r = recipe_for(_Compiled(), (7,), _args(), [X, W], OUT)
    assert (r.function, r.grid, r.block, r.shared) == (0xABC, (7, 1, 1), 128, 1024)
    assert r.kinds == [KIND_INPUT, KIND_INPUT, KIND_OUTPUT, KIND_NULL, KIND_I32, KIND_I64, KIND_F32]
    eps_bits = struct.unpack("<I", struct.pack("<f", 1e-6))[0]
    assert r.values == [0, 1, 0, 0, 4, 8, eps_bits]


@pytest.mark.parametrize(
    ("compiled", "match"),
    [
        (_Compiled(metadata=_Meta(global_scratch_size=256)), "global_scratch_size"),
        (_Compiled(metadata=_Meta(profile_scratch_size=64)), "profile_scratch_size"),
        (_Compiled(metadata=_Meta(cluster_dims=(2, 1, 1))), "cluster"),
        (_Compiled(metadata=_Meta(num_ctas=2)), "num_ctas"),
        (_Compiled(metadata=_Meta(launch_cooperative_grid=True)), "cooperative"),
        (_Compiled(metadata=_Meta(launch_pdl=True)), "pdl"),
        (_Compiled(function=None), "function handle"),
        (_Compiled(src=_Src({**SIGNATURE, "k": "i8"})), "parameter type i8"),
        (_Compiled(src=_Src({**SIGNATURE, "x": "tensordesc<bf16[64, 64]>"})), "parameter type tensordesc"),
        (_Compiled(src=_Src({k: v for k, v in SIGNATURE.items() if k != "bias"})), "arguments for"),
    ],
)
def test_a_launch_triton_makes_with_more_is_refused(compiled: _Compiled, match: str) -> None:
    with pytest.raises(NotReplayable, match=match):
        recipe_for(compiled, (7,), _args(), [X, W], OUT)


@pytest.mark.parametrize(
    ("args", "inputs", "match"),
    [
        (_args(bias=torch.zeros(16)), [X, W], "neither an input, the output"),  # made outside the call
        (_args(w=X), [X, X], "inputs \\[0, 1\\] at once"),
        (_args(m=4.0), [X, W], "i32 parameter is a float"),
        (_args(x=X.data_ptr()), [X, W], "pointer parameter is a int"),
    ],
)
def test_an_argument_a_replay_cannot_rebuild_is_refused(
    args: list[Any], inputs: list[torch.Tensor], match: str
) -> None:
    with pytest.raises(NotReplayable, match=match):
        recipe_for(_Compiled(), (7,), args, inputs, OUT)


def test_a_grid_that_is_not_ints_is_refused() -> None:
    with pytest.raises(NotReplayable, match="grid"):
        recipe_for(_Compiled(), (7, 2.0), _args(), [X, W], OUT)


def test_a_fresh_output_and_allocations_alone_pass() -> None:
    check_output(torch.empty(3, 4), [X, W], ["aten.empty.memory_format", "aten.view.default"])


@pytest.mark.parametrize(
    ("out", "ops", "match"),
    [
        (torch.empty(3, 4), ["aten.empty.memory_format", "aten.zero_.default"], "aten.zero_"),
        (torch.empty(4, 3).t(), ["aten.empty.memory_format"], "not contiguous"),
        (torch.empty(0, 4), ["aten.empty.memory_format"], "empty"),
        (X.view(8, 4), ["aten.view.default"], "shares an input"),
        ((OUT, OUT), [], "tuple"),
    ],
)
def test_an_op_a_replay_would_not_redo_is_refused(out: Any, ops: list[str], match: str) -> None:
    with pytest.raises(NotReplayable, match=match):
        check_output(out, [X, W], ops)


def test_the_watch_lists_the_aten_ops_a_call_runs() -> None:
    with AtenWatch() as watch:
        y = torch.empty(2, 3)
        y.view(3, 2)
    assert watch.ops == ["aten.empty.memory_format", "aten.view.default"]
    assert [st.data_ptr() for st in watch.allocations] == [y.untyped_storage().data_ptr()]


def test_a_cache_fill_is_not_listed() -> None:
    """A one-time fill (rope's inverse-frequency table) is left out of the watch; the same ops outside are listed."""
    with AtenWatch() as watch:
        with native.cache_fill():
            torch.arange(4, dtype=torch.float64).mul(2.0)
        torch.arange(4, dtype=torch.float64)
    assert watch.ops == ["aten.arange.default"] and watch.allocations == []


def _scratch_call() -> tuple[torch.Tensor, Buffers]:
    """A call's buffers as the watch sees them: the output and one 64-byte scratch buffer."""
    with AtenWatch() as watch:
        out = torch.empty(4, 16, dtype=torch.bfloat16)
        torch.empty(16, dtype=torch.float32)
    return out, Buffers(watch.allocations)


def test_a_scratch_buffer_maps_to_one_index_shared_by_the_launches() -> None:
    out, buffers = _scratch_call()
    scratch = torch.empty(0).set_(
        buffers.allocations[1]
    )  # a tensor on the scratch storage, as a launch passes it
    first = recipe_for(_Compiled(), (7,), _args(out=out, bias=scratch), [X, W], out, buffers)
    second = recipe_for(_Compiled(), (7,), _args(out=out, bias=scratch), [X, W], out, buffers)
    assert first.kinds[2:4] == second.kinds[2:4] == [KIND_OUTPUT, KIND_SCRATCH]
    assert first.values[3] == second.values[3] == 0 and buffers.scratch_bytes() == [64]


def test_a_pointer_into_a_scratch_buffer_past_its_start_is_refused() -> None:
    out, buffers = _scratch_call()
    scratch = torch.empty(0).set_(buffers.allocations[1])
    with pytest.raises(NotReplayable, match="past its start"):
        recipe_for(_Compiled(), (7,), _args(out=out, bias=scratch[1:]), [X, W], out, buffers)


def test_a_declared_constant_maps_to_its_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table declared constant is passed from the recipe; the same tensor undeclared is refused (the control)."""
    table = torch.zeros(16)
    with pytest.raises(NotReplayable, match="neither"):
        recipe_for(_Compiled(), (7,), _args(bias=table), [X, W], OUT, Buffers())
    monkeypatch.setattr(native, "_CONSTANTS", {})
    native.constant(table)
    buffers = Buffers()
    r = recipe_for(_Compiled(), (7,), _args(bias=table), [X, W], OUT, buffers)
    assert (r.kinds[3], r.values[3]) == (KIND_CONST, 0) and buffers.consts == [table]


def test_every_open_launch_log_is_in_the_list_the_cpp_path_reads() -> None:
    """The C++ path blocks its replays while ``launches._GLOBAL`` is not empty (``native.enable`` hands it over):
    an observation in any thread must be in that list while open, and out of it once closed (the control)."""
    seen: list[int] = []

    def other_thread() -> None:
        with launches.observe():
            seen.append(len(launches._GLOBAL))

    with launches.observe():
        assert len(launches._GLOBAL) == 1
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    assert seen == [2] and launches._GLOBAL == []


class _FakeRegistry:
    """Stands for ``torch.ops.ws1_launch`` (the C++ module): a recipe is pending, and what Python registers."""

    def __init__(self) -> None:
        self.launches: list[tuple[Any, ...]] = []
        self.commits: list[tuple[Any, ...]] = []

    def pending(self) -> bool:
        return True

    def add_launch(self, *a: Any) -> None:
        self.launches.append(a)

    def commit(self, *a: Any) -> str:
        self.commits.append(a)
        return a[-1]


class _Launcher:
    capture: list[Any] | None = None


def _recorded(fn: Any, monkeypatch: pytest.MonkeyPatch, *, scratch: bool = False) -> _FakeRegistry:
    """Record a stand-in op through the twin: it allocates its output, runs ``fn(x, w, out)`` and captures one
    launch; ``scratch``: it also allocates a second buffer (logp's log-sum-exp) and passes it to the launch."""
    reg, bl = _FakeRegistry(), _Launcher()
    monkeypatch.setattr(torch.ops, "ws1_launch", reg, raising=False)
    monkeypatch.setattr(native, "_pending", reg.pending)
    monkeypatch.setattr("ws1_kernels.triton_ops._launch.launcher", lambda: bl)

    def op(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype)
        extra = {"bias": torch.empty(x.shape[0], dtype=torch.float32)} if scratch else {}
        fn(x, w, out)
        assert bl.capture is not None
        bl.capture.append((_Compiled(), (3,), tuple(_args(x=x, w=w, out=out, **extra))))
        return out

    native.twin(op)(X, W)
    return reg


def test_a_recorded_call_registers_its_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = _recorded(lambda x, w, out: None, monkeypatch)
    assert len(reg.launches) == 1 and reg.launches[0][1] == [3, 1, 1]
    assert reg.commits == [([4, 16], torch.bfloat16, 2, [], [], "")]


def test_a_recorded_call_registers_its_scratch_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """logp's shape of call: a second buffer allocated by the call and passed to the kernel is its scratch."""
    reg = _recorded(lambda x, w, out: None, monkeypatch, scratch=True)
    assert reg.launches[0][4][3] == KIND_SCRATCH
    assert reg.commits == [([4, 16], torch.bfloat16, 2, [16], [], "")]


def test_a_recorded_call_that_writes_elsewhere_stays_python(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = _recorded(lambda x, w, out: out.zero_(), monkeypatch)  # an aten op a replay would skip
    assert reg.launches == []
    assert reg.commits[0][-1].startswith("it runs aten.zero_")


def _real_call(
    op: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[torch.Tensor, list[torch.Tensor], Any, list[Any]]:
    """The Python path of a step op that passes buffers besides its output (rope: the cos/sin table and the
    inverse-frequency table, filled on this first call; logp: the log-sum-exp), with its launches stubbed: (out,
    inputs, the watch, each launch's arguments)."""
    from ws1_kernels.triton_ops import logprob, pointwise

    launched: list[Any] = []

    def fake_launch(kernel: Any, grid: Any, phase: str, *args: Any, **meta: Any) -> None:
        launched.append(args)

    monkeypatch.setattr(pointwise, "_INV_FREQ", {})
    if op == "rope":
        monkeypatch.setattr(pointwise, "launch", fake_launch)
        inputs = [torch.zeros(3, 2, 8), torch.arange(3)]
        call = lambda: pointwise.rope_launch(inputs[0], inputs[1], 1e6)  # noqa: E731
    else:
        monkeypatch.setattr(logprob, "launch", fake_launch)
        inputs = [torch.zeros(3, 40), torch.tensor([0, 5, 39])]
        call = lambda: logprob._logp_fwd(inputs[0], inputs[1], logprob.LOGP_TILES, "fwd")[0]  # noqa: E731
    with AtenWatch() as watch:
        out = call()
    return out, inputs, watch, launched


def _kinds(out: torch.Tensor, inputs: list[torch.Tensor], watch: Any, launched: list[Any]) -> list[int]:
    buffers = Buffers(watch.allocations)
    return [
        native._pointer_kind(a, inputs, out, buffers)[0]
        for args in launched
        for a in args
        if isinstance(a, torch.Tensor)
    ]


@pytest.mark.parametrize(
    ("op", "want"),
    [
        ("rope", [KIND_INPUT, KIND_CONST, KIND_SCRATCH, KIND_INPUT, KIND_OUTPUT, KIND_SCRATCH]),
        ("logp", [KIND_INPUT, KIND_INPUT, KIND_OUTPUT, KIND_SCRATCH]),
    ],
)
def test_rope_and_logp_pass_only_what_a_replay_rebuilds(
    op: str, want: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their calls allocate and launch, nothing else (the table's fill is a cache fill), and every pointer they
    pass is an input, the output, a scratch buffer of the call or a declared constant."""
    monkeypatch.setattr(native, "_CONSTANTS", {})
    out, inputs, watch, launched = _real_call(op, monkeypatch)
    check_output(out, inputs, watch.ops)
    assert _kinds(out, inputs, watch, launched) == want


def test_an_undeclared_table_keeps_rope_on_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the same call with the inverse-frequency table not declared a constant is refused."""
    monkeypatch.setattr(native, "_CONSTANTS", {})
    monkeypatch.setattr(native, "constant", lambda t: t)
    out, inputs, watch, launched = _real_call("rope", monkeypatch)
    with pytest.raises(NotReplayable, match="neither an input, the output"):
        _kinds(out, inputs, watch, launched)


def _cuda_impls(source: str) -> set[str]:
    """The op names of the module's ``TORCH_LIBRARY_IMPL(ws1_triton, CUDA)`` block."""
    import re

    block = source.split("TORCH_LIBRARY_IMPL(ws1_triton, CUDA, m) {", 1)[1].split("}", 1)[0]
    return set(re.findall(r'm\.impl\("(\w+)"', block))


def test_the_native_op_list_is_the_modules_own() -> None:
    """``NATIVE_OPS`` decides which ops get a ``_py`` twin; an op the C++ block implements without one (or the
    reverse) fails at import on the GPU. The control: the block with one line dropped is seen."""
    from pathlib import Path

    source = (Path(__file__).parents[2] / "csrc" / "launch" / "ws1_launch.cpp").read_text()
    assert _cuda_impls(source) == set(native.NATIVE_OPS)
    dropped = source.replace('  m.impl("rope_rotate", &rope_rotate);\n', "")
    assert dropped != source and _cuda_impls(dropped) != set(native.NATIVE_OPS)
