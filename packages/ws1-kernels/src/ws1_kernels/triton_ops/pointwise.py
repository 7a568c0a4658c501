"""silu, swiglu and rope (triton_cuda_bf16): elementwise fp32 math, one rounding to bf16.

Why these are batch-invariant: no element depends on another (rope's pair lives in the same token), and
every element runs the same instruction sequence wherever it sits in the grid, so its bits depend on its own
inputs only.  The formulas and rounding points are the portable/reference ones, written out with FMA
contraction off (``_memops.COMPILE``) and IEEE division, exactly as torch's own silu kernels (the fp32
reference calls ``F.silu``) write them:
  - ``e = exp(-x)``; silu ``x / (1 + e)``; swiglu ``(g / (1 + e)) * u``;
  - with ``s = 1 / (1 + e)``: silu' ``(dy * s) * (1 + x * (1 - s))`` (``silu_backward``); swiglu
    ``dgate = ((dy * u) * s) * (1 + g * (1 - s))``, ``dup = dy * (g / (1 + e))`` (autograd of silu(g) * u);
  - rope: ``inv = 1 / theta ** (2j / D)`` (fp64, the reference's own torch expression, computed once per
    ``(theta, D)`` on the host), ``angle = pos * inv`` in fp64 (pads use position 0), ``cos``/``sin`` in fp64
    rounded to fp32, then ``y1 = x1*c - x2*s``, ``y2 = x2*c + x1*s`` (HF rotate_half); the backward is the
    same kernel with ``s`` negated (the transpose of the rotation), bit for bit the portable formula.

rope runs in two kernels.  ``ws1_rope_angles`` computes the cos/sin table ``[T, 2, D/2]`` fp32, one angle per
lane; ``ws1_rope_rotate`` (one token per program, all its heads) loads its token's row of the table and
rotates.  The table is built once per ``(context, theta, D, device)`` and shared by q and k of every layer and
by the backward.  Why: when the rotation kernel computed the angles itself, Triton's ``[heads, D/2]`` tile
layout (8 columns x 1 row per thread) made every thread compute the fp64 cos/sin of its 8 columns, 32 copies
per token (178 registers, one 8-warp program per SM: about 660 GB/s on the H200); the rotation alone is
40 registers, six programs per SM (ptxas for sm_90a, offline).  The bits are the same: each angle is the same single fp64 product
``pos * inv``, the same libdevice ``cos``/``sin`` (an elementwise function of its input only, compiled with
the same options), rounded once to fp32 and stored exactly; the rotation reads those fp32 values and does the
same fp32 operations in the same order as before, only where the values come from changed.

Signed zeros follow the formulas: silu(-0) = -0 / 2 = -0, as in ``torch.nn.functional.silu``.  (The portable
candidate writes ``x * s`` and ``dy * (s * ...)``: other rounding points, same math within an ulp or two.)
"""

from __future__ import annotations

import weakref

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .. import _validate as v
from ..backend import OpEntry
from ..context import LayoutContext
from ..errors import KernelInputError
from ..op_checks import check_rope
from . import native, triton_op
from ._launch import check_contiguous, check_device, launch
from ._memops import COMPILE, float_dtype, precise, row_warps

# elements per program of the flat elementwise kernels: 8 warps x 32 threads x 8 values, one 16-byte bf16
# vector load per thread per input.  ptxas (sm_90a, offline) gives swiglu_bwd 74 registers at this shape and
# 156 at 16 values per thread, so about three programs fit per SM instead of one.  A property of the code only,
# never of T; not timed on the H200 yet.
EW_BLOCK = 2048
EW_WARPS = 8


@triton.jit
def _exp(x, PRECISE: tl.constexpr):  # pragma: no cover (Triton)
    if PRECISE:
        return libdevice.exp(x)  # __nv_expf, a couple of ulp (tl.exp is ex2.approx of x*log2(e))
    else:
        return tl.exp(x)


@triton.jit
def _silu_parts(x, PRECISE: tl.constexpr):  # pragma: no cover (Triton)
    """``(silu(x), sigmoid(x))`` as torch computes them: ``x / (1 + exp(-x))`` and ``1 / (1 + exp(-x))``."""
    den = 1.0 + _exp(-x, PRECISE)
    return tl.div_rn(x, den), tl.div_rn(tl.full(x.shape, 1.0, tl.float32), den)


@triton.jit
def ws1_silu_fwd(X, Y, n, PRECISE: tl.constexpr, BLOCK: tl.constexpr):  # pragma: no cover (Triton)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m, other=0.0).to(tl.float32)
    y, _ = _silu_parts(x, PRECISE)
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=m)


@triton.jit
def ws1_silu_bwd(X, DY, DX, n, PRECISE: tl.constexpr, BLOCK: tl.constexpr):  # pragma: no cover (Triton)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=m, other=0.0).to(tl.float32)
    _, s = _silu_parts(x, PRECISE)
    dx = (dy * s) * (1.0 + x * (1.0 - s))
    tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=m)


@triton.jit
def ws1_swiglu_fwd(G, U, Y, n, PRECISE: tl.constexpr, BLOCK: tl.constexpr):  # pragma: no cover (Triton)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(G + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=m, other=0.0).to(tl.float32)
    sg, _ = _silu_parts(g, PRECISE)
    y = sg * u
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=m)


@triton.jit
def ws1_swiglu_bwd(
    G,
    U,
    DY,
    DG,
    DU,
    n,
    DO_DG: tl.constexpr,
    DO_DU: tl.constexpr,
    PRECISE: tl.constexpr,
    BLOCK: tl.constexpr,
):  # pragma: no cover (Triton)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(G + offs, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=m, other=0.0).to(tl.float32)
    sg, s = _silu_parts(g, PRECISE)
    if DO_DG:
        u = tl.load(U + offs, mask=m, other=0.0).to(tl.float32)
        dg = ((dy * u) * s) * (1.0 + g * (1.0 - s))
        tl.store(DG + offs, dg.to(DG.dtype.element_ty), mask=m)
    if DO_DU:
        du = dy * sg
        tl.store(DU + offs, du.to(DU.dtype.element_ty), mask=m)


@triton.jit
def ws1_rope_angles(POS, INV, CS, n, HALF, PRECISE: tl.constexpr, BLOCK: tl.constexpr):  # pragma: no cover
    """The cos/sin table ``CS[t] = (cos[HALF], sin[HALF])`` fp32 of every token: one angle per lane."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    t = i // HALF
    j = i - t * HALF
    pos = tl.maximum(tl.load(POS + t, mask=m, other=0), 0).to(tl.float64)  # pads (position -1): position 0
    inv = tl.load(INV + j, mask=m, other=0.0)
    ang = pos * inv
    if PRECISE:
        c = libdevice.cos(ang).to(tl.float32)
        s = libdevice.sin(ang).to(tl.float32)
    else:
        c = tl.cos(ang).to(tl.float32)
        s = tl.sin(ang).to(tl.float32)
    tl.store(CS + t * 2 * HALF + j, c, mask=m)
    tl.store(CS + t * 2 * HALF + HALF + j, s, mask=m)


@triton.jit
def ws1_rope_rotate(
    X,
    Y,
    CS,
    sign,
    NH,
    HALF,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):  # pragma: no cover (Triton)
    """One token per program: its cos/sin row of the table, then every head (``sign`` = -1: the backward)."""
    t = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    c = tl.load(CS + t * 2 * HALF + j, mask=j < HALF, other=0.0)
    s = tl.load(CS + t * 2 * HALF + HALF + j, mask=j < HALF, other=0.0)
    s = s * sign
    h = tl.arange(0, BLOCK_H)[:, None]
    jj = j[None, :]
    m = (h < NH) & (jj < HALF)
    base = t * NH * 2 * HALF + h * 2 * HALF + jj
    x1 = tl.load(X + base, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(X + base + HALF, mask=m, other=0.0).to(tl.float32)
    c2, s2 = c[None, :], s[None, :]
    y1 = x1 * c2 - x2 * s2
    y2 = x2 * c2 + x1 * s2
    tl.store(Y + base, y1.to(Y.dtype.element_ty), mask=m)
    tl.store(Y + base + HALF, y2.to(Y.dtype.element_ty), mask=m)


def _ew_grid(n: int) -> tuple[int]:
    return (triton.cdiv(n, EW_BLOCK),)


def _ew(kernel, phase: str, *args, **meta) -> None:
    n = args[-1]
    launch(
        kernel,
        _ew_grid(n),
        phase,
        *args,
        PRECISE=precise(),
        BLOCK=EW_BLOCK,
        num_warps=EW_WARPS,
        **meta,
        **COMPILE,
    )


class _Silu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        y = torch.empty_like(x)
        _ew(ws1_silu_fwd, "fwd", x, y, x.numel())
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None
        (x,) = ctx.saved_tensors
        dy = dy.contiguous()
        dx = torch.empty_like(x)
        _ew(ws1_silu_bwd, "bwd", x, dy, dx, x.numel())
        return dx


def swiglu_launch(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` on inputs the caller validated (the candidate, the benchmark entry and the step op
    all launch here)."""
    y = torch.empty_like(gate)
    _ew(ws1_swiglu_fwd, "fwd", gate, up, y, gate.numel())
    return y


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):  # type: ignore[override]
        y = swiglu_launch(gate, up)
        ctx.save_for_backward(gate, up)
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        do_dg, do_du = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
        if not (do_dg or do_du):
            return None, None
        gate, up = ctx.saved_tensors
        return swiglu_backward(gate, up, dy, do_dg=do_dg, do_du=do_du)


def swiglu_backward(
    gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor, *, do_dg: bool = True, do_du: bool = True
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(d gate, d up), each None unless asked: the candidate's backward and the compiled training op's."""
    dy = dy.contiguous()
    dg = torch.empty_like(gate) if do_dg else gate  # an unused pointer stands in
    du = torch.empty_like(up) if do_du else up
    _ew(ws1_swiglu_bwd, "bwd", gate, up, dy, dg, du, gate.numel(), DO_DG=do_dg, DO_DU=do_du)
    return (dg if do_dg else None), (du if do_du else None)


# (theta, head_dim, device) -> fp64 inverse frequencies [head_dim / 2]
_INV_FREQ: dict[tuple[float, int, torch.device], torch.Tensor] = {}


def inv_freq(theta: float, dim: int, device: torch.device) -> torch.Tensor:
    """``1 / theta ** (2j / dim)`` in fp64, by the reference's own torch expression on the host CPU.

    Computed once per ``(theta, dim, device)`` and cached: ``dim / 2`` numbers (64 for Qwen3).  Python's and
    numpy's ``pow`` differ from torch's in the last bit for a few ``j``, so the table is made by torch to give
    the reference's angles bit for bit; the per-token math (angles, cos/sin, rotation) is all in the kernel.
    The table is never written again: it is declared a constant of the step ops' C++ path, and its fill a cache
    fill (``native``), so the rope step op replays in C++ from its first call on.
    """
    key = (theta, dim, torch.device(device))
    hit = _INV_FREQ.get(key)
    if hit is None:
        half = dim // 2
        with native.cache_fill():
            host = 1.0 / (theta ** (torch.arange(0, half, dtype=torch.float64) * 2.0 / dim))
            hit = _INV_FREQ[key] = native.constant(host.to(device))
    return hit


# angles per program of ws1_rope_angles: 4 warps x 32 threads x 8, every lane its own angles (no copies)
ANGLE_BLOCK = 1024
ANGLE_WARPS = 4
# context -> {(theta, head_dim, device): cos/sin table}: q and k of every layer, forward and backward, share the
# positions of one physical call, so its table is built once per call (weak keys: it goes with the context)
_TABLES: weakref.WeakKeyDictionary[LayoutContext, dict[tuple[float, int, torch.device], torch.Tensor]] = (
    weakref.WeakKeyDictionary()
)


def rope_table(positions: torch.Tensor, theta: float, dim: int) -> torch.Tensor:
    """``[T, 2, dim / 2]`` fp32: ``cos`` then ``sin`` of every token's angles, on ``positions``' device."""
    half = dim // 2
    t = positions.shape[0]
    cs = torch.empty((t, 2, half), dtype=torch.float32, device=positions.device)
    n = t * half
    launch(
        ws1_rope_angles,
        (triton.cdiv(n, ANGLE_BLOCK),),
        "fwd",
        positions,
        inv_freq(theta, dim, positions.device),
        cs,
        n,
        half,
        PRECISE=precise(),
        BLOCK=ANGLE_BLOCK,
        num_warps=ANGLE_WARPS,
        **COMPILE,
    )
    return cs


def _ctx_table(ctx: LayoutContext, positions: torch.Tensor, theta: float, dim: int) -> torch.Tensor:
    key = (theta, dim, positions.device)
    tables = _TABLES.setdefault(ctx, {})
    hit = tables.get(key)
    if hit is None:
        hit = tables[key] = rope_table(positions, theta, dim)
    return hit


def _rope_launch(phase: str, x: torch.Tensor, y: torch.Tensor, cs: torch.Tensor, sign: float) -> None:
    nh, dim = x.shape[1], x.shape[2]
    half = dim // 2
    bh, bhalf = triton.next_power_of_2(nh), triton.next_power_of_2(half)
    launch(
        ws1_rope_rotate,
        (x.shape[0],),
        phase,
        x,
        y,
        cs,
        sign,
        nh,
        half,
        BLOCK_H=bh,
        BLOCK_HALF=bhalf,
        num_warps=row_warps(2 * bh * bhalf),
        **COMPILE,
    )


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cs):  # type: ignore[override]
        ctx.save_for_backward(cs)
        return rope_rotate(x, cs)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None, None
        (cs,) = ctx.saved_tensors
        return rope_rotate(dy, cs, backward=True), None


def rope_rotate(x: torch.Tensor, cs: torch.Tensor, *, backward: bool = False) -> torch.Tensor:
    """``x`` rotated by the cos/sin table ``cs`` (``backward``: by its inverse, the gradient): the candidate's
    forward and backward and the compiled training op's."""
    x = x.contiguous()
    y = torch.empty_like(x)
    _rope_launch("bwd" if backward else "fwd", x, y, cs, -1.0 if backward else 1.0)
    return y


def _check_rows(where: str, ctx: LayoutContext, rows: int, **tensors: torch.Tensor) -> None:
    float_dtype(where, **tensors)
    check_device(where, *tensors.values())
    check_contiguous(where, **tensors)
    ctx.check_rows(where, rows)


def silu(x: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``x * sigmoid(x)``: ``[T,F] -> [T,F]``."""
    where = "triton_cuda_bf16.silu"
    v.tensor(where, "x", x, 2, None)
    _check_rows(where, ctx, x.shape[0], x=x)
    return _Silu.apply(x)


def swiglu(gate: torch.Tensor, up: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``silu(gate) * up``: ``[T,F], [T,F] -> [T,F]``."""
    where = "triton_cuda_bf16.swiglu"
    v.tensor(where, "gate", gate, 2, None)
    v.tensor(where, "up", up, 2, None)
    v.dims(where, "up", up, tuple(gate.shape))
    _check_rows(where, ctx, gate.shape[0], gate=gate, up=up)
    return _SwiGLU.apply(gate, up)


def _check_rope_x(where: str, x: torch.Tensor, theta: float, ctx: LayoutContext) -> float:
    v.tensor(where, "x", x, 3, None)
    float_dtype(where, x=x)
    theta = check_rope(where, x, theta, ctx, x.dtype)
    check_device(where, x)
    check_contiguous(where, x=x)
    if triton.next_power_of_2(x.shape[1]) * triton.next_power_of_2(x.shape[2]) > 16384:
        raise KernelInputError(f"{where}: {x.shape[1]} heads x {x.shape[2]} is wider than one program's tile")
    return theta


def rope(x: torch.Tensor, theta: float, ctx: LayoutContext) -> torch.Tensor:
    """Rotary embedding (HF rotate_half) at ``ctx.positions``: ``[T,Nh,D] -> [T,Nh,D]``."""
    where = "triton_cuda_bf16.rope"
    theta = _check_rope_x(where, x, theta, ctx)
    _, positions = ctx.on(x.device)
    return _Rope.apply(x, _ctx_table(ctx, positions, theta, x.shape[2]))


# ---- plain forward entry points (benchmarks: no context, no autograd) ----------------------------------


def swiglu_forward(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``silu(g) * u`` for contiguous ``g``, ``u`` of one shape."""
    where = "triton_cuda_bf16.swiglu_forward"
    if g.shape != u.shape or g.numel() == 0:
        raise KernelInputError(
            f"{where}: g {tuple(g.shape)} and u {tuple(u.shape)} must be one non-empty shape"
        )
    float_dtype(where, g=g, u=u)
    check_device(where, g, u)
    check_contiguous(where, g=g, u=u)
    return swiglu_launch(g, u)


def rope_forward(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of ``x[T,Nh,D]`` at int64 ``positions[T]`` on x's device (negative: position 0)."""
    where = "triton_cuda_bf16.rope_forward"
    if x.dim() != 3 or x.shape[0] == 0 or x.shape[2] % 2:
        raise KernelInputError(f"{where}: x must be [T>0, Nh, even D], got {tuple(x.shape)}")
    if positions.dtype != torch.int64 or tuple(positions.shape) != (x.shape[0],):
        raise KernelInputError(f"{where}: positions must be int64 [{x.shape[0]}], got {positions.dtype}")
    float_dtype(where, x=x)
    check_device(where, x, positions)
    check_contiguous(where, x=x, positions=positions)
    return rope_launch(x, positions, v.positive(where, "theta", theta))


def rope_launch(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding on inputs the caller validated: the call's cos/sin table, then the rotation (the same
    two kernels as the candidate, whose table is cached per context instead)."""
    y = torch.empty_like(x)
    _rope_launch("fwd", x, y, rope_table(positions, theta, x.shape[2]), 1.0)
    return y


# empty/empty_like: outputs; clone: contiguous() of a non-contiguous upstream grad
# detach: autograd's bookkeeping on CUDA (seen on the H200, not on the CPU interpreter)
_EW_OPS = frozenset({"aten.empty", "aten.empty_like", "aten.clone", "aten.detach"})
# rope adds the one-time fp64 inverse-frequency table (arange, mul, div, pow, reciprocal on the host CPU,
# then _to_copy to the device) and the per-call positions copy of ctx.on (_to_copy); its cos/sin table is an
# empty filled by ws1_rope_angles
_ROPE_OPS = _EW_OPS | frozenset(
    {"aten.arange", "aten.mul", "aten.div", "aten.pow", "aten.reciprocal", "aten._to_copy"}
)
OPS: dict[str, OpEntry] = {
    "silu": triton_op(silu, frozenset({"ws1_silu_fwd", "ws1_silu_bwd"}), _EW_OPS, "ws1_silu_fwd"),
    "swiglu": triton_op(swiglu, frozenset({"ws1_swiglu_fwd", "ws1_swiglu_bwd"}), _EW_OPS, "ws1_swiglu_fwd"),
    "rope": triton_op(rope, frozenset({"ws1_rope_angles", "ws1_rope_rotate"}), _ROPE_OPS, "ws1_rope_rotate"),
}
