"""Launch a compiled Triton kernel without Triton's per-call binding: the host fast path.

Why: ``kernel[grid](*args)`` goes through ``JITFunction.run``, which binds the arguments, computes their
specialisation, builds a cache key (``str(options)`` included) and looks the compiled kernel up on every call. On
the H100 host that is about 30 us of a 35 us launch at M = 1, where the GEMM itself streams its weight in about
10 us (``ci/host_cost_triton.py``). A decode loop calls the same few launches thousands of times.

How: the first call of a (kernel, device, argument key, keyword arguments) goes through Triton's own path, which
compiles or finds the kernel and returns it. That compiled kernel is kept with the full argument tail (the
constexprs and defaults after the positional arguments, in signature order), and later calls with the same key call
its launcher directly: grid, stream, function handle, the arguments.

Why the key is safe: Triton picks the compiled kernel from each argument's type and specialisation (a tensor's
dtype and whether its address is 16-byte aligned; an int's width class, whether it is 1 and whether it is divisible
by 16; constexpr values and launch options). The key here holds all of those and more (an int's and a bool's
value), so two calls with one key always get the same compiled kernel from Triton too; a finer key only costs
another cache entry (bounded: the table is cleared past ``TABLE_MAX`` entries).
``WS1_TRITON_LAUNCH=checked`` proves it at run time: every fast call also asks Triton which kernel it would run and
fails if it is another. ``WS1_TRITON_LAUNCH=jit`` turns the fast path off.

Launch hooks (the harness's observation of what really launched) still fire: when a hook is installed the launch
metadata is built and passed exactly as Triton does; when none is, none is built.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Any

import torch

#: the modes of ``WS1_TRITON_LAUNCH``
MODES = ("fast", "jit", "checked")

#: bound entries kept before the table is cleared (ints are keyed by value, and training calls see many M)
TABLE_MAX = 4096


class LaunchMismatch(RuntimeError):
    """``checked`` mode: the bound kernel is not the one Triton would run (a key that misses a specialisation)."""


class _Unkeyable(Exception):
    """An argument whose specialisation the key does not model: the call takes Triton's own path."""


def mode_from_env() -> str:
    """``WS1_TRITON_LAUNCH`` (default ``fast``); an unknown value is refused, never guessed."""
    value = os.environ.get("WS1_TRITON_LAUNCH", "fast").strip() or "fast"
    if value not in MODES:
        raise ValueError(f"WS1_TRITON_LAUNCH={value!r}: expected one of {', '.join(MODES)}")
    return value


def arg_key(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Everything about the positional arguments that can change which compiled kernel Triton picks, and more.

    Ints: their value (finer than Triton's specialisation, which looks at whether an int is 1, divides by 16 and
    fits 32 bits, so nothing about ints needs modelling; and cheaper to build). Tensors: dtype and whether the
    address is 16-byte aligned. Floats: nothing (typed fp32, never specialised). Bools and None: the value.
    Anything else raises ``_Unkeyable`` and the call goes through Triton.
    """
    key: list[Any] = []
    add = key.append
    for a in args:
        t = type(a)
        if t is int:
            add(a)
        elif isinstance(a, torch.Tensor):
            add(a.dtype)
            add(a.data_ptr() & 15 == 0)
        elif t is float:
            add(float)
        elif t is bool or a is None:
            add((t, a))
        else:
            raise _Unkeyable(t.__name__)
    return tuple(key)


def argument_tail(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The values of the kernel's parameters after the positional ones, in signature order, defaults applied.

    Launch options (``num_warps``, ``num_stages``, ...) are not parameters and are left out, as Triton's binder
    leaves them out of the bound arguments.
    """
    sig: inspect.Signature = kernel.signature
    names = list(sig.parameters)
    params = {k: v for k, v in kwargs.items() if k in sig.parameters}
    bound = sig.bind(*args, **params)
    bound.apply_defaults()
    values = [bound.arguments[n] for n in names]
    return tuple(values[len(args) :])


def constexpr_positions(kernel: Any) -> tuple[int, ...]:
    """Positions of the kernel's ``tl.constexpr`` parameters: their values pick the compiled kernel, so a
    constexpr passed positionally is keyed by value, not by its specialisation."""
    return tuple(i for i, p in enumerate(kernel.params) if p.is_constexpr)


#: Triton versions whose CUDA launcher ``direct_launch`` was read against and GPU-tested (the bits and the
#: checked mode of ``test_triton_bound_launch_gpu.py``); any other version calls the launcher object
DIRECT_LAUNCH_VERSIONS = ("3.6.",)


def direct_launch(launcher: Any) -> tuple[Any, int, int] | None:
    """The compiled module's ``launch`` and its two flags, when calling it directly is what the launcher would do.

    Triton 3.6's ``CudaLauncher.__call__`` is Python: it allocates the global and profile scratch buffers (when
    the kernel needs them) and passes them with the cooperative-grid and PDL flags to the module's C ``launch``.
    For a kernel that needs no scratch, that wrapper adds only its own frame; skipping it saves about 1 us. Any
    other case (scratch needed, another launcher class, another Triton version) returns None.
    """
    try:
        import triton

        version = str(triton.__version__)
    except Exception:  # noqa: BLE001 - no Triton, no direct launch
        return None
    if not version.startswith(DIRECT_LAUNCH_VERSIONS) or type(launcher).__name__ != "CudaLauncher":
        return None
    try:
        if launcher.global_scratch_size or launcher.profile_scratch_size:
            return None
        return launcher.launch, int(launcher.launch_cooperative_grid), int(launcher.launch_pdl)
    except AttributeError:
        return None


def _hook_live(hook: Any) -> bool:
    """A launch hook that would do something: set, and (for a hook chain) holding at least one call."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return True if calls is None else bool(calls)


@dataclass
class Bound:
    """One compiled kernel and what its launcher needs besides the per-call arguments."""

    compiled: Any
    run: Any
    function: Any
    packed_metadata: Any
    tail: tuple[Any, ...]
    #: (the compiled module's launch, cooperative flag, PDL flag) where the launcher can be skipped (see
    #: ``direct_launch``), else None and ``run`` is called
    direct: tuple[Any, int, int] | None = None


class BoundLauncher:
    """The per-process table of bound kernels and the fast launch through it."""

    def __init__(self, mode: str | None = None, *, driver: Any = None, knobs: Any = None) -> None:
        """``driver`` and ``knobs`` default to Triton's active driver and runtime knobs (tests pass stand-ins)."""
        self.mode = mode or mode_from_env()
        self.table: dict[tuple[Any, ...], Bound] = {}
        #: per kernel, the positions of its constexpr parameters (keyed by value when passed positionally)
        self._constexprs: dict[int, tuple[int, ...]] = {}
        #: the kernels the table's ids name, kept alive so an id is never reused by another object
        self._kernels: dict[int, Any] = {}
        self._driver: Any = driver
        self._knobs: Any = knobs
        #: counts of fast launches and of calls that went through Triton (tests read them)
        self.fast = 0
        self.slow = 0
        #: when a list: every launch is appended as (compiled kernel, grid, every parameter's value in signature
        #: order), for the C++ step path's recipes (``native.record``)
        self.capture: list[tuple[Any, Any, tuple[Any, ...]]] | None = None

    def _bind_driver(self) -> None:
        import triton
        from triton.runtime.driver import driver

        self._driver = driver.active
        if self._knobs is None:
            self._knobs = triton.knobs.runtime

    def __call__(self, kernel: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.mode == "jit" or callable(grid):
            return self._slow(kernel, grid, args, kwargs, None)
        if self._driver is None:
            self._bind_driver()
        drv = self._driver
        device = drv.get_current_device()
        # keyed by id: a JITFunction's own __hash__ is Python code (about 1 us a call); kernels live as long as
        # their module, and the bound entry holds the compiled kernel, not the JIT function
        kid = id(kernel)
        exact = self._constexprs.get(kid)
        if exact is None:
            exact = self._constexprs[kid] = constexpr_positions(kernel)
        try:
            values = tuple(args[i] for i in exact if i < len(args)) if exact else ()
            key = (kid, device, arg_key(args), values, tuple(kwargs.items()))
            bound = self.table.get(key)
        except (_Unkeyable, TypeError):
            return self._slow(kernel, grid, args, kwargs, None)
        if bound is None:
            return self._slow(kernel, grid, args, kwargs, key)
        if self.mode == "checked":
            self._check(kernel, grid, args, kwargs, bound)
        stream = drv.get_current_stream(device)
        full = args + bound.tail
        knobs = self._knobs
        enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
        if _hook_live(enter) or _hook_live(leave):
            metadata = bound.compiled.launch_metadata(grid, stream, *full)
        else:
            metadata = enter = leave = None
        n = len(grid)
        gx, gy, gz = grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1
        if bound.direct is not None:
            launch, coop, pdl = bound.direct
            launch(
                gx,
                gy,
                gz,
                stream,
                bound.function,
                coop,
                pdl,
                None,
                None,
                bound.packed_metadata,
                metadata,
                enter,
                leave,
                *full,
            )
        else:
            bound.run(
                gx, gy, gz, stream, bound.function, bound.packed_metadata, metadata, enter, leave, *full
            )
        self.fast += 1
        if self.capture is not None:
            self.capture.append((bound.compiled, grid, full))
        return bound.compiled

    def _slow(
        self,
        kernel: Any,
        grid: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        key: tuple[Any, ...] | None,
    ) -> Any:
        """Triton's own path; with a key, the compiled kernel it returns is bound for the next calls."""
        self.slow += 1
        compiled = kernel[grid](*args, **kwargs)
        if compiled is not None and hasattr(compiled, "result"):
            compiled = compiled.result()
        if self.capture is not None:
            self.capture.append((compiled, grid, args + argument_tail(kernel, args, kwargs)))
        if key is not None and compiled is not None:
            self._kernels[key[0]] = kernel
            if len(self.table) >= TABLE_MAX:
                self.table.clear()
            self.table[key] = Bound(
                compiled=compiled,
                run=compiled.run,
                function=compiled.function,
                packed_metadata=compiled.packed_metadata,
                tail=argument_tail(kernel, args, kwargs),
                direct=direct_launch(compiled.run),
            )
        return compiled

    def _check(
        self, kernel: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any], bound: Bound
    ) -> None:
        """Ask Triton (without launching) which compiled kernel it would run, and refuse another."""
        theirs = kernel.run(*args, grid=grid, warmup=True, **kwargs)
        theirs = theirs.result() if hasattr(theirs, "result") else theirs
        if theirs is not bound.compiled:
            name = getattr(getattr(kernel, "fn", kernel), "__name__", kernel)
            raise LaunchMismatch(
                f"{name}: the bound kernel is not the one Triton picks for these arguments "
                f"(key {arg_key(args)}); the fast path's key misses a specialisation"
            )

    def clear(self) -> None:
        """Forget every bound kernel (tests; a process that reloads kernels)."""
        self.table.clear()
