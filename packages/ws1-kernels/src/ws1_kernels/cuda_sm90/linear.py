"""det_gemm and lm_head (cuda_bf16_sm90): ``y = x W^T`` on TMA + wgmma (``torch.ops.ws1_sm90.gemm``).

csrc/sm90/gemm_sm90.cuh: CUTLASS 3.x's persistent warp-specialised sm90 kernels, one accumulator chain per output
element over all of K (no split-K, no stream-K), tiles from a frozen table of M buckets (``BUCKETS``). dx is the
same kernel on ``dy W`` (b row-major: N contiguous). The weight gradient (``sample_blocks_main_grad``) is
Hopper's own (``ws1_sm90.wgrad``, csrc/sm90/wgrad_sm90.cu: the blocks gathered, then TMA and wgmma with each
element's chain starting from ``main_grad``) for a weight whose dims are multiples of ``WGRAD_TILE``, and the
generic ``ws1.gemm_wgrad`` for any other weight: a choice by the weight's shape alone, so a parameter's bits come
from one kernel in every layout.
"""

from __future__ import annotations

import torch

from ..backend import OpEntry
from ..context import LayoutContext
from ..cuda import linear as generic
from ..errors import KernelInputError

DET_GEMM = "ws1.cuda_sm90.det_gemm.wgmma"
LM_HEAD = "ws1.cuda_sm90.lm_head.wgmma"
#: the M buckets (upper bounds, inclusive) of csrc/sm90/ws1_sm90.h: 64x32 tiles for decode, 128x128, 128x256
BUCKETS = (64, 1024)
#: leading dims must be multiples of this many elements (16-byte TMA rows)
ALIGN = 8
#: and the tensors must start on a boundary of this many bytes (a TMA descriptor's global address)
ADDRESS_ALIGN = 16


#: the Hopper weight gradient's kernel id, and the tile its weight's dims must be multiples of (kWgradTile)
WGRAD_KERNEL = "ws1.cuda_sm90.wgrad.wgmma"
WGRAD_TILE = 128
#: the variant it launches: (consumer warpgroups a CTA, rows a pipeline stage). One warpgroup (a 128 x 128 tile of
#: main_grad) on 32-row stages in a 4-slot ring takes 64 KB of shared memory, so two CTAs share an SM and one's
#: main_grad load and store overlap the other's MMAs; it was the fastest of the four at every linear and lm_head
#: shape at 512 and 4096 rows on an H100 (docs/cuda_sm90.md). Every variant gives the same bits (the same wgmma atom
#: and the same k-steps on every element's chain), which GPU tests check with controls; so one variant for every
#: weight, never a choice by the batch.
WGRAD_VARIANT = (1, 32)


def _gemm(a: torch.Tensor, b: torch.Tensor, b_trans: bool) -> torch.Tensor:
    return torch.ops.ws1_sm90.gemm(a, b, b_trans)


def _aligned(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` itself, or a copy of it (the same values) when it starts off a 16-byte boundary, which the gather's
    16-byte loads cannot read; a copy, never another kernel, so the choice of kernel stays the shape's."""
    return t if t is None or t.data_ptr() % ADDRESS_ALIGN == 0 else t.clone()


def _wgrad_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    rows: torch.Tensor,
    n_blocks: int,
    mg: torch.Tensor,
    lo: torch.Tensor | None,
) -> None:
    consumers, stage_rows = WGRAD_VARIANT
    _wgrad_kernel(_aligned(dy), _aligned(x), rows, n_blocks, mg, _aligned(lo), consumers, stage_rows)


def _wgrad_kernel(*args: object) -> None:
    """``ws1_sm90.wgrad`` (a seam: the CPU tests record the variant passed)."""
    torch.ops.ws1_sm90.wgrad(*args)


def hopper_wgrad(weight: torch.Tensor) -> tuple[str, generic.WgradOp] | None:
    """The Hopper weight gradient for ``weight`` when both its dims are multiples of ``WGRAD_TILE``, else None
    (the generic one runs): by the weight's shape alone, never the batch's."""
    if weight.shape[0] % WGRAD_TILE or weight.shape[1] % WGRAD_TILE:
        return None
    return WGRAD_KERNEL, _wgrad_op


_DET_GEMM = generic.Gemm(_gemm, DET_GEMM, generic.DET_GEMM, wgrad=hopper_wgrad)
_LM_HEAD = generic.Gemm(_gemm, LM_HEAD, generic.LM_HEAD, wgrad=hopper_wgrad)


def _check_align(where: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    """What TMA needs of the operands, as one-line errors: rows a multiple of 16 bytes, and each tensor starting on
    a 16-byte boundary (a view at an odd element offset does not: its descriptor cannot be encoded, and CUTLASS
    would launch on it anyway)."""
    for name, width in (("K (x's width)", x.shape[-1]), ("N (weight's rows)", weight.shape[0])):
        if width % ALIGN:
            raise KernelInputError(
                f"{where}: {name} = {width} must be a multiple of {ALIGN} (16-byte TMA rows)"
            )
    for name, t in (("x", x), ("weight", weight)):
        if t.data_ptr() % ADDRESS_ALIGN:
            raise KernelInputError(
                f"{where}: {name} starts {t.data_ptr() % ADDRESS_ALIGN} bytes past a {ADDRESS_ALIGN}-byte boundary "
                "(a view at an odd offset); TMA reads from a 16-byte boundary: pass a copy (.clone())"
            )


def det_gemm(x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``x W^T``: ``[T,K], [N,K] -> [T,N]`` (the projections of a decoder layer)."""
    _check_align("cuda_bf16_sm90.det_gemm", x, weight)
    return generic.linear("cuda_bf16_sm90.det_gemm", _DET_GEMM, x, weight, ctx)


def lm_head(x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``x W^T`` over the vocabulary: ``[T,H], [V,H] -> [T,V]``."""
    _check_align("cuda_bf16_sm90.lm_head", x, weight)
    return generic.linear("cuda_bf16_sm90.lm_head", _LM_HEAD, x, weight, ctx)


# clone: _aligned's copy of an operand off a 16-byte boundary
_DECLARED = (generic.DECLARED - {"ws1.gemm"}) | {"ws1_sm90.gemm", "ws1_sm90.wgrad"}
OPS: dict[str, OpEntry] = {
    "det_gemm": OpEntry(det_gemm, DET_GEMM, _DECLARED, frozenset({generic.DET_GEMM, WGRAD_KERNEL})),
    "lm_head": OpEntry(lm_head, LM_HEAD, _DECLARED, frozenset({generic.LM_HEAD, WGRAD_KERNEL})),
}
