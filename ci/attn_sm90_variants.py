"""Time the Hopper attention forward's schedules and CTA shapes beside torch's default SDPA, in one process.

Every variant (`ws1_sm90.attn_fwd` with block_rows 64 or 128 and schedule 0-4) gives the same bits (the GPU
tests prove it), so which one `cuda_sm90.attention` wires is a speed choice alone; this script makes it. The wide
schedules 5 and 6 (128-key blocks) give bits of their own, the same as each other. For each
token count it builds packed causal samples of `--seq` tokens at Qwen3-8B's widths (32 query heads, 8 kv heads, head
dim 128), times each variant and SDPA (`enable_gqa`, default backend, on [B, H, S, D] views) with CUDA events
(median of `--reps` calls after `--warmup`), checks each variant's output bit for bit against the first of its key
block (64 or 128), and writes
one JSON record: device, torch version, figures in ms and TFLOP/s (4 x causal pairs x Hq x D), ratios to SDPA.

    python ci/attn_sm90_variants.py --tokens 4096 --tokens 16384 --seq 4096 --out variants.json
    ncu -k regex:ws1_sm90_attn_fwd python ci/attn_sm90_variants.py --variant 64:1 --no-sdpa --tokens 16384 --out x.json

Bad arguments: one line and exit 2. A variant whose bits differ (a forward variant, or with --backward the backward's
dK and dV in one walk against one kernel each): its record says so and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HQ, HKV, D = 32, 8, 128
#: (block rows, schedule): schedule 3 (Q in registers) takes 64-row blocks only, 4 and 6 (ping-pong) 128 only
VARIANTS = [
    (rows, schedule)
    for schedule in (0, 1, 2, 3, 4, 5, 6)
    for rows in (128, 64)
    if (rows, schedule) not in ((128, 3), (64, 4), (64, 6))
]
#: the schedules whose logical key blocks are 128 keys (their bits are their own): cuda_sm90.attention.WIDE
WIDE = (5, 6)


class ArgError(Exception):
    """A bad argument: the message is the one line printed before exit 2."""


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, action="append", help="packed tokens a call (repeatable)")
    ap.add_argument("--seq", type=int, default=4096, help="tokens a sample (default 4096)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--variant",
        action="append",
        metavar="ROWS:SCHEDULE",
        help="time only these (repeatable; default all)",
    )
    ap.add_argument("--no-sdpa", action="store_true", help="skip SDPA (for a profiler run of one variant)")
    ap.add_argument(
        "--backward",
        action="store_true",
        help="also time the Hopper backward (ws1_sm90.attn_bwd) beside SDPA's backward and the generic ws1.attn_bwd",
    )
    ap.add_argument(
        "--decode",
        type=int,
        metavar="CACHE",
        help="also time decode: --decode-batch requests of one query after CACHE cached keys, each key block's "
        "overlapped schedule (1, and the wide 5) one token a CTA (the step path) and in the trainer's row blocks, "
        "beside SDPA's decode",
    )
    ap.add_argument(
        "--decode-batch", type=int, action="append", metavar="B", help="requests (repeatable; default 64)"
    )
    ap.add_argument("--out", type=Path, required=True)
    ns = ap.parse_args(argv)
    ns.variants = VARIANTS
    if ns.variant:
        try:
            ns.variants = [tuple(int(x) for x in v.split(":")) for v in ns.variant]
        except ValueError:
            raise ArgError(f"--variant {ns.variant}: ROWS:SCHEDULE, e.g. 64:3") from None
        bad = [v for v in ns.variants if v not in VARIANTS]
        if bad:
            raise ArgError(f"--variant {bad[0]}: not one of {VARIANTS}")
    ns.tokens = ns.tokens or [4096, 8192, 16384]
    ns.decode_batch = ns.decode_batch or [64]
    if ns.decode is not None and (ns.decode < 1 or min(ns.decode_batch) < 1):
        raise ArgError("--decode and --decode-batch must be at least 1")
    if ns.seq < 1 or ns.reps < 1 or ns.warmup < 0:
        raise ArgError("--seq and --reps must be at least 1, --warmup at least 0")
    for t in ns.tokens:
        if t < 1 or t % min(ns.seq, t):
            raise ArgError(
                f"--tokens {t}: must be a positive multiple of --seq {ns.seq} (or smaller than it)"
            )
    if ns.out.exists():
        raise ArgError(f"--out {ns.out}: exists; nothing is overwritten")
    return ns


def _time(fn, reps: int, warmup: int) -> float:  # type: ignore[no-untyped-def]
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _backward(ctx, q, k, v, qs, ks, vs, flops: float, ns: argparse.Namespace) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """The Hopper backward, the generic one and SDPA's, each on its own forward's outputs (2.5x the forward's work)."""
    import torch
    import torch.nn.functional as F

    from ws1_kernels.cuda import attention as generic
    from ws1_kernels.cuda_sm90 import attention as sm90_att

    dout = torch.randn_like(q)
    t = generic._tables(ctx, q.shape[0], q.device, 64 // (HQ // HKV))
    o, lse = torch.ops.ws1_sm90.attn_fwd(
        q, k, v, t.key_base, t.n_keys, t.blocks, 64, D**-0.5, sm90_att.SCHEDULE
    )
    hopper = _time(
        lambda: sm90_att.hopper_backward(q, k, v, o, dout, lse, D**-0.5, ctx), max(2, ns.reps // 4), ns.warmup
    )
    # dK and dV in one walk (FUSE_DKV's other side), timed and checked against the wired choice's bits
    other = not sm90_att.FUSE_DKV
    fused = _time(
        lambda: sm90_att.hopper_backward(q, k, v, o, dout, lse, D**-0.5, ctx, fuse_dkv=other),
        max(2, ns.reps // 4),
        ns.warmup,
    )
    a = sm90_att.hopper_backward(q, k, v, o, dout, lse, D**-0.5, ctx)
    b = sm90_att.hopper_backward(q, k, v, o, dout, lse, D**-0.5, ctx, fuse_dkv=other)
    other_same = all(
        bool(torch.equal(x.view(torch.int16), y.view(torch.int16))) for x, y in zip(a, b, strict=True)
    )
    gt = generic._tables(ctx, q.shape[0], q.device, None)
    gen = _time(
        lambda: torch.ops.ws1.attn_bwd(q, k, v, o, dout, lse, gt.key_base, gt.n_keys, gt.q_end, D**-0.5),
        2,
        1,
    )
    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (qs, ks, vs))
    out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, scale=D**-0.5, enable_gqa=True)
    go = torch.randn_like(out)
    sdpa = _time(lambda: torch.autograd.grad(out, (qg, kg, vg), go, retain_graph=True), ns.reps, ns.warmup)
    rec = {
        "hopper_ms": hopper,
        "generic_ms": gen,
        "sdpa_ms": sdpa,
        "hopper_tflops": 2.5 * flops / hopper / 1e9,
        "ratio_to_sdpa": sdpa / hopper,
        "generic_ratio_to_sdpa": sdpa / gen,
        "fuse_dkv": sm90_att.FUSE_DKV,
        "other_fuse_dkv_ms": fused,
        "other_fuse_dkv_ratio_to_sdpa": sdpa / fused,
        "other_fuse_dkv_same_bits": other_same,
    }
    print(
        f"backward: hopper {hopper:.3f} ms ({rec['ratio_to_sdpa']:.2f}x SDPA {sdpa:.3f} ms; fuse_dkv "
        f"{sm90_att.FUSE_DKV}), with fuse_dkv {other} {fused:.3f} ms ({sdpa / fused:.2f}x, bits "
        f"{'same' if other_same else 'DIFFER'}), generic {gen:.3f} ms",
        flush=True,
    )
    return rec


def _variant(rows: int, schedule: int, kb: int, ms: float, same: bool, **extra: object) -> dict[str, object]:
    """One variant's record: its shape, key block, time and whether its bits are its key block's first variant's;
    ``extra`` adds the rate of its run (TFLOP/s for prefill, GB/s for decode) and the decode's CTA mode."""
    return {"block_rows": rows, "schedule": schedule, "key_block": kb, **extra, "ms": ms, "same_bits": same}


def _bits_and_time(call, kb: int, first: dict, ns: argparse.Namespace) -> tuple[bool, float]:  # type: ignore[no-untyped-def]
    """Whether ``call``'s output has the bits of the first output of key block ``kb`` (recorded here if it is the
    first), and its median time in ms."""
    import torch

    out = call()
    ref = first.setdefault(kb, out)
    return bool(torch.equal(out.view(torch.int16), ref.view(torch.int16))), _time(call, ns.reps, ns.warmup)


#: decode variants: (block rows, schedule, one token a CTA): the step path (no table) and the trainer's row blocks
DECODE_VARIANTS = ((64, 1, True), (64, 5, True), (64, 1, False), (128, 5, False))


def _decode(ns: argparse.Namespace, batch: int) -> tuple[dict[str, object], int]:
    """Decode at ``batch`` requests of one query token after ``ns.decode`` cached keys (each request's keys
    contiguous): each of DECODE_VARIANTS and SDPA's decode (one query on [B, Hkv, C + 1, D] views), GB/s of the K and
    V read; each variant's bits against the first of its key block."""
    import torch
    import torch.nn.functional as F

    c = ns.decode + 1
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, HQ, D, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(batch * c, HKV, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    key_base = torch.arange(batch, dtype=torch.int32, device="cuda") * c
    n_keys = torch.full((batch,), c, dtype=torch.int32, device="cuda")
    blocks = torch.stack(
        [torch.arange(batch), torch.ones(batch, dtype=torch.int64), torch.full((batch,), c)], 1
    )
    blocks = blocks.to(torch.int32).cuda()
    kv_bytes = 2.0 * batch * c * HKV * D * 2
    rec: dict[str, object] = {"batch": batch, "cache": ns.decode, "variants": []}
    first: dict[int, torch.Tensor] = {}
    status = 0
    for rows, schedule, per_token in DECODE_VARIANTS:

        def call(rows=rows, schedule=schedule, per_token=per_token):  # type: ignore[no-untyped-def]
            return torch.ops.ws1_sm90.attn_fwd(
                q, k, v, key_base, n_keys, None if per_token else blocks, rows, D**-0.5, schedule
            )[0]

        kb = 128 if schedule in WIDE else 64
        same, ms = _bits_and_time(call, kb, first, ns)
        status |= 0 if same else 1
        rec["variants"].append(  # type: ignore[union-attr]
            _variant(rows, schedule, kb, ms, same, one_token_a_cta=per_token, gbs=kv_bytes / ms / 1e6)
        )
    qs = q.view(batch, 1, HQ, D).transpose(1, 2)
    ks, vs = (x.view(batch, c, HKV, D).transpose(1, 2) for x in (k, v))
    sdpa = _time(
        lambda: F.scaled_dot_product_attention(qs, ks, vs, scale=D**-0.5, enable_gqa=True), ns.reps, ns.warmup
    )
    rec["sdpa_ms"] = sdpa
    for var in rec["variants"]:  # type: ignore[union-attr]
        var["ratio_to_sdpa"] = sdpa / var["ms"]
        print(
            f"decode batch {batch} cache {ns.decode} rows {var['block_rows']} schedule {var['schedule']} "
            f"({'one token a CTA' if var['one_token_a_cta'] else 'row blocks'}): {var['ms']:.3f} ms "
            f"({var['gbs']:.0f} GB/s, {var['ratio_to_sdpa']:.2f}x SDPA {sdpa:.3f} ms) bits "
            f"{'same' if var['same_bits'] else 'DIFFER'}",
            flush=True,
        )
    return rec, status


def run(ns: argparse.Namespace) -> int:
    import torch
    import torch.nn.functional as F
    import ws1_cuda_sm90_ext  # noqa: F401  (registers torch.ops.ws1_sm90)

    from ws1_kernels import LayoutContext
    from ws1_kernels.cuda import attention as generic

    records, status = [], 0
    for tokens in ns.tokens:
        seq = min(ns.seq, tokens)
        b = tokens // seq
        ctx = LayoutContext(torch.arange(b).repeat_interleave(seq), torch.arange(seq).repeat(b))
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (
            torch.randn(tokens, h, D, device="cuda", generator=g).to(torch.bfloat16) for h in (HQ, HKV, HKV)
        )
        flops = 4.0 * b * seq * (seq + 1) / 2 * HQ * D
        rec: dict[str, object] = {"tokens": tokens, "seq": seq, "samples": b, "variants": []}
        first: dict[int, torch.Tensor] = {}  # key block -> the first variant's output
        for rows, schedule in ns.variants:
            kb = 128 if schedule in WIDE else 64
            t = generic._tables(ctx, tokens, q.device, rows // (HQ // HKV))

            def call(t=t, rows=rows, schedule=schedule, q=q, k=k, v=v):  # type: ignore[no-untyped-def]
                return torch.ops.ws1_sm90.attn_fwd(
                    q, k, v, t.key_base, t.n_keys, t.blocks, rows, D**-0.5, schedule
                )[0]

            same, ms = _bits_and_time(call, kb, first, ns)
            status |= 0 if same else 1
            rec["variants"].append(_variant(rows, schedule, kb, ms, same, tflops=flops / ms / 1e9))  # type: ignore[union-attr]
        qs, ks, vs = (x.view(b, seq, x.shape[1], D).transpose(1, 2) for x in (q, k, v))
        if ns.no_sdpa:
            records.append(rec)
            continue
        sdpa = _time(
            lambda qs=qs, ks=ks, vs=vs: F.scaled_dot_product_attention(
                qs, ks, vs, is_causal=True, scale=D**-0.5, enable_gqa=True
            ),
            ns.reps,
            ns.warmup,
        )
        rec["sdpa_ms"] = sdpa
        rec["sdpa_tflops"] = flops / sdpa / 1e9
        if ns.backward:
            rec["backward"] = _backward(ctx, q, k, v, qs, ks, vs, flops, ns)
            status |= 0 if rec["backward"]["other_fuse_dkv_same_bits"] else 1
        for var in rec["variants"]:  # type: ignore[union-attr]
            var["ratio_to_sdpa"] = sdpa / var["ms"]
            print(
                f"tokens {tokens} rows {var['block_rows']} schedule {var['schedule']}: {var['ms']:.3f} ms "
                f"({var['tflops']:.0f} TFLOP/s, {var['ratio_to_sdpa']:.2f}x SDPA {sdpa:.3f} ms) bits "
                f"{'same' if var['same_bits'] else 'DIFFER'}",
                flush=True,
            )
        records.append(rec)
    decode = []
    for batch in ns.decode_batch if ns.decode is not None else []:
        drec, dstatus = _decode(ns, batch)
        decode.append(drec)
        status |= dstatus
    ns.out.write_text(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "records": records,
                "decode": decode,
            },
            indent=1,
        )
    )
    return status


def main(argv: list[str] | None = None) -> int:
    try:
        ns = parse(sys.argv[1:] if argv is None else argv)
    except ArgError as e:
        print(f"attn_sm90_variants: {e}")
        return 2
    return run(ns)


if __name__ == "__main__":
    sys.exit(main())
