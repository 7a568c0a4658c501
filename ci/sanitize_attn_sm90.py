"""The Hopper attention forward (`ws1_sm90.attn_fwd`, csrc/sm90/attention_sm90.cu) under compute-sanitizer: one
call in each schedule and CTA shape (128-row blocks on two warpgroups, one token a CTA on one) over packed samples whose lengths
straddle the 64- and 128-key blocks (the wide schedules 5 and 6 walk keys by 128), so the last key block of a sample is partial (its value rows zeroed in shared memory)
and the last sample's box runs past the tensor (TMA's zero fill). It needs the Hopper module (`ws1_cuda_sm90_ext`)
on the path and an sm_90 device; exit 0 when every call returned finite values, else one line and exit 1. Then the
backward (`ws1_sm90.attn_bwd`: dQ, then dV and dK one kernel each, then both in one walk) over the same samples.

    compute-sanitizer --tool racecheck --error-exitcode 1 python ci/sanitize_attn_sm90.py
"""

from __future__ import annotations

import sys

import torch

HQ, HKV, D = 32, 8, 128
LENGTHS = (1, 33, 64, 65, 130)


def main() -> int:
    import ws1_cuda_sm90_ext  # noqa: F401  (registers torch.ops.ws1_sm90)

    from ws1_kernels import LayoutContext
    from ws1_kernels.cuda import attention as generic

    ids = torch.cat([torch.full((n,), s, dtype=torch.int64) for s, n in enumerate(LENGTHS)])
    pos = torch.cat([torch.arange(n, dtype=torch.int64) for n in LENGTHS])
    ctx = LayoutContext(ids, pos)
    n = len(ids)
    q = torch.randn(n, HQ, D, device="cuda").to(torch.bfloat16)
    k = torch.randn(n, HKV, D, device="cuda").to(torch.bfloat16)
    v = torch.randn(n, HKV, D, device="cuda").to(torch.bfloat16)
    from ws1_kernels.cuda_sm90 import attention as sm90_att

    for schedule, block_rows, per_row in (
        (s, r, p)
        for r, p in ((128, False), (64, True))
        for s in sm90_att.schedules(r)
        if s not in sm90_att.PING_PONG
    ):
        t = generic._tables(ctx, n, q.device, block_rows // (HQ // HKV))
        blocks = None if per_row else t.blocks
        o, lse = torch.ops.ws1_sm90.attn_fwd(
            q, k, v, t.key_base, t.n_keys, blocks, block_rows, D**-0.5, schedule
        )
        torch.cuda.synchronize()
        if not (bool(torch.isfinite(o).all()) and bool(torch.isfinite(lse).all())):
            print(f"sanitize_attn_sm90: schedule {schedule} block_rows {block_rows}: a non-finite output")
            return 1
        print(
            f"schedule {schedule} block_rows {block_rows} ({'one token a CTA' if per_row else 'row blocks'}): ok"
        )
    # the backward (ws1_sm90.attn_bwd): dQ, then dV and dK apart and in one walk, over the same samples
    t = generic._tables(ctx, n, q.device, 64 // (HQ // HKV))
    o, lse = torch.ops.ws1_sm90.attn_fwd(
        q, k, v, t.key_base, t.n_keys, t.blocks, 64, D**-0.5, sm90_att.SCHEDULE
    )
    dout = torch.randn_like(o)
    for fuse in (False, True):
        grads = sm90_att.hopper_backward(q, k, v, o, dout, lse, D**-0.5, ctx, fuse_dkv=fuse)
        torch.cuda.synchronize()
        if not all(bool(torch.isfinite(g).all()) for g in grads):
            print(f"sanitize_attn_sm90: the backward (fuse_dkv {fuse}): a non-finite gradient")
            return 1
        print(f"backward (dK and dV {'in one walk' if fuse else 'one kernel each'}): ok")
    # the ping-pong schedules (4, 6) last: a fault in their barrier turns would hang rather than fail
    t = generic._tables(ctx, n, q.device, 128 // (HQ // HKV))
    for schedule in sm90_att.PING_PONG:
        o, lse = torch.ops.ws1_sm90.attn_fwd(q, k, v, t.key_base, t.n_keys, t.blocks, 128, D**-0.5, schedule)
        torch.cuda.synchronize()
        if not bool(torch.isfinite(o).all()):
            print(f"sanitize_attn_sm90: schedule {schedule} block_rows 128: a non-finite output")
            return 1
        print(f"schedule {schedule} block_rows 128 (ping-pong): ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
