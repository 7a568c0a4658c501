"""rms_norm and qk_norm (triton_cuda_bf16): one token per program, fixed-order row sums, dW by sample blocks.

Forward: program ``t`` loads token ``t`` as an ``[NH, D]`` tile (``NH = 1, D = H`` for rms_norm; the heads
for qk_norm), zero-filled to powers of two, and reduces each row with ``tl.sum`` over that fixed tile.  The
tile shape and warp count depend only on ``(NH, D)``, so a row's reduction tree, and so its bits, never
depend on T, on the other rows or on the grid.  Math as the fp32 reference: ``ms = sum(x*x) / D``,
``r = 1 / sqrt(ms + eps)`` (IEEE ``sqrt_rn`` and ``div_rn``), ``y = (x * r) * w``, one rounding to bf16.

Backward (``sample_blocks_main_grad``): one program per wgrad block (16 positions of one sample, aligned to
its position 0, empty slots zero-filled; a host-built table from ``ctx.segments``).  It walks its 16 slots
in order; per row it recomputes ``r``, writes ``dx = r * (g - xhat * c)`` (``g = dy*w``,
``c = sum(g*xhat) / D``) and adds ``dy * xhat`` into an fp32 block accumulator (slot order, then a tree over
heads for qk_norm).  The block sums ``[n_blocks, D]`` then go into ``weight.main_grad`` in block order, one
add per block, by ``ws1_norm_wgrad_accumulate`` (each program owns 32 columns and walks every block): the
portable rule's semantics (sum within a block, then add it to main_grad), never a split that depends on the
number of rows or SMs.  Pad rows get their dx from extra programs that store no block sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _validate as v
from ..backend import OpEntry
from ..context import LayoutContext
from ..errors import KernelInputError
from ..main_grad import WGRAD_BLOCK, check_main_grad, main_grad_of
from ..row_tables import BlockTable, block_table
from . import triton_op
from ._launch import check_contiguous, check_device, interpreting, launch
from ._memops import COMPILE, float_dtype, row_warps

MAX_TILE = 16384  # widest [NH, D] tile one program holds in registers (Qwen3-8B: 4096 for both ops)
ACC_COLUMNS = 32  # main_grad columns per accumulate program: one warp, one fp32 per thread, 128-byte loads
# block sums loaded before their in-order adds: the chain of adds is sequential per column, so the loads are
# what can overlap; 32 in flight keeps a 1024-block walk at about 32 memory latencies (not measured yet).
# The interpreter uses 4 (the same adds in the same order; 8x fewer Python-level steps on tiny inputs).
ACC_UNROLL = 32
ACC_UNROLL_INTERP = 4


@triton.jit
def ws1_norm_fwd(
    X, W, Y, eps, d_float, NH, D, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr
):  # pragma: no cover (Triton)
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < NH) & (d < D)
    offs = t * NH * D + h * D + d
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + d, mask=d < D, other=0.0).to(tl.float32)
    ms = tl.div_rn(tl.sum(x * x, axis=1), d_float)
    r = tl.div_rn(tl.full(ms.shape, 1.0, tl.float32), tl.sqrt_rn(ms + eps))[:, None]
    y = (x * r) * w
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def ws1_norm_bwd_blocks(
    X,
    W,
    DY,
    DX,
    BSUM,
    TABLE,
    n_blocks,
    eps,
    d_float,
    NH,
    D,
    WB: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DO_DX: tl.constexpr,
    DO_DW: tl.constexpr,
):  # pragma: no cover (Triton)
    p = tl.program_id(0)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    tile = (h < NH) & (d < D)
    w = tl.load(W + d, mask=d < D, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for k in range(WB):  # a loop, not unrolled: 16 copies of a 4096-wide body took 15-50 s to compile
        row = tl.load(TABLE + p * WB + k)
        if row >= 0:  # an empty slot is a zero row: it adds nothing, so it is skipped
            offs = row.to(tl.int64) * NH * D + h * D + d
            x = tl.load(X + offs, mask=tile, other=0.0).to(tl.float32)
            dy = tl.load(DY + offs, mask=tile, other=0.0).to(tl.float32)
            ms = tl.div_rn(tl.sum(x * x, axis=1), d_float)
            r = tl.div_rn(tl.full(ms.shape, 1.0, tl.float32), tl.sqrt_rn(ms + eps))[:, None]
            xhat = x * r
            if DO_DX:
                g = dy * w
                c = tl.div_rn(tl.sum(g * xhat, axis=1), d_float)[:, None]
                dx = r * (g - xhat * c)
                tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=tile)
            if DO_DW:
                acc = acc + dy * xhat  # slot order; the zero-filled tile lanes add zeros
    if DO_DW:
        bsum = tl.sum(acc, axis=0)  # [BLOCK_D]: the heads of the block (rms_norm: one)
        dd = tl.arange(0, BLOCK_D)
        tl.store(
            BSUM + p.to(tl.int64) * D + dd,
            bsum,
            mask=(dd < D) & ((p + tl.zeros([BLOCK_D], tl.int32)) < n_blocks),
        )


@triton.jit
def ws1_norm_wgrad_accumulate(
    BSUM, MG, n_blocks, D, BLOCK_C: tl.constexpr, UNROLL: tl.constexpr
):  # pragma: no cover (Triton)
    c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = c < D
    acc = tl.load(MG + c, mask=cm, other=0.0)
    for b0 in range(0, n_blocks, UNROLL):
        for k in tl.static_range(UNROLL):
            b = b0 + k
            live = (
                b + tl.zeros([BLOCK_C], tl.int32)
            ) < n_blocks  # full-shape masks (the interpreter needs them)
            s = tl.load(BSUM + b.to(tl.int64) * D + c, mask=cm & live, other=0.0)
            acc = tl.where(live, acc + s, acc)  # one add per block, in block order
    tl.store(MG + c, acc, mask=cm)


def _tile(nh: int, d: int) -> tuple[int, int, int]:
    """(BLOCK_H, BLOCK_D, num_warps) of the forward: a function of the row shape only, never of T."""
    bh, bd = triton.next_power_of_2(nh), triton.next_power_of_2(d)
    return bh, bd, row_warps(bh * bd)


def _bwd_warps(bh: int, bd: int) -> int:
    """The backward holds about five live tiles: twice the forward's warps (ptxas for sm_90a, offline: the
    qk_norm 32x128 tile needs 228 registers at 8 warps, 112 at 16, and spills at 4; rms_norm 4096 wide 125
    at 8, 79 at 16).  Never depends on T."""
    return min(16, 2 * row_warps(bh * bd))


def norm_launch(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """The forward kernel on inputs the caller validated: every forward path (the candidate, the benchmark
    entry, the step op) goes through here, so they launch one kernel with one tile."""
    nh, d = (1, x.shape[1]) if x.dim() == 2 else (x.shape[1], x.shape[2])
    bh, bd, warps = _tile(nh, d)
    y = torch.empty_like(x)
    launch(
        ws1_norm_fwd,
        (x.shape[0],),
        "fwd",
        x,
        w,
        y,
        eps,
        float(d),
        nh,
        d,
        BLOCK_H=bh,
        BLOCK_D=bd,
        num_warps=warps,
        **COMPILE,
    )
    return y


class _Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, lctx):  # type: ignore[override]
        y = norm_launch(x, weight, eps)
        ctx.save_for_backward(x, weight)
        ctx.eps, ctx.lctx, ctx.shape = (
            eps,
            lctx,
            (1, x.shape[1]) if x.dim() == 2 else (x.shape[1], x.shape[2]),
        )
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        do_dx, do_dw = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
        if not (do_dx or do_dw):
            return None, None, None, None
        table = block_table(ctx.lctx, x.shape[0], x.device)
        mg = main_grad_of(weight) if do_dw and table.n_blocks else None
        dx = norm_backward(x, weight, dy, ctx.eps, table, mg, do_dx=do_dx, do_dw=do_dw)
        return dx, None, None, None


def norm_backward(
    x: torch.Tensor,
    weight: torch.Tensor,
    dy: torch.Tensor,
    eps: float,
    table: BlockTable,
    mg: torch.Tensor | None,
    *,
    do_dx: bool,
    do_dw: bool,
) -> torch.Tensor | None:
    """dx (None unless ``do_dx``), and ``mg += dw`` block by block in ``table``'s order (``mg``: the weight's
    main_grad, needed when ``do_dw`` and the table has blocks): the candidate's backward and the compiled
    training op's (``train_ops``) both run here."""
    dy = dy.contiguous()
    nh, d = (1, x.shape[1]) if x.dim() == 2 else (x.shape[1], x.shape[2])
    bh, bd, _ = _tile(nh, d)
    warps = _bwd_warps(bh, bd)
    n_prog = table.n_programs if do_dx else table.n_blocks
    dx = torch.empty_like(x) if do_dx else x  # x stands in for the unused pointer
    bsum = torch.empty((max(table.n_blocks, 1), d), dtype=torch.float32, device=x.device) if do_dw else x
    if n_prog:
        launch(
            ws1_norm_bwd_blocks,
            (n_prog,),
            "bwd",
            x,
            weight,
            dy,
            dx,
            bsum,
            table.rows,
            table.n_blocks,
            eps,
            float(d),
            nh,
            d,
            WB=WGRAD_BLOCK,
            BLOCK_H=bh,
            BLOCK_D=bd,
            DO_DX=do_dx,
            DO_DW=do_dw,
            num_warps=warps,
            **COMPILE,
        )
    if do_dw and table.n_blocks:
        assert mg is not None, "norm_backward: the weight gradient needs its main_grad"
        launch(
            ws1_norm_wgrad_accumulate,
            (triton.cdiv(d, ACC_COLUMNS),),
            "bwd",
            bsum,
            mg,
            table.n_blocks,
            d,
            BLOCK_C=ACC_COLUMNS,
            UNROLL=ACC_UNROLL_INTERP if interpreting() else ACC_UNROLL,
            num_warps=1,
            **COMPILE,
        )
    return dx if do_dx else None


def _check(where: str, x: torch.Tensor, weight: torch.Tensor, eps: float, ctx: LayoutContext) -> float:
    float_dtype(where, x=x, weight=weight)
    check_device(where, x, weight)
    check_contiguous(where, x=x, weight=weight)
    nh, d = (1, x.shape[1]) if x.dim() == 2 else (x.shape[1], x.shape[2])
    if nh == 0 or d == 0:
        raise KernelInputError(f"{where}: x has an empty row shape {tuple(x.shape)}")
    bh, bd = triton.next_power_of_2(nh), triton.next_power_of_2(d)
    if bh * bd > MAX_TILE:
        raise KernelInputError(f"{where}: row tile {nh}x{d} is wider than {MAX_TILE} elements")
    eps = v.positive(where, "eps", eps)
    ctx.check_rows(where, x.shape[0])
    check_main_grad(where, weight)
    return eps


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, ctx: LayoutContext) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the hidden dim: ``[T,H] -> [T,H]``."""
    where = "triton_cuda_bf16.rms_norm"
    v.tensor(where, "x", x, 2, None)
    v.tensor(where, "weight", weight, 1, None)
    v.dims(where, "weight", weight, (x.shape[1],))
    eps = _check(where, x, weight, eps, ctx)
    return _Norm.apply(x, weight, eps, ctx)


def qk_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, ctx: LayoutContext) -> torch.Tensor:
    """RMS norm of every head over head_dim: ``[T,Nh,D] -> [T,Nh,D]``, one weight ``[D]`` shared by heads."""
    where = "triton_cuda_bf16.qk_norm"
    v.tensor(where, "x", x, 3, None)
    v.tensor(where, "weight", weight, 1, None)
    v.dims(where, "weight", weight, (x.shape[2],))
    eps = _check(where, x, weight, eps, ctx)
    return _Norm.apply(x, weight, eps, ctx)


def rms_norm_forward(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Forward only, no context (benchmarks): ``x[T,H]`` or ``x[T,Nh,D]`` normalised over the last dim."""
    where = "triton_cuda_bf16.rms_norm_forward"
    if x.dim() not in (2, 3) or w.dim() != 1 or w.shape[0] != x.shape[-1] or x.shape[0] == 0:
        raise KernelInputError(f"{where}: need x [T,H] or [T,Nh,D] and w [last dim], got {tuple(x.shape)}")
    float_dtype(where, x=x, w=w)
    check_device(where, x, w)
    check_contiguous(where, x=x, w=w)
    return norm_launch(x, w, v.positive(where, "eps", eps))


_KERNELS = frozenset({"ws1_norm_fwd", "ws1_norm_bwd_blocks", "ws1_norm_wgrad_accumulate"})
# empty/empty_like: outputs and the block sums; zeros: main_grad created lazily; lift_fresh/_to_copy: the
# host-built block table (once per call and device); clone: contiguous() of a non-contiguous upstream grad
_DECLARED = frozenset(
    {
        "aten.empty",
        "aten.empty_like",
        "aten.zeros",
        "aten.lift_fresh",
        "aten._to_copy",
        "aten.clone",
        "aten.view",
        "aten.detach",  # autograd's bookkeeping on CUDA (seen on the H200, not on the CPU interpreter)
    }
)
OPS: dict[str, OpEntry] = {
    "rms_norm": triton_op(rms_norm, _KERNELS, _DECLARED, "ws1_norm_fwd"),
    "qk_norm": triton_op(qk_norm, _KERNELS, _DECLARED, "ws1_norm_fwd"),
}
