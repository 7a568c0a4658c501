"""attention (portable_cpu): causal GQA, streaming (never a [T,T] score matrix), fixed key order.

Each sample is handled alone.  Its queries go in blocks of ``QUERY_BLOCK`` positions and its keys (the
``kv_prefix`` then the call's own rows) in blocks of ``KEY_BLOCK`` positions, both aligned to logical position
0 and zero-filled, so every ``bmm`` has one shape.  For one query the key blocks are walked in ascending order
with an fp32 online softmax; a key block wholly after the query changes nothing (alpha = 1 exactly, p = 0),
so prefill, chunked prefill and decode give the same bits.  Backward (flash style, recomputing the
probabilities from the saved log-sum-exp) accumulates dK/dV over query blocks in ascending position order, so a
sample's key gradients do not depend on where it sits in the batch.  Prefix keys get no gradient (chunked and
decode layouts are inference only).
"""

from __future__ import annotations

import torch

from ..backend import OpEntry
from ..context import LayoutContext, Segment
from ..launches import record
from ..op_checks import check_attention
from . import _math
from ._blocks import KEY_BLOCK, QUERY_BLOCK, tree_sum

KERNEL = "ws1.cpu.attention.fixed_keyblock"
_NEG_INF = float("-inf")


class _Sample:
    """One sample of a call: its rows, its key/value sequence (prefix + own) laid out per query head."""

    def __init__(self, seg: Segment, q, k, v, prefix, group: int):
        self.seg = seg
        self.p0 = seg.first_position
        self.n = seg.length
        self.length = self.p0 + self.n
        nkb = -(-self.length // KEY_BLOCK)
        kk = [k[seg.start : seg.end].float()]
        vv = [v[seg.start : seg.end].float()]
        if prefix is not None:
            kk.insert(0, prefix[0].float())
            vv.insert(0, prefix[1].float())
        hkv, d = k.shape[1], k.shape[2]
        kpad = torch.zeros((nkb * KEY_BLOCK, hkv, d), dtype=torch.float32, device=q.device)
        vpad = torch.zeros_like(kpad)
        torch.cat(kk, out=kpad[: self.length])
        torch.cat(vv, out=vpad[: self.length])
        # [Hq, Lp, D]: kv head j serves query heads j*group ... (j+1)*group-1 (HF repeat_kv order)
        self.k = kpad.repeat_interleave(group, dim=1).transpose(0, 1).contiguous()
        self.v = vpad.repeat_interleave(group, dim=1).transpose(0, 1).contiguous()

    def query_blocks(self):
        """Yield ``(qb, slot0, slot1)``: block index and the slots of the call's rows in that block."""
        first, last = self.p0, self.p0 + self.n - 1
        for qb in range(first // QUERY_BLOCK, last // QUERY_BLOCK + 1):
            lo = max(first, qb * QUERY_BLOCK)
            hi = min(last, (qb + 1) * QUERY_BLOCK - 1)
            yield qb, lo - qb * QUERY_BLOCK, hi - qb * QUERY_BLOCK + 1

    def scores(self, qblk: torch.Tensor, qb: int, kb: int, scale: float):
        """Masked fp32 scores ``[Hq, QB, KB]`` of query block qb against key block kb, and the key blocks."""
        kblk = self.k[:, kb * KEY_BLOCK : (kb + 1) * KEY_BLOCK].contiguous()
        vblk = self.v[:, kb * KEY_BLOCK : (kb + 1) * KEY_BLOCK].contiguous()
        s = torch.bmm(qblk, kblk.transpose(1, 2)) * scale
        qpos = qb * QUERY_BLOCK + torch.arange(QUERY_BLOCK, device=s.device)
        kpos = kb * KEY_BLOCK + torch.arange(KEY_BLOCK, device=s.device)
        visible = (kpos[None, :] <= qpos[:, None]) & (kpos[None, :] < self.length)
        return s.masked_fill(~visible, _NEG_INF), kblk, vblk


def _block_of(x: torch.Tensor, seg: Segment, qb: int, s0: int, s1: int) -> torch.Tensor:
    """fp32 ``[H, QB, D]`` holding rows of x for slots [s0, s1) of query block qb, zeros elsewhere."""
    out = torch.zeros((x.shape[1], QUERY_BLOCK, x.shape[2]), dtype=torch.float32, device=x.device)
    r0 = seg.start + qb * QUERY_BLOCK + s0 - seg.first_position
    out[:, s0:s1] = x[r0 : r0 + (s1 - s0)].float().transpose(0, 1)
    return out


def walk_keys(
    smp: _Sample, qblk: torch.Tensor, qb: int, blocks: range, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fp32 online softmax of query block qb over the key blocks `blocks`, walked in the order given:
    the running max ``m [Hq, QB]``, the denominator ``[Hq, QB]`` and the unnormalised output ``[Hq, QB, D]``."""
    hq, d = qblk.shape[0], qblk.shape[2]
    m = torch.full((hq, QUERY_BLOCK), _NEG_INF, device=qblk.device)
    denom = torch.zeros((hq, QUERY_BLOCK), device=qblk.device)
    acc = torch.zeros((hq, QUERY_BLOCK, d), device=qblk.device)
    for kb in blocks:
        s, _kblk, vblk = smp.scores(qblk, qb, kb, scale)
        m_new = torch.maximum(m, s.amax(-1))
        alpha = _math.exp(m - m_new)
        p = _math.exp(s - m_new.unsqueeze(-1))
        denom = denom * alpha + tree_sum(p, -1)
        acc = acc * alpha.unsqueeze(-1) + torch.bmm(p, vblk)
        m = m_new
    return m, denom, acc


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, lctx):  # type: ignore[override]
        record(KERNEL, "fwd")
        t, hq, d = q.shape
        group = hq // k.shape[1]
        out = torch.zeros((t, hq, d), dtype=torch.float32, device=q.device)
        lse = torch.zeros((t, hq), dtype=torch.float32, device=q.device)
        for seg in lctx.segments:
            smp = _Sample(seg, q, k, v, lctx.kv_prefix.get(seg.sample_id), group)
            for qb, s0, s1 in smp.query_blocks():
                qblk = _block_of(q, seg, qb, s0, s1)
                last_pos = qb * QUERY_BLOCK + s1 - 1
                m, denom, acc = walk_keys(smp, qblk, qb, range(last_pos // KEY_BLOCK + 1), scale)
                r0 = seg.start + qb * QUERY_BLOCK + s0 - seg.first_position
                out[r0 : r0 + s1 - s0] = (acc / denom.unsqueeze(-1))[:, s0:s1].transpose(0, 1)
                lse[r0 : r0 + s1 - s0] = (m + _math.log(denom))[:, s0:s1].transpose(0, 1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.lctx = scale, lctx
        return out.to(torch.bfloat16)

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        record(KERNEL, "bwd")
        q, k, v, out, lse = ctx.saved_tensors
        scale, lctx = ctx.scale, ctx.lctx
        t, hq, d = q.shape
        hkv = k.shape[1]
        group = hq // hkv
        dq = torch.zeros((t, hq, d), dtype=torch.float32, device=q.device)
        dk = torch.zeros((t, hkv, d), dtype=torch.float32, device=q.device)
        dv = torch.zeros((t, hkv, d), dtype=torch.float32, device=q.device)
        for seg in lctx.segments:
            smp = _Sample(seg, q, k, v, lctx.kv_prefix.get(seg.sample_id), group)
            dk_h = torch.zeros_like(smp.k)
            dv_h = torch.zeros_like(smp.v)
            for qb, s0, s1 in smp.query_blocks():
                qblk = _block_of(q, seg, qb, s0, s1)
                doblk = _block_of(dout, seg, qb, s0, s1)
                oblk = _block_of(out, seg, qb, s0, s1)
                lblk = torch.full((hq, QUERY_BLOCK), float("inf"), device=q.device)
                r0 = seg.start + qb * QUERY_BLOCK + s0 - seg.first_position
                lblk[:, s0:s1] = lse[r0 : r0 + s1 - s0].transpose(0, 1)
                di = tree_sum(doblk * oblk, -1).unsqueeze(-1)
                dq_acc = torch.zeros((hq, QUERY_BLOCK, d), device=q.device)
                last_pos = qb * QUERY_BLOCK + s1 - 1
                for kb in range(last_pos // KEY_BLOCK + 1):
                    s, kblk, vblk = smp.scores(qblk, qb, kb, scale)
                    p = _math.exp(s - lblk.unsqueeze(-1))
                    sl = slice(kb * KEY_BLOCK, (kb + 1) * KEY_BLOCK)
                    dv_h[:, sl] += torch.bmm(p.transpose(1, 2), doblk)
                    ds = p * (torch.bmm(doblk, vblk.transpose(1, 2)) - di)
                    dq_acc += torch.bmm(ds, kblk)
                    dk_h[:, sl] += torch.bmm(ds.transpose(1, 2), qblk)
                dq[r0 : r0 + s1 - s0] = (dq_acc * scale)[:, s0:s1].transpose(0, 1)
            own = slice(smp.p0, smp.length)
            dk_s = tree_sum((dk_h * scale).view(hkv, group, -1, d), 1)[:, own]
            dv_s = tree_sum(dv_h.view(hkv, group, -1, d), 1)[:, own]
            dk[seg.start : seg.end] = dk_s.transpose(0, 1)
            dv[seg.start : seg.end] = dv_s.transpose(0, 1)
        bf = torch.bfloat16
        return dq.to(bf), dk.to(bf), dv.to(bf), None, None


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, ctx: LayoutContext
) -> torch.Tensor:
    """Causal GQA attention per sample; keys are ``kv_prefix[s]`` then the call's own rows of s."""
    scale = check_attention("portable_cpu.attention", q, k, v, scale, ctx, torch.bfloat16)
    return _Attention.apply(q, k, v, scale, ctx)


# The aten ops each candidate may dispatch, forward and backward, recorded over every layout type
# (tests/ws1_kernels/test_registry.py re-records them): anything else is a fallback the harness must see.
_DECLARED_ATTENTION = frozenset(
    {
        "aten._to_copy",
        "aten.add",
        "aten.add_",
        "aten.alias",
        "aten.amax",
        "aten.arange",
        "aten.bitwise_and",
        "aten.bitwise_not",
        "aten.bmm",
        "aten.cat",
        "aten.clone",
        "aten.copy_",
        "aten.detach",
        "aten.div",
        "aten.exp",
        "aten.expand",
        "aten.full",
        "aten.le",
        "aten.log",
        "aten.lt",
        "aten.masked_fill",
        "aten.maximum",
        "aten.mul",
        "aten.slice",
        "aten.squeeze",
        "aten.sub",
        "aten.transpose",
        "aten.unsqueeze",
        "aten.view",
        "aten.zeros",
        "aten.zeros_like",
    }
)

OPS: dict[str, OpEntry] = {
    "attention": OpEntry(attention, KERNEL, _DECLARED_ATTENTION),
}
