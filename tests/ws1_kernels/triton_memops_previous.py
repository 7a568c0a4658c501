"""The kernels that the memory-bound speed work replaced, kept verbatim as the bit-for-bit yardstick.

``ws1_rope_rotate`` computed each token's fp64 angles and cos/sin inside the rotation program (now a table
kernel feeds the rotation); ``ws1_norm_bwd_blocks`` walked its slots with a branch and no pipelining (now a
branch-free, software-pipelined loop).  The tests run these copies beside the current operators and require
the same bits (interpreter: fp32 logic; GPU: bf16 at Qwen3 widths, where the reduction trees are real).
Each copy also takes a deliberately different variant, the negative control that the comparison can fail:
``ANGLE_FP32`` rounds the angle's operands to fp32 before the product, ``REVERSED`` walks the 16 slots of
a wgrad block backwards (another summation order of the block's dW).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ws1_kernels.main_grad import WGRAD_BLOCK, main_grad_of
from ws1_kernels.row_tables import block_table
from ws1_kernels.triton_ops import norm, pointwise
from ws1_kernels.triton_ops._launch import interpreting
from ws1_kernels.triton_ops._memops import COMPILE, precise, row_warps


@triton.jit
def prev_rope_rotate(
    X,
    Y,
    POS,
    INV,
    sign,
    NH,
    HALF,
    PRECISE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    ANGLE_FP32: tl.constexpr,
):  # pragma: no cover (Triton)
    t = tl.program_id(0).to(tl.int64)
    pos = tl.maximum(tl.load(POS + t), 0).to(tl.float64)
    j = tl.arange(0, BLOCK_HALF)
    inv = tl.load(INV + j, mask=j < HALF, other=0.0)
    ang = (pos.to(tl.float32) * inv.to(tl.float32)).to(tl.float64) if ANGLE_FP32 else pos * inv
    if PRECISE:
        c = libdevice.cos(ang).to(tl.float32)
        s = libdevice.sin(ang).to(tl.float32)
    else:
        c = tl.cos(ang).to(tl.float32)
        s = tl.sin(ang).to(tl.float32)
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


def prev_rope(
    x: torch.Tensor, positions: torch.Tensor, theta: float, sign: float, angle_fp32: bool = False
) -> torch.Tensor:
    """The previous rope launch: ``x[T, Nh, D]`` rotated at ``positions`` (``sign`` -1: the backward)."""
    nh, dim = x.shape[1], x.shape[2]
    half = dim // 2
    bh, bhalf = triton.next_power_of_2(nh), triton.next_power_of_2(half)
    y = torch.empty_like(x)
    prev_rope_rotate[(x.shape[0],)](
        x,
        y,
        positions,
        pointwise.inv_freq(theta, dim, x.device),
        sign,
        nh,
        half,
        PRECISE=precise(),
        BLOCK_H=bh,
        BLOCK_HALF=bhalf,
        ANGLE_FP32=angle_fp32,
        num_warps=row_warps(2 * bh * bhalf),
        **COMPILE,
    )
    return y


@triton.jit
def prev_norm_bwd_blocks(
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
    REVERSED: tl.constexpr,
):  # pragma: no cover (Triton)
    p = tl.program_id(0)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    tile = (h < NH) & (d < D)
    w = tl.load(W + d, mask=d < D, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for kk in range(WB):
        k = WB - 1 - kk if REVERSED else kk
        row = tl.load(TABLE + p * WB + k)
        if row >= 0:
            offs = row.to(tl.int64) * NH * D + h * D + d
            x = tl.load(X + offs, mask=tile, other=0.0).to(tl.float32)
            dy = tl.load(DY + offs, mask=tile, other=0.0).to(tl.float32)
            ms = tl.div_rn(tl.sum(x * x, axis=1), d_float)
            r = tl.div_rn(tl.full(ms.shape, 1.0, tl.float32), tl.sqrt_rn(ms + eps))[:, None]
            xhat = x * r
            g = dy * w
            c = tl.div_rn(tl.sum(g * xhat, axis=1), d_float)[:, None]
            dx = r * (g - xhat * c)
            tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=tile)
            acc = acc + dy * xhat
    bsum = tl.sum(acc, axis=0)
    dd = tl.arange(0, BLOCK_D)
    tl.store(
        BSUM + p.to(tl.int64) * D + dd,
        bsum,
        mask=(dd < D) & ((p + tl.zeros([BLOCK_D], tl.int32)) < n_blocks),
    )


def prev_norm_backward(
    x: torch.Tensor,
    weight: torch.Tensor,
    dy: torch.Tensor,
    eps: float,
    ctx,
    reversed_slots: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dx, main_grad)`` of the previous backward launch (main_grad from zeros, the current accumulate)."""
    nh, d = (1, x.shape[1]) if x.dim() == 2 else (x.shape[1], x.shape[2])
    bh, bd, _ = norm._tile(nh, d)
    table = block_table(ctx, x.shape[0], x.device)
    dx = torch.empty_like(x)
    bsum = torch.empty((max(table.n_blocks, 1), d), dtype=torch.float32, device=x.device)
    prev_norm_bwd_blocks[(table.n_programs,)](
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
        REVERSED=reversed_slots,
        num_warps=norm._bwd_warps(bh, bd),
        **COMPILE,
    )
    w = weight.detach().clone()
    mg = main_grad_of(w)
    if table.n_blocks:
        norm.ws1_norm_wgrad_accumulate[(triton.cdiv(d, norm.ACC_COLUMNS),)](
            bsum,
            mg,
            table.n_blocks,
            d,
            BLOCK_C=norm.ACC_COLUMNS,
            UNROLL=norm.ACC_UNROLL_INTERP if interpreting() else norm.ACC_UNROLL,
            num_warps=1,
            **COMPILE,
        )
    return dx, mg
