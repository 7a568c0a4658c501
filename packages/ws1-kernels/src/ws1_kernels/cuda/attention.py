"""attention (cuda_bf16): causal GQA attention within each sample, ``torch.ops.ws1.attn_fwd`` / ``attn_bwd``.

One warp per (query row, head) walks its sample's keys one at a time from logical position 0 to the query's
position (csrc/kernels/attention.cu), so a row's bits depend only on the key positions: a packed prefill, a
chunked prefill (the earlier keys come as ``ctx.kv_prefix``) and a decode step agree bit for bit. The host builds,
once per call and device, where each row's keys start and how many it sees; a call with a prefix lays each
sample's keys out contiguously (prefix, then the call's own rows). The backward is for training calls (whole
samples, no prefix): dq by the same walk, dk and dv by one warp per (key row, kv head) over the group's heads and
the sample's later rows, in order. No atomics, no split of a reduction.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from ..backend import OpEntry
from ..context import LayoutContext
from ..errors import KernelInputError
from ..launches import record
from ..op_checks import check_attention
from ._common import check_inputs

KERNEL = "ws1.cuda.attention.fixed_keyblock"


@dataclass(frozen=True)
class _Tables:
    key_base: torch.Tensor  # int32 [T]: the key row of the sample's position 0
    n_keys: torch.Tensor  # int32 [T]: the query's position + 1 (0 on pads)
    q_end: torch.Tensor  # int32 [T]: one past the last row of the row's sample (the row itself on pads)
    prefix: bool  # whether any sample of the call brings earlier keys


_CACHE: weakref.WeakKeyDictionary[LayoutContext, dict[torch.device, _Tables]] = weakref.WeakKeyDictionary()


def _tables(ctx: LayoutContext, rows: int, device: torch.device) -> _Tables:
    hit = _CACHE.get(ctx, {}).get(device)
    if hit is not None:
        return hit
    key_base, n_keys, q_end = [0] * rows, [0] * rows, list(range(rows))
    offset = 0
    prefix = False
    for seg in ctx.segments:  # keys laid out per segment in call order: prefix rows, then the call's own rows
        plen = seg.first_position
        prefix = prefix or plen > 0
        for r in range(seg.start, seg.end):
            key_base[r] = offset if plen else seg.start
            n_keys[r] = plen + (r - seg.start) + 1
            q_end[r] = seg.end
        offset += plen + seg.length
    host = torch.tensor([key_base, n_keys, q_end], dtype=torch.int32)
    dev = host.to(device)
    out = _Tables(dev[0].contiguous(), dev[1].contiguous(), dev[2].contiguous(), prefix)
    _CACHE.setdefault(ctx, {})[device] = out
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
    def forward(ctx, q, k, v, scale, lctx):  # type: ignore[override]
        record(KERNEL, "fwd")
        tables = _tables(lctx, q.shape[0], q.device)
        k_all, v_all = _keys(lctx, k, v) if tables.prefix else (k, v)
        o, lse = torch.ops.ws1.attn_fwd(q, k_all, v_all, tables.key_base, tables.n_keys, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.tables, ctx.scale = tables, scale
        return o

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        if ctx.tables.prefix:
            raise KernelInputError("cuda_bf16.attention: no backward for a call with a kv prefix (inference)")
        record(KERNEL, "bwd")
        q, k, v, o, lse = ctx.saved_tensors
        t = ctx.tables
        dq, dk, dv = torch.ops.ws1.attn_bwd(
            q, k, v, o, dout.contiguous(), lse, t.key_base, t.n_keys, t.q_end, ctx.scale
        )
        return dq, dk, dv, None, None


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, ctx: LayoutContext
) -> torch.Tensor:
    """Causal attention within each sample: ``q[T,Hq,D], k[T,Hkv,D], v[T,Hkv,D] -> [T,Hq,D]``."""
    where = "cuda_bf16.attention"
    scale = check_attention(where, q, k, v, scale, ctx, None)
    check_inputs(where, ctx, q.shape[0], q=q, k=k, v=v)
    if q.shape[2] > 256:
        raise KernelInputError(f"{where}: head_dim {q.shape[2]} is above 256")
    for sid, (pk, pv) in ctx.kv_prefix.items():
        if pk.device != q.device or pv.device != q.device or pk.dtype != q.dtype or pv.dtype != q.dtype:
            raise KernelInputError(f"{where}: kv_prefix[{sid}] must be {q.dtype} on {q.device}")
    return _Attention.apply(q, k, v, scale, ctx)


# lift_fresh/_to_copy: the host-built key tables (once per call and device); slice/cat: a prefixed call's keys laid
# out per sample; select: the tables' rows; clone: contiguous() of a non-contiguous gradient; detach: autograd
_DECLARED = frozenset(
    {
        "ws1.attn_fwd",
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
OPS: dict[str, OpEntry] = {"attention": OpEntry(attention, KERNEL, _DECLARED)}
