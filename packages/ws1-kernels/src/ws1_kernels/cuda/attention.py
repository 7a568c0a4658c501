"""attention (cuda_bf16): causal GQA attention within each sample, ``torch.ops.ws1.attn_fwd_tiled`` (or
``attn_fwd``) / ``attn_bwd``.

The forward runs on tensor cores where the widths allow (head dim 128, a query group dividing 64: every model of
the manifest): one CTA per row block, i.e. up to 64 // group consecutive tokens of one sample times the group's
query heads, walking the sample's keys in fixed logical blocks of 64 from position 0 (csrc/kernels/
attention_tiled.cu). Elsewhere one warp per (query row, head) walks the keys one at a time (attention.cu). Either
way a row's bits depend only on the key positions: a packed prefill, a chunked prefill (the earlier keys come as
``ctx.kv_prefix``) and a decode step agree bit for bit, whatever block the row lands in. The host builds, once per
layout and device, where each row's keys start, how many it sees and the row blocks; a call with a prefix lays
each sample's keys out contiguously (prefix, then the call's own rows). The backward is for training calls (whole
samples, no prefix): dq by a walk over the same keys, dk and dv by one warp per (key row, kv head) over the
group's heads and the sample's later rows, in order. No atomics, no split of a reduction.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..backend import OpEntry
from ..context import LayoutContext
from ..errors import KernelInputError
from ..launches import record
from ..op_checks import check_attention
from ._common import check_inputs

KERNEL = "ws1.cuda.attention.fixed_keyblock"
#: the forward on tensor cores (attention_tiled.cu), recorded instead of KERNEL's forward where it runs
TILED_KERNEL = "ws1.cuda.attention.tiled_fwd"
#: query rows per tiled CTA (the kernel's kRows) and the head dim it is built for
TILED_ROWS = 64
TILED_HEAD_DIM = 128


def tiled(hq: int, hkv: int, d: int) -> bool:
    """Whether the tensor-core forward serves these widths (the extension's ``attn_fwd_tiled_supported``). The
    candidate and the step path both ask here, so a rollout and a trainer at the same widths run one kernel."""
    return d == TILED_HEAD_DIM and hkv > 0 and hq % hkv == 0 and TILED_ROWS % (hq // hkv) == 0


@dataclass(frozen=True)
class TiledBackward:
    """A backward that goes with a row-block forward, at the same widths: its kernel id and its op
    ``(q, k, v, o, dout, lse, scale, layout) -> (dq, dk, dv)`` for a training call (whole samples, no prefix)."""

    kernel: str
    call: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class TiledForward:
    """A row-block forward: its kernel id, the query rows a CTA takes, whether it serves given widths, and its op
    ``(q, k, v, key_base, n_keys, blocks, scale) -> (o, lse)``; and the backward that serves the same widths, or
    None for the generic one (``ws1.attn_bwd``, any widths). The generic profile's is attention_tiled.cu's
    (``GENERIC``, the generic backward); the Hopper profile passes its own pair (``cuda_sm90.attention``). The
    tables and the fallback for other widths are the same for both."""

    kernel: str
    rows: int
    supports: Callable[[int, int, int], bool]
    call: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    backward: TiledBackward | None = None

    def tokens(self, hq: int, hkv: int) -> int:
        """Tokens per row block at a query group of ``hq // hkv``."""
        return self.rows // (hq // hkv)


GENERIC = TiledForward(
    TILED_KERNEL,
    TILED_ROWS,
    tiled,
    lambda q, k, v, key_base, n_keys, blocks, scale: torch.ops.ws1.attn_fwd_tiled(
        q, k, v, key_base, n_keys, blocks, scale
    ),
)


@dataclass(frozen=True)
class _Tables:
    key_base: torch.Tensor  # int32 [T]: the key row of the sample's position 0
    n_keys: torch.Tensor  # int32 [T]: the query's position + 1 (0 on pads)
    q_end: torch.Tensor  # int32 [T]: one past the last row of the row's sample (the row itself on pads)
    prefix: bool  # whether any sample of the call brings earlier keys
    #: int32 [n_blocks, 3]: a tiled forward's row blocks (row_blocks), at most `tokens` rows each; None for the
    #: one-warp-per-row forward, which reads no blocks
    blocks: torch.Tensor | None
    tokens: int | None  # tokens per block the table was built for (TiledForward.tokens), or None


_CACHE: weakref.WeakKeyDictionary[LayoutContext, dict[tuple[torch.device, int | None], _Tables]] = (
    weakref.WeakKeyDictionary()
)


def row_blocks(ctx: LayoutContext, rows: int, n_keys: list[int], tokens: int) -> list[tuple[int, int, int]]:
    """The tiled forward's row blocks ``(first row, rows, key count)``: each segment's rows in runs of at most
    ``tokens``, then every run of pad rows (rows no segment holds) likewise with key count 0. A block never spans
    two samples, so its rows share their keys; its key count is the largest ``n_keys`` of its rows.

    The longest walks come first (key count descending, ties in row order): a CTA takes the block of its index, so
    the grid's last wave holds the shortest walks rather than, as in row order, the last sample's longest. A block's
    rows and their operations do not depend on where it sits in the list, so the order is the grid's alone and
    changes no bits."""
    out: list[tuple[int, int, int]] = []
    held = [False] * rows
    for seg in ctx.segments:
        for s in range(seg.start, seg.end, tokens):
            e = min(s + tokens, seg.end)
            out.append((s, e - s, max(n_keys[s:e])))
            held[s:e] = [True] * (e - s)
    r = 0
    while r < rows:
        if held[r]:
            r += 1
            continue
        e = r
        while e < rows and not held[e] and e - r < tokens:
            e += 1
        out.append((r, e - r, 0))
        r = e
    out.sort(key=lambda b: -b[2])  # stable: equal key counts stay in row order
    return out


def _tables(ctx: LayoutContext, rows: int, device: torch.device, tokens: int | None = None) -> _Tables:
    """The call's key tables, once per layout and device; the row blocks only when ``tokens`` (the tiled forward's
    tokens per block) is given."""
    hit = _CACHE.get(ctx, {}).get((device, tokens))
    if hit is not None:
        return hit
    key_base, n_keys, q_end = [0] * rows, [0] * rows, list(range(rows))
    offset = 0
    # with any prefix the keys are laid out anew per segment in call order (prefix rows, then the call's own rows),
    # for every segment: one without a prefix then finds its keys at its offset there, not at its own rows
    prefix = any(seg.first_position > 0 for seg in ctx.segments)
    for seg in ctx.segments:
        plen = seg.first_position
        for r in range(seg.start, seg.end):
            key_base[r] = offset if prefix else seg.start
            n_keys[r] = plen + (r - seg.start) + 1
            q_end[r] = seg.end
        offset += plen + seg.length
    host = torch.tensor([key_base, n_keys, q_end], dtype=torch.int32)
    blocks = None
    if tokens is not None:
        blocks = (
            torch.tensor(row_blocks(ctx, rows, n_keys, tokens), dtype=torch.int32).reshape(-1, 3).to(device)
        )
    dev = host.to(device)
    out = _Tables(dev[0].contiguous(), dev[1].contiguous(), dev[2].contiguous(), prefix, blocks, tokens)
    _CACHE.setdefault(ctx, {})[(device, tokens)] = out
    return out


def _keys(ctx: LayoutContext, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each segment's keys contiguous from position 0 (prefix, then the call's rows), in segment order."""
    ks, vs = [], []
    for seg in ctx.segments:
        pre = ctx.kv_prefix.get(seg.sample_id)
        if pre is not None and pre[0].shape[0]:
            ks.append(pre[0])
            vs.append(pre[1])
        ks.append(k[seg.start : seg.end])
        vs.append(v[seg.start : seg.end])
    return torch.cat(ks).contiguous(), torch.cat(vs).contiguous()


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, lctx, fwd):  # type: ignore[override]
        hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
        on_tiles = fwd.supports(hq, hkv, d)
        tables = _tables(lctx, q.shape[0], q.device, fwd.tokens(hq, hkv) if on_tiles else None)
        k_all, v_all = _keys(lctx, k, v) if tables.prefix else (k, v)
        if on_tiles:
            record(fwd.kernel, "fwd")
            o, lse = fwd.call(q, k_all, v_all, tables.key_base, tables.n_keys, tables.blocks, scale)
        else:
            record(KERNEL, "fwd")
            o, lse = torch.ops.ws1.attn_fwd(q, k_all, v_all, tables.key_base, tables.n_keys, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.tables, ctx.scale, ctx.layout = tables, scale, lctx
        # the forward's own backward where it ran on tiles (the same widths), else the generic one
        ctx.tiled_backward = fwd.backward if on_tiles else None
        return o

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        if ctx.tables.prefix:
            raise KernelInputError("cuda_bf16.attention: no backward for a call with a kv prefix (inference)")
        q, k, v, o, lse = ctx.saved_tensors
        bwd = ctx.tiled_backward
        if bwd is not None:
            record(bwd.kernel, "bwd")
            dq, dk, dv = bwd.call(q, k, v, o, dout.contiguous(), lse, ctx.scale, ctx.layout)
            return dq, dk, dv, None, None, None
        record(KERNEL, "bwd")
        t = ctx.tables
        dq, dk, dv = torch.ops.ws1.attn_bwd(
            q, k, v, o, dout.contiguous(), lse, t.key_base, t.n_keys, t.q_end, ctx.scale
        )
        return dq, dk, dv, None, None, None


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    ctx: LayoutContext,
    *,
    forward: TiledForward = GENERIC,
    where: str = "cuda_bf16.attention",
) -> torch.Tensor:
    """Causal attention within each sample: ``q[T,Hq,D], k[T,Hkv,D], v[T,Hkv,D] -> [T,Hq,D]``; ``forward`` the
    row-block forward where it serves the widths (the profile's choice)."""
    scale = check_attention(where, q, k, v, scale, ctx, None)
    check_inputs(where, ctx, q.shape[0], q=q, k=k, v=v)
    if q.shape[2] > 256:
        raise KernelInputError(f"{where}: head_dim {q.shape[2]} is above 256")
    for sid, (pk, pv) in ctx.kv_prefix.items():
        if pk.device != q.device or pv.device != q.device or pk.dtype != q.dtype or pv.dtype != q.dtype:
            raise KernelInputError(f"{where}: kv_prefix[{sid}] must be {q.dtype} on {q.device}")
    return _Attention.apply(q, k, v, scale, ctx, forward)


# lift_fresh/_to_copy: the host-built key tables (once per call and device); slice/cat: a prefixed call's keys laid
# out per sample; select: the tables' rows; clone: contiguous() of a non-contiguous gradient; detach: autograd
_DECLARED = frozenset(
    {
        "ws1.attn_fwd",
        "ws1.attn_fwd_tiled",
        "ws1.attn_bwd",
        "aten.lift_fresh",
        "aten._to_copy",
        "aten.slice",
        "aten.cat",
        "aten.select",
        "aten.clone",
        "aten.detach",
    }
)
OPS: dict[str, OpEntry] = {"attention": OpEntry(attention, KERNEL, _DECLARED, frozenset({TILED_KERNEL}))}
