"""The step ops' host path in C++ (``csrc/launch/ws1_launch.cpp``, module ``ws1_launch_ext``): loading it, and
recording the recipes it replays.

Why: a step op called from Python spent about 20 us of host time at M = 1 before its kernel (the dispatcher into
Python, the output's allocation, the tile and plan lookups, Triton's launcher parsing the arguments and asking the
driver about every pointer), against a kernel of about 10 us. With the module built, each step op's CUDA kernel is
C++: it keys the call by everything the Python path could pick its launches by (each tensor's device, dtype, sizes,
strides and 16-byte alignment, each float's bits), and on a hit allocates the output and calls ``cuLaunchKernel``
with the recipe that the Python path recorded for that key. It launches the same compiled Triton kernels with the
same grids and arguments, so the bits are the Python path's.

How a recipe is recorded: on a miss the C++ kernel calls the op's Python twin (``ws1_triton::<op>_py``, the
Python implementation) with a recipe pending on the thread. The twin runs the op while the bound launcher captures
every Triton launch (compiled kernel, grid, full argument list) and a dispatch mode lists every aten op it calls and
every tensor it allocates; ``recipe_for`` then maps each kernel parameter to an input, the output, a scratch buffer
(another tensor the call allocated: the replay allocates one of the same size, as the Python path does on every
call), a declared constant (``constant``: a tensor that is never written again, such as rope's inverse-frequency
table; the recipe keeps a reference, so its pointer stays valid), or a number. A key is kept Python-only (every call
takes the twin) when the op did anything a replay would not redo: an aten op other than allocations and views (a
one-time cache fill inside ``cache_fill`` is not listed: what it makes is a constant), a pointer that is none of
the above (or points into a scratch buffer past its start), a kernel that needs Triton's scratch memory, a cluster,
a cooperative or a PDL launch, or a parameter type outside i32/i64/fp32/pointer.
The C++ side then checks each launch against the compiled kernel's own parameter list (count and sizes) before
storing it. A recipe is kept for the process: this holds because the step ops pick their launches from the key
alone (frozen tile tables, the device's SM count), never from the tensors' values or a setting changed later.

Off switches: ``WS1_STEP_NATIVE=0`` (the module is not loaded), and any ``WS1_TRITON_LAUNCH`` other than
``fast``. While anything observes launches (``ws1_kernels.launches.observe``: the harness's judged calls) the path
is blocked and every call takes the twin (the C++ kernel reads the length of the list of open logs,
``launches._GLOBAL``, under the GIL), so the launch records and Triton's launch hooks see every kernel. A
Triton launch hook installed outside such an observation does not see the C++ path's launches.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

#: parameter kinds, as ``ws1_launch.cpp``'s ``Kind``
KIND_INPUT, KIND_OUTPUT, KIND_I32, KIND_I64, KIND_F32, KIND_NULL, KIND_SCRATCH, KIND_CONST = range(8)

#: the step ops the C++ module implements (its ``TORCH_LIBRARY_IMPL(ws1_triton, CUDA)`` list)
NATIVE_OPS = (
    "embedding",
    "norm",
    "linear",
    "rope",
    "attention",
    "swiglu",
    "logp",
    "rope_angles",
    "rope_rotate",
)

#: the module's import name (built by ``csrc/launch/setup.py``)
EXTENSION = "ws1_launch_ext"

#: Triton parameter types replayed as a 4-byte int, an 8-byte int, a float
_I32 = frozenset({"i32", "u32"})
_I64 = frozenset({"i64", "u64"})
_F32 = frozenset({"fp32", "f32"})

#: aten ops that allocate: what they return, besides the output, is the call's scratch
ALLOC_ATEN = frozenset(
    {
        "aten.empty.memory_format",
        "aten.empty_strided.default",
        "aten.empty_like.default",
        "aten.new_empty.default",
    }
)

#: aten ops a replayable op may call besides its Triton launches: allocations, and views
ALLOWED_ATEN = ALLOC_ATEN | frozenset(
    {
        "aten.view.default",
        "aten._unsafe_view.default",
        "aten.alias.default",
        "aten.detach.default",
    }
)

#: tensors declared never written again (``constant``), by data pointer: a recipe may pass them
_CONSTANTS: dict[int, torch.Tensor] = {}
#: per thread: the depth of ``cache_fill`` blocks (the watch does not list their ops)
_LOCAL = threading.local()

_LOADED: bool | None = None
#: the imported module, once ``available()`` loaded it
_MODULE: Any = None
_ENABLED = False


def wanted() -> bool:
    """Whether this process asks for the C++ path: ``WS1_STEP_NATIVE`` is not ``0``."""
    return os.environ.get("WS1_STEP_NATIVE", "1").strip() != "0"


def available() -> bool:
    """Import the module once (which registers the step ops' CUDA kernels in C++); False when it is not built, not
    wanted, or this torch has no CUDA."""
    global _LOADED, _MODULE
    if _LOADED is None:
        _LOADED = False
        if wanted() and torch.version.cuda is not None:
            try:
                _MODULE = __import__(EXTENSION)
                _LOADED = True
            except ImportError:
                _LOADED = False
    return _LOADED


def enable() -> None:
    """Open the C++ path (it starts blocked) when the launch mode is ``fast``, handing it the list of open launch
    logs (``launches._GLOBAL``: every thread's ``observe()`` blocks, see the module's docstring). Called once,
    after the step ops and their twins are defined."""
    global _ENABLED
    from .. import launches
    from ._launch import launcher

    if _ENABLED or launcher().mode != "fast":
        return
    _ENABLED = True
    _MODULE.watch(launches._GLOBAL)
    torch.ops.ws1_launch.block(-1)


def stats() -> dict[str, int]:
    """The C++ path's counters: hits (replayed), misses (recorded), python_only (calls of a non-replayable key),
    recipes (keys stored), blocked (> 0: every call takes the twin)."""
    hits, misses, python_only, recipes, blocked = torch.ops.ws1_launch.stats()
    return {
        "hits": hits,
        "misses": misses,
        "python_only": python_only,
        "recipes": recipes,
        "blocked": blocked,
    }


# ------------------------------------------------------------------------------------------- recording


def constant(t: torch.Tensor) -> torch.Tensor:
    """Declare ``t`` never written again in this process (a cache's table), so a recipe may pass its pointer; the
    recipe keeps a reference to it. Returns ``t``."""
    _CONSTANTS[t.data_ptr()] = t
    return t


@contextmanager
def cache_fill() -> Iterator[None]:
    """A one-time cache fill: the aten ops inside are not listed by a recorded call's watch. What the fill makes
    must be declared a ``constant``, or a launch that reads it keeps the key on the Python path."""
    _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1
    try:
        yield
    finally:
        _LOCAL.depth -= 1


@dataclass
class LaunchRecipe:
    """One kernel launch as the C++ side replays it."""

    function: int
    grid: tuple[int, int, int]
    block: int
    shared: int
    kinds: list[int] = field(default_factory=list)
    values: list[int] = field(default_factory=list)


class NotReplayable(Exception):
    """The recorded call does something a replay would not redo; the message says what."""


@dataclass
class Buffers:
    """One recorded call's buffers besides its inputs and output, shared by its launches.

    ``allocations``: the storage of every tensor the call allocated (the watch's list, which holds them, so no two
    share a pointer). ``scratch``: those a launch passes, in order of first use; a replay allocates each anew with
    ``scratch_bytes``. ``consts``: the declared constants a launch passes; the recipe keeps them."""

    allocations: list[torch.UntypedStorage] = field(default_factory=list)
    scratch: list[torch.UntypedStorage] = field(default_factory=list)
    consts: list[torch.Tensor] = field(default_factory=list)

    def scratch_bytes(self) -> list[int]:
        return [st.nbytes() for st in self.scratch]


def _meta(compiled: Any, name: str, default: Any) -> Any:
    return getattr(compiled.metadata, name, default)


def _check_metadata(compiled: Any) -> None:
    """Refuse a launch that Triton makes with more than a function, a grid, a block and shared memory."""
    if _meta(compiled, "num_ctas", 1) != 1:
        raise NotReplayable(f"num_ctas {_meta(compiled, 'num_ctas', 1)}")
    cluster = tuple(_meta(compiled, "cluster_dims", (1, 1, 1)) or (1, 1, 1))
    if any(c > 1 for c in cluster):
        raise NotReplayable(f"cluster dims {cluster}")
    for flag in ("launch_cooperative_grid", "launch_pdl"):
        if _meta(compiled, flag, False):
            raise NotReplayable(flag)
    for scratch in ("global_scratch_size", "profile_scratch_size"):
        if _meta(compiled, scratch, 0):
            raise NotReplayable(f"{scratch} {_meta(compiled, scratch, 0)}")
    if not isinstance(getattr(compiled, "function", None), int) or not compiled.function:
        raise NotReplayable("no loaded function handle")


def _signature_types(compiled: Any) -> list[str]:
    """The kernel's parameter types in order (``constexpr`` for a compile-time one, a specialised 1 included)."""
    sig = compiled.src.signature
    return [str(t) for t in (sig.values() if isinstance(sig, dict) else sig)]


def _index(found: list[Any], item: Any) -> int:
    for i, f in enumerate(found):
        if f is item:
            return i
    found.append(item)
    return len(found) - 1


def _buffer_kind(
    ptr: int, inputs: Sequence[torch.Tensor], out: torch.Tensor, buffers: Buffers
) -> tuple[int, int]:
    """A pointer that is no input: a scratch buffer's start, or a declared constant."""
    device = inputs[0].device if inputs else out.device
    for st in buffers.allocations:
        start = st.data_ptr()
        if start == out.untyped_storage().data_ptr():
            continue
        if ptr == start:
            if st.device != device:
                raise NotReplayable(f"a scratch buffer is on {st.device}, the inputs on {device}")
            return KIND_SCRATCH, _index(buffers.scratch, st)
        if start < ptr < start + st.nbytes():
            raise NotReplayable("a pointer parameter points into a scratch buffer past its start")
    const = _CONSTANTS.get(ptr)
    if const is not None:
        if const.device != device:
            raise NotReplayable(f"a constant is on {const.device}, the inputs on {device}")
        return KIND_CONST, _index(buffers.consts, const)
    raise NotReplayable(
        "a pointer parameter is neither an input, the output, a scratch buffer nor a constant"
    )


def _pointer_kind(
    value: Any, inputs: Sequence[torch.Tensor], out: torch.Tensor, buffers: Buffers
) -> tuple[int, int]:
    if value is None:
        return KIND_NULL, 0
    if not isinstance(value, torch.Tensor):
        raise NotReplayable(f"a pointer parameter is a {type(value).__name__}")
    ptr = value.data_ptr()
    if ptr == out.data_ptr():
        return KIND_OUTPUT, 0
    hits = [i for i, t in enumerate(inputs) if t.data_ptr() == ptr]
    if len(hits) > 1:
        raise NotReplayable(f"a pointer parameter is inputs {hits} at once")
    if not hits:
        return _buffer_kind(ptr, inputs, out, buffers)
    return KIND_INPUT, hits[0]


def recipe_for(
    compiled: Any,
    grid: Sequence[int],
    args: Sequence[Any],
    inputs: Sequence[torch.Tensor],
    out: torch.Tensor,
    buffers: Buffers | None = None,
) -> LaunchRecipe:
    """The replay of one captured launch: ``compiled`` (Triton's compiled kernel), its ``grid``, and ``args``, the
    value of every kernel parameter in signature order; ``buffers``: the call's allocations and what its launches
    so far passed (shared by the call's launches; none: no scratch). Raises ``NotReplayable``."""
    buffers = Buffers() if buffers is None else buffers
    _check_metadata(compiled)
    types = _signature_types(compiled)
    if len(types) != len(args):
        raise NotReplayable(f"{len(args)} arguments for {len(types)} parameters")
    if not 1 <= len(grid) <= 3 or not all(isinstance(g, int) for g in grid):
        raise NotReplayable(f"grid {tuple(grid)!r}")
    g = (*grid, 1, 1)[:3]
    rec = LaunchRecipe(
        int(compiled.function),
        (g[0], g[1], g[2]),
        32 * int(compiled.metadata.num_warps),
        int(compiled.metadata.shared),
    )
    for ty, value in zip(types, args, strict=True):
        if ty == "constexpr":
            continue
        if ty.startswith("*"):
            kind, v = _pointer_kind(value, inputs, out, buffers)
        elif ty in _I32 or ty in _I64:
            if type(value) is not int:
                raise NotReplayable(f"an {ty} parameter is a {type(value).__name__}")
            kind, v = (KIND_I32 if ty in _I32 else KIND_I64), value
        elif ty in _F32:
            if type(value) not in (int, float):
                raise NotReplayable(f"an {ty} parameter is a {type(value).__name__}")
            kind, v = KIND_F32, struct.unpack("<I", struct.pack("<f", float(value)))[0]
        else:
            raise NotReplayable(f"parameter type {ty}")
        rec.kinds.append(kind)
        rec.values.append(v)
    return rec


class AtenWatch(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten ops a recorded call runs (by ``str(func)``) outside ``cache_fill``, and the storage of each tensor
    its allocations returned (held until the watch goes, so no two share a pointer; holding the storage, not the
    tensor, adds no op to the list)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.allocations: list[torch.UntypedStorage] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        if getattr(_LOCAL, "depth", 0) == 0:
            name = str(func)
            self.ops.append(name)
            if name in ALLOC_ATEN and isinstance(result, torch.Tensor):
                self.allocations.append(result.untyped_storage())
        return result


def check_output(out: Any, inputs: Sequence[torch.Tensor], ops: Sequence[str]) -> None:
    """The call's result is one fresh contiguous tensor, and it ran no aten op a replay would skip."""
    extra = sorted({op for op in ops if op not in ALLOWED_ATEN})
    if extra:
        raise NotReplayable(f"it runs {', '.join(extra)}")
    if not isinstance(out, torch.Tensor):
        raise NotReplayable(f"its result is a {type(out).__name__}")
    if not out.is_contiguous() or out.numel() == 0:
        raise NotReplayable("its result is empty or not contiguous")
    if any(out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for t in inputs):
        raise NotReplayable("its result shares an input's memory")


def record(fn: Callable[..., torch.Tensor], args: tuple[Any, ...]) -> torch.Tensor:
    """Run ``fn(*args)`` (a step op's Python implementation) for the pending key, and register what it launched."""
    from ._launch import launcher

    inputs = [a for a in args if isinstance(a, torch.Tensor)]
    bound = launcher()
    captured: list[tuple[Any, Any, tuple[Any, ...]]] = []
    previous, bound.capture = bound.capture, captured
    watch = AtenWatch()
    try:
        with watch:
            out = fn(*args)
    finally:
        bound.capture = previous
    ops = torch.ops.ws1_launch
    buffers = Buffers(watch.allocations)
    try:
        check_output(out, inputs, watch.ops)
        recipes = [recipe_for(c, grid, full, inputs, out, buffers) for c, grid, full in captured]
    except NotReplayable as e:
        shape = list(out.shape) if isinstance(out, torch.Tensor) else []
        ops.commit(shape, torch.float32, len(inputs), [], [], str(e))
        return out
    for r in recipes:
        ops.add_launch(r.function, list(r.grid), r.block, r.shared, r.kinds, r.values)
    ops.commit(list(out.shape), out.dtype, len(inputs), buffers.scratch_bytes(), buffers.consts, "")
    return out


def _pending() -> bool:
    """Whether the C++ side is recording a recipe on this thread (the module's plain function: the twin asks on
    every call, the Python-only keys' calls included, so not through the dispatcher)."""
    return bool(_MODULE.pending())


def twin(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The CUDA kernel of ``ws1_triton::<op>_py``: ``fn``, recording a recipe when the C++ side asks for one."""

    def impl(*args: Any) -> torch.Tensor:
        if _pending():
            return record(fn, args)
        return fn(*args)

    impl.__name__ = f"{getattr(fn, '__name__', 'op')}_py"
    impl.__doc__ = fn.__doc__
    return impl
