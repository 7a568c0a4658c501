"""attention (cuda_bf16_sm90): causal GQA attention within each sample on wgmma, the forward
(``torch.ops.ws1_sm90.attn_fwd``, csrc/sm90/attention_sm90.cu) and the backward (``torch.ops.ws1_sm90.attn_bwd``,
csrc/sm90/attention_bwd_sm90.cu).

The forward keeps the generic tiled kernel's rule (row blocks of one sample that share their keys, keys in fixed
logical blocks from position 0, every row reduction in an order fixed by the block and the head dim), so a row's
bits do not depend on the block it lands in: a packed prefill, a chunked prefill and a decode step agree. What
changes is the machine: K and V by TMA from a producer, S and P V on wgmma, the next block's S issued with this
block's P V. The wired schedule walks keys in blocks of 64; the unwired wide schedules (``WIDE``) walk them in
blocks of 128, which gives bits of their own. The host tables (key bases, key counts, row blocks) are the generic module's, built once
per layout.
The backward keeps the same blocks: dQ per row block over the key blocks in ascending order, dK and dV per (key
block, kv head) over the row blocks that see it, in ascending order, with the group's heads summed inside the MMA.
One writer per element, no atomics, so any packing of whole samples gives the same bits. Other widths fall back to
the generic forward and backward, and the kernel ids say which ran.
The step path runs the same forward one token a CTA (``STEP_BLOCK_ROWS``): the rollout and the trainer share it.
"""

from __future__ import annotations

import weakref

import torch

from ..backend import OpEntry
from ..context import LayoutContext
from ..cuda import attention as generic
from ..errors import KernelInputError

KERNEL = "ws1.cuda_sm90.attention.wgmma_fwd"
#: the Hopper backward (csrc/sm90/attention_bwd_sm90.cu), the candidate's backward wherever the forward ran on it
BWD_KERNEL = "ws1.cuda_sm90.attention.wgmma_bwd"
#: keys a key block of the backward's dK/dV CTA (the forward's logical key block)
KEY_BLOCK = 64
#: the backward's dK and dV in one walk over the row blocks (one kernel: S^T, the tile loads and P^T once for both)
#: rather than one kernel each. The same bits either way (a GPU test compares them); a speed choice: 7.6 against
#: 10.5 ms at 8192 tokens and 14.0 against 18.7 ms at 16384 on an H100 (ci/attn_sm90_variants.py --backward, eced04b)
FUSE_DKV = True
#: query rows a CTA of the row-block path takes: one consumer warpgroup of 64 (16 tokens x a group of 4). Two
#: warpgroups of 64 sharing each key block (128) were 2-6% slower on the H200 (ci/attn_sm90_variants.py, 4096-16384
#: tokens): with 64, two CTAs share an SM and progress independently. Every choice gives the same bits
BLOCK_ROWS = 64
#: the step path's CTA (one token, so one warpgroup of 64 rows is plenty)
STEP_BLOCK_ROWS = 64
HEAD_DIM = 128
#: the kernel's loop (ws1_sm90.h, kSchedules): 0 plain on a 2-slot ring, 1 overlapped (block kb's S issued with block
#: kb - 1's P V) on 2 slots, 2 overlapped on 3, 3 overlapped on 2 with Q in registers (64-row blocks only: about 200
#: registers a thread, one CTA an SM), 4 overlapped on 2 with the two warpgroups taking turns to issue (ping-pong;
#: 128-row blocks only). Every schedule gives the same bits (the GPU tests compare them), so this is a speed choice
#: alone: of 0-4, 1 with 64-row blocks was the fastest on the H200 (ci/attn_sm90_variants.py).
#: 5 and 6 are the wide schedules (``WIDE``): keys in logical blocks of 128, m64n128 S tiles, a producer warpgroup
#: that hands its registers to the consumers (setmaxnreg), the overlapped loop (5) or ping-pong (6, 128-row blocks
#: only). A row's online softmax then rescales once per 128 keys, so their bits are their own, the same in every
#: block size and either wide schedule. Not wired, measured on the H200 at 1a8e22b (ci/attn_sm90_variants.py,
#: docs/cuda_sm90.md): 5 at 128 rows is 0.70-0.76x SDPA on 4096-token samples against 0.65-0.70x for 1 at 64 rows,
#: but the same on the bench's 1024-token samples (0.62x and 0.50x against 0.63x and 0.52x), and slower at decode
#: (one token a CTA, 4096 cached keys: 0.87x and 0.84x SDPA at 64 and 256 requests against 0.97x and 0.94x)
SCHEDULE = 1
SCHEDULES = (0, 1, 2, 3, 4, 5, 6)
#: the schedules whose key blocks are 128 keys, not 64 (``key_block``)
WIDE = (5, 6)
#: the schedules whose two warpgroups take turns (128-row blocks only; their tests run apart, last)
PING_PONG = (4, 6)


def schedules(rows: int) -> tuple[int, ...]:
    """The schedules a CTA of ``rows`` query rows can run (the extension's ``attn_fwd_schedule_ok``)."""
    return tuple(s for s in SCHEDULES if not (s == 3 and rows == 128) and not (s in PING_PONG and rows == 64))


def key_block(schedule: int) -> int:
    """Keys a logical key block of ``schedule``: the unit of the online softmax, so of the bits (128 for ``WIDE``)."""
    return 128 if schedule in WIDE else 64


def supports(hq: int, hkv: int, d: int, rows: int = BLOCK_ROWS) -> bool:
    """Whether the Hopper forward serves these widths (the extension's ``attn_fwd_supported``)."""
    return d == HEAD_DIM and hkv > 0 and hq % hkv == 0 and rows % (hq // hkv) == 0


_KBLOCKS: weakref.WeakKeyDictionary[LayoutContext, dict[torch.device, torch.Tensor]] = (
    weakref.WeakKeyDictionary()
)


def key_blocks(ctx: LayoutContext, device: torch.device) -> torch.Tensor:
    """The backward's dK/dV work list, int32 ``[n, 3]``: (the sample's first row, its length, the key block's index
    in it) for every 64 keys of every sample of a training call (whole samples, no prefix), once per layout and
    device. A block's keys, and the row blocks that see them, are fixed in the sample's own positions, so the list
    gives every key the same reduction in any packing."""
    hit = _KBLOCKS.get(ctx, {}).get(device)
    if hit is not None:
        return hit
    rows = [
        (seg.start, seg.length, kb)
        for seg in ctx.segments
        for kb in range((seg.length + KEY_BLOCK - 1) // KEY_BLOCK)
    ]
    # the longest walks first (a key block walks the sample's rows from its own on), so the short ones fill the
    # tail; the order is the grid's alone and changes no bits
    rows.sort(key=lambda r: r[1] - r[2] * KEY_BLOCK, reverse=True)
    out = torch.tensor(rows, dtype=torch.int32).reshape(-1, 3).to(device)
    _KBLOCKS.setdefault(ctx, {})[device] = out
    return out


def hopper_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
    ctx: LayoutContext,
    fuse_dkv: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` by the Hopper backward (``ws1_sm90.attn_bwd``) for a training call at 64-row blocks (the
    forward's row blocks and ``key_blocks``); ``fuse_dkv`` None for the wired choice (``FUSE_DKV``)."""
    if any(seg.first_position > 0 for seg in ctx.segments):
        raise KernelInputError("cuda_bf16_sm90.attention: no backward for a call with a kv prefix")
    hq, hkv = q.shape[1], k.shape[1]
    t = generic._tables(ctx, q.shape[0], q.device, 64 // (hq // hkv))
    return torch.ops.ws1_sm90.attn_bwd(
        q,
        k,
        v,
        o,
        dout.contiguous(),
        lse,
        t.key_base,
        t.n_keys,
        t.blocks,
        key_blocks(ctx, q.device),
        scale,
        FUSE_DKV if fuse_dkv is None else fuse_dkv,
    )


#: the forward and its backward, as the generic module's attention takes them
FORWARD = generic.TiledForward(
    KERNEL,
    BLOCK_ROWS,
    supports,
    lambda q, k, v, key_base, n_keys, blocks, scale: torch.ops.ws1_sm90.attn_fwd(
        q, k, v, key_base, n_keys, blocks, BLOCK_ROWS, scale, SCHEDULE
    ),
    generic.TiledBackward(BWD_KERNEL, hopper_backward),
)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, ctx: LayoutContext
) -> torch.Tensor:
    """Causal attention within each sample: ``q[T,Hq,D], k[T,Hkv,D], v[T,Hkv,D] -> [T,Hq,D]``."""
    return generic.attention(q, k, v, scale, ctx, forward=FORWARD, where="cuda_bf16_sm90.attention")


OPS: dict[str, OpEntry] = {
    "attention": OpEntry(
        attention,
        KERNEL,
        generic.OPS["attention"].declared_ops | {"ws1_sm90.attn_fwd", "ws1_sm90.attn_bwd"},
        frozenset({BWD_KERNEL, generic.KERNEL}),
    )
}
