"""The bound-kernel fast path (`triton_ops._bound`), on stand-ins for Triton's JIT function, compiled kernel and
driver: which calls are bound, what reaches the launcher, and when Triton's own path must be taken again.

Each property has its control: a call that must reuse the bound kernel beside one that must not. The real kernels
are checked on a GPU by `test_triton_bound_launch_gpu.py` (checked mode: Triton's own pick on every call).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from ws1_kernels.triton_ops import _bound
from ws1_kernels.triton_ops._bound import BoundLauncher, LaunchMismatch


@dataclass
class _Param:
    is_constexpr: bool


@dataclass
class _Compiled:
    """A compiled kernel: its launcher records what it was given."""

    tag: int
    launches: list[tuple[Any, ...]] = field(default_factory=list)
    function: str = "fn-handle"
    packed_metadata: str = "packed"

    def run(self, *a: Any) -> None:
        self.launches.append(a)

    def launch_metadata(self, grid: Any, stream: Any, *args: Any) -> dict[str, Any]:
        return {"name": "k", "grid": grid, "stream": stream}


class constexpr:  # noqa: N801 (named as Triton's annotation is)
    """Stands for ``tl.constexpr`` in the stand-in's signature."""


def _kernel_fn(x, y, n, stride, BLOCK: constexpr, EVEN: constexpr = True, LAST: constexpr = 7):  # type: ignore[no-untyped-def]
    """The stand-in kernel's signature: two pointers, two ints, three constexprs (two with defaults)."""


class _Kernel:
    """A JIT function: ``kernel[grid](...)`` compiles (a new compiled kernel per distinct Triton key) and launches."""

    def __init__(self) -> None:
        self.fn = _kernel_fn
        self.signature = inspect.signature(_kernel_fn)
        self.params = [_Param("constexpr" in str(p.annotation)) for p in self.signature.parameters.values()]
        self.jit_calls = 0
        self.compiled: dict[Any, _Compiled] = {}
        self.pick_override: _Compiled | None = None

    def _pick(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Compiled:
        if self.pick_override is not None:
            return self.pick_override
        try:
            spec: Any = _bound.arg_key(args)
        except _bound._Unkeyable:
            spec = repr(args)
        key = (spec, tuple(sorted(kwargs.items())))
        return self.compiled.setdefault(key, _Compiled(len(self.compiled)))

    def __getitem__(self, grid: Any):
        def call(*args: Any, **kwargs: Any) -> _Compiled:
            self.jit_calls += 1
            c = self._pick(args, kwargs)
            c.run("jit", grid, *args)
            return c

        return call

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> _Compiled:
        assert warmup, "checked mode must never launch through Triton a second time"
        return self._pick(args, kwargs)


class _Driver:
    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 1234


class _Chain:
    """Triton 3.6's hook chain: present always, live only with calls."""

    def __init__(self, calls: list[Any] | None = None) -> None:
        self.calls = calls or []

    def __call__(self, md: Any) -> None:
        for c in self.calls:
            c(md)


@dataclass
class _Knobs:
    launch_enter_hook: Any = field(default_factory=_Chain)
    launch_exit_hook: Any = field(default_factory=_Chain)


def _launcher(mode: str = "fast", knobs: _Knobs | None = None) -> BoundLauncher:
    return BoundLauncher(mode, driver=_Driver(), knobs=knobs or _Knobs())


def _args(buf: torch.Tensor, offset: int = 0, n: int = 64, stride: int = 32) -> tuple[Any, ...]:
    return (buf[offset:], buf, n, stride)


BUF = torch.zeros(256, dtype=torch.bfloat16)


def test_second_call_with_the_same_key_skips_triton() -> None:
    k, bl = _Kernel(), _launcher()
    bl(k, (3,), _args(BUF), {"BLOCK": 16, "num_warps": 4})
    bl(k, (3,), _args(BUF), {"BLOCK": 16, "num_warps": 4})
    assert (k.jit_calls, bl.slow, bl.fast) == (1, 1, 1)


def test_the_launcher_gets_grid_stream_handles_and_every_argument_in_signature_order() -> None:
    k, bl = _Kernel(), _launcher()
    args = _args(BUF)
    bl(k, (3,), args, {"BLOCK": 16, "LAST": 9, "num_warps": 4})
    c = bl(k, (3,), args, {"BLOCK": 16, "LAST": 9, "num_warps": 4})
    fast = c.launches[-1]
    # grid padded to 3, the stream, the function handle, packed metadata, no metadata or hooks (none live)
    assert fast[:9] == (3, 1, 1, 1234, "fn-handle", "packed", None, None, None)
    # positional arguments, then BLOCK, EVEN's default, LAST as passed; num_warps is an option, not an argument
    assert fast[9:13] == args and fast[13:] == (16, True, 9)


def test_an_unaligned_pointer_is_another_key() -> None:
    k, bl = _Kernel(), _launcher()
    bl(k, (1,), _args(BUF, 0), {"BLOCK": 16})
    bl(k, (1,), _args(BUF, 2), {"BLOCK": 16})  # 4 bytes off: not 16-byte aligned
    assert k.jit_calls == 2
    bl(k, (1,), _args(BUF, 8), {"BLOCK": 16})  # control: 16 bytes off, aligned again: bound
    assert (k.jit_calls, bl.fast) == (2, 1)


@pytest.mark.parametrize("second, same", [(32, True), (48, False), (33, False), (2**40, False)])
def test_ints_are_keyed_by_value(second: int, same: bool) -> None:
    """Finer than Triton's int specialisation (1, divisible by 16, 32-bit or not): 32 and 48 specialise alike
    but are two keys; the same value is one key (the control)."""
    k, bl = _Kernel(), _launcher()
    bl(k, (1,), _args(BUF, n=32), {"BLOCK": 16})
    bl(k, (1,), _args(BUF, n=second), {"BLOCK": 16})
    assert k.jit_calls == (1 if same else 2)


def test_the_table_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_bound, "TABLE_MAX", 3)
    k, bl = _Kernel(), _launcher()
    for n in range(5):
        bl(k, (1,), _args(BUF, n=n), {"BLOCK": 16})
    assert len(bl.table) <= 3
    bl(k, (1,), _args(BUF, n=4), {"BLOCK": 16})  # control: the newest entry survives the clear
    assert bl.fast == 1


def test_a_constexpr_passed_positionally_is_keyed_by_value() -> None:
    k, bl = _Kernel(), _launcher()
    bl(k, (1,), _args(BUF) + (16,), {})
    bl(k, (1,), _args(BUF) + (32,), {})
    assert k.jit_calls == 2
    bl(k, (1,), _args(BUF) + (32,), {})  # control
    assert k.jit_calls == 2


def test_another_constexpr_or_option_is_another_key() -> None:
    k, bl = _Kernel(), _launcher()
    bl(k, (1,), _args(BUF), {"BLOCK": 16, "num_warps": 4})
    bl(k, (1,), _args(BUF), {"BLOCK": 16, "num_warps": 8})
    bl(k, (1,), _args(BUF), {"BLOCK": 32, "num_warps": 8})
    assert k.jit_calls == 3


def test_an_argument_the_key_does_not_model_always_goes_through_triton() -> None:
    k, bl = _Kernel(), _launcher()
    for _ in range(2):
        bl(k, (1,), (BUF, BUF, [1, 2], 4), {"BLOCK": 16})
    assert (k.jit_calls, len(bl.table)) == (2, 0)


def test_a_callable_grid_goes_through_triton() -> None:
    k, bl = _Kernel(), _launcher()
    for _ in range(2):
        bl(k, lambda meta: (1,), _args(BUF), {"BLOCK": 16})
    assert k.jit_calls == 2


def test_jit_mode_never_binds() -> None:
    k, bl = _Kernel(), _launcher("jit")
    for _ in range(3):
        bl(k, (1,), _args(BUF), {"BLOCK": 16})
    assert (k.jit_calls, bl.fast) == (3, 0)


def test_a_live_hook_gets_the_metadata_and_the_hooks() -> None:
    seen: list[Any] = []
    knobs = _Knobs(_Chain([seen.append]))
    k, bl = _Kernel(), _launcher(knobs=knobs)
    bl(k, (2, 3), _args(BUF), {"BLOCK": 16})
    c = bl(k, (2, 3), _args(BUF), {"BLOCK": 16})
    md, enter, leave = c.launches[-1][6:9]
    assert md == {"name": "k", "grid": (2, 3), "stream": 1234}
    assert enter is knobs.launch_enter_hook and leave is knobs.launch_exit_hook


def test_a_plain_hook_attribute_is_live_and_none_is_not() -> None:
    assert _bound._hook_live(lambda md: None)
    assert not _bound._hook_live(None)
    assert not _bound._hook_live(_Chain())
    assert _bound._hook_live(_Chain([print]))


def test_checked_mode_refuses_a_bound_kernel_triton_would_not_pick() -> None:
    k, bl = _Kernel(), _launcher("checked")
    bl(k, (1,), _args(BUF), {"BLOCK": 16})
    bl(k, (1,), _args(BUF), {"BLOCK": 16})  # control: Triton picks the bound one
    k.pick_override = _Compiled(99)
    with pytest.raises(LaunchMismatch, match="_kernel_fn"):
        bl(k, (1,), _args(BUF), {"BLOCK": 16})


def test_an_unknown_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WS1_TRITON_LAUNCH", "fastest")
    with pytest.raises(ValueError, match="WS1_TRITON_LAUNCH='fastest'"):
        _bound.mode_from_env()
    monkeypatch.setenv("WS1_TRITON_LAUNCH", "checked")  # control
    assert _bound.mode_from_env() == "checked"


class CudaLauncher:
    """Stands for Triton 3.6's launcher object (matched by class name): scratch sizes, flags, the C launch."""

    def __init__(self, scratch: int = 0) -> None:
        self.global_scratch_size = scratch
        self.profile_scratch_size = 0
        self.launch_cooperative_grid = False
        self.launch_pdl = True
        self.calls: list[tuple[Any, ...]] = []

    def launch(self, *a: Any) -> None:
        self.calls.append(a)

    def __call__(self, *a: Any) -> None:
        """The launcher's Python wrapper (the stand-in JIT's path); a direct launch must not come here."""


@pytest.fixture
def this_triton_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the installed Triton's version count as one the direct launch was checked against."""
    triton = pytest.importorskip("triton")
    monkeypatch.setattr(_bound, "DIRECT_LAUNCH_VERSIONS", (str(triton.__version__),))


def test_direct_launch_only_for_the_checked_launcher_without_scratch(this_triton_direct: None) -> None:
    ok = CudaLauncher()
    assert _bound.direct_launch(ok) == (ok.launch, 0, 1)
    assert _bound.direct_launch(CudaLauncher(scratch=128)) is None  # the launcher must allocate scratch
    assert _bound.direct_launch(_Compiled(0).run) is None  # another launcher: call it


def test_direct_launch_is_off_for_another_triton_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_bound, "DIRECT_LAUNCH_VERSIONS", ("0.0.",))
    assert _bound.direct_launch(CudaLauncher()) is None


def test_a_direct_launch_passes_the_flags_and_no_scratch(this_triton_direct: None) -> None:
    k, bl = _Kernel(), _launcher()
    c = _Compiled(5)
    c.run = CudaLauncher()  # type: ignore[assignment,method-assign]
    k.pick_override = c
    args = _args(BUF)
    bl(k, (4, 2), args, {"BLOCK": 16})
    bl(k, (4, 2), args, {"BLOCK": 16})
    (call,) = c.run.calls  # the first call went through the stand-in JIT, the second straight to launch
    assert call[:13] == (4, 2, 1, 1234, "fn-handle", 0, 1, None, None, "packed", None, None, None)
    assert all(a is b for a, b in zip(call[13:17], args, strict=True)) and call[17:] == (16, True, 7)


def test_a_capture_lists_each_launch_with_every_parameter_in_signature_order() -> None:
    k, bl = _Kernel(), _launcher()
    args = _args(BUF)
    bl(k, (3,), args, {"BLOCK": 16, "num_warps": 4})  # before the capture: not listed
    bl.capture = []
    slow = bl(k, (5,), _args(BUF, n=48), {"BLOCK": 16, "num_warps": 4})  # Triton's path (a new key)
    fast = bl(k, (3,), args, {"BLOCK": 16, "num_warps": 4})  # the bound path
    assert [(c, g) for c, g, _ in bl.capture] == [(slow, (5,)), (fast, (3,))]
    assert bl.capture[1][2] == (*args, 16, True, 7)  # the positional ones, then BLOCK and the defaults
