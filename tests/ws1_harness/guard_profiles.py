"""Deliberately broken candidates: the harness must turn each one red, and only where it is broken.

Each wrapper takes a portable_cpu candidate and breaks one property the way real kernels break it:
- `mix_rows`: every output row depends on the first row of the call (a row-mixing reduction).
- `split_k_small_batch`: small calls reduce K in two halves (split-K for small M), big calls in one pass.
- `split_kv_small_calls`: attention splits the keys in two for small calls (decode), one pass otherwise.
- `main_grad_from_zero`: the weight gradient's accumulator starts at zero in every call (not at main_grad).
- `stock_fallback`: quietly computes with a stock op it did not declare, returns the portable result.
- `nan_one`, `neg_zero_when_alone`, `ulp_when_padded`: one NaN, a flipped zero sign, one ulp under one layout.
- `no_backward`: the forward runs under no_grad, so there is no backward.
- `hang`: never returns.
The module doubles as a plug-in (`guard_profiles:BROKEN_DET_GEMM`) for the end-to-end matrix test.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from ws1_kernels import LayoutContext, launches, registry
from ws1_kernels.registry import Candidate

Tensor = torch.Tensor


def portable(op: str) -> Candidate:
    return registry.resolve("portable_cpu", op, device="cpu")


def mix_rows(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """Adds a bounded share of the call's first row to every row: at most 2^-12, so the output and the
    gradients (where the first row gathers 2^-12 of every row's upstream gradient) stay within the calibrated
    gemm accuracy tolerance (atol 7.9e-3 plus 1.56e-2 |r|), while the bits of small outputs change: only the
    invariance judgments can see it."""

    def wrapped(*args: object) -> Tensor:
        out = fn(*args)
        return out + out[:1].clamp(-1.0, 1.0) * 2.0**-12

    return wrapped


def sequential_dot(x: Tensor, weight: Tensor, k0: int, k1: int) -> Tensor:
    """fp32 ``x[:, k0:k1] @ weight[:, k0:k1]^T`` walking K in ascending order, one elementwise add per k.

    Not the host's matmul: its K order is the BLAS's and differs between hosts (on an AVX-512 host a two-way
    split of K came out with the same bf16 bits as the full sum). bf16 products are exact in fp32 and each
    elementwise add is correctly rounded, so this order, and the fault built on it, is the same on every host.
    """
    xf, wf = x.float(), weight.float()
    acc = torch.zeros((x.shape[0], weight.shape[0]), dtype=torch.float32, device=x.device)
    for k in range(k0, k1):
        acc = acc + xf[:, k : k + 1] * wf[:, k]
    return acc


def split_k_small_batch(x: Tensor, weight: Tensor, ctx: LayoutContext) -> Tensor:
    """A GEMM that changes its reduction order with the batch size, like split-K heuristics do: calls of more
    than 32 rows walk K in one pass, smaller calls walk its two halves apart and add them. Red by construction
    on the fixture's dot-order probe rows (ws1_workload.inputs), on every host."""
    launches.record("guard.split_k", "fwd")
    k = x.shape[1]
    if x.shape[0] > 32:
        return sequential_dot(x, weight, 0, k).to(torch.bfloat16)
    half = k // 2
    return (sequential_dot(x, weight, 0, half) + sequential_dot(x, weight, half, k)).to(torch.bfloat16)


def main_grad_from_zero(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """A weight gradient whose accumulator starts at zero: each call's blocks are summed alone and the call's
    sum is added to ``weight.main_grad`` at the end, instead of ``main_grad`` heading the chain. Values stay
    within rounding of the correct ones; only the order of the token reduction moves with the layout's calls.

    Built on the portable kernel with two hooks: the output's hook (before the op's backward) sets main_grad
    aside and zeroes it, x's hook (after) adds the saved part back.
    """

    def wrapped(x: Tensor, weight: Tensor, ctx: LayoutContext) -> Tensor:
        out = fn(x, weight, ctx)
        saved: list[Tensor] = []

        def before(grad: Tensor) -> Tensor:
            mg = getattr(weight, "main_grad", None)
            if mg is not None:
                saved.append(mg.clone())
                mg.zero_()
            return grad

        def after(grad: Tensor) -> Tensor:
            if saved:
                weight.main_grad.add_(saved.pop())  # type: ignore[attr-defined]
            return grad

        if out.requires_grad and x.requires_grad:  # inference layouts run without autograd
            out.register_hook(before)
            x.register_hook(after)
        return out

    return wrapped


def split_kv_small_calls(q: Tensor, k: Tensor, v: Tensor, scale: float, ctx: LayoutContext) -> Tensor:
    """Attention that splits the keys in two for calls of at most 8 rows (decode steps), as split-KV decode
    kernels do, and merges the two softmax states; bigger calls (and every call under autograd) run the portable
    kernel. Values stay within rounding; only the order of the sum over keys moves with the call size. Red by
    construction on the fixture's attention order probe (ws1_workload.token_probes), on every host: each key
    block there holds one nonzero value in the probed column, so no BLAS order inside a block matters."""
    from ws1_kernels.portable import _math
    from ws1_kernels.portable._blocks import KEY_BLOCK, QUERY_BLOCK

    pa = importlib.import_module(
        "ws1_kernels.portable.attention"
    )  # the package exports a function of that name

    if q.shape[0] > 8 or (torch.is_grad_enabled() and q.requires_grad):
        return pa.attention(q, k, v, scale, ctx)
    scale = pa.check_attention("guard.split_kv", q, k, v, scale, ctx, torch.bfloat16)
    launches.record(pa.KERNEL, "fwd")
    t, hq, d = q.shape
    out = torch.zeros((t, hq, d), dtype=torch.float32)
    for seg in ctx.segments:
        smp = pa._Sample(seg, q, k, v, ctx.kv_prefix.get(seg.sample_id), hq // k.shape[1])
        for qb, s0, s1 in smp.query_blocks():
            qblk = pa._block_of(q, seg, qb, s0, s1)
            nkb = (qb * QUERY_BLOCK + s1 - 1) // KEY_BLOCK + 1
            half = (nkb + 1) // 2
            # the portable walk over each half; a row whose keys all lie in the first half gets NaN states
            # from the second (exp(-inf - -inf)), which count for nothing in the merge
            states = [
                pa.walk_keys(smp, qblk, qb, range(lo, hi), scale) for lo, hi in ((0, half), (half, nkb))
            ]
            states[1] = tuple(x.nan_to_num(0.0) if i else x for i, x in enumerate(states[1]))
            (m1, d1, a1), (m2, d2, a2) = states
            m = torch.maximum(m1, m2)
            w1, w2 = _math.exp(m1 - m).nan_to_num(0.0), _math.exp(m2 - m).nan_to_num(0.0)
            acc = a1 * w1.unsqueeze(-1) + a2 * w2.unsqueeze(-1)
            den = d1 * w1 + d2 * w2
            r0 = seg.start + qb * QUERY_BLOCK + s0 - seg.first_position
            out[r0 : r0 + s1 - s0] = (acc / den.unsqueeze(-1))[:, s0:s1].transpose(0, 1)
    return out.to(torch.bfloat16)


def stock_fallback(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def wrapped(x: Tensor, weight: Tensor, ctx: LayoutContext) -> Tensor:
        torch.addmm(torch.zeros(1), x[:1].float(), weight.float().t())  # the undeclared stock op
        return fn(x, weight, ctx)

    return wrapped


def nan_one(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def wrapped(*args: object) -> Tensor:
        out = fn(*args)
        poison = torch.zeros_like(out)
        poison.view(-1)[0] = float("nan")
        return out + poison

    return wrapped


def neg_zero_when_alone(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """Element 0 of every row is zero: +0 in batched calls, -0 when the call holds one sample."""

    def wrapped(*args: object) -> Tensor:
        ctx = args[-1]
        assert isinstance(ctx, LayoutContext)
        out = fn(*args)
        alone = len({s for s in ctx.sample_ids.tolist() if s >= 0}) == 1
        mask = torch.zeros_like(out, dtype=torch.bool)
        mask[..., 0] = True
        return out.masked_fill(mask, -0.0 if alone else 0.0)

    return wrapped


def ulp_when_padded(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """One ulp added to the first real row's first element, only in calls that contain pad rows."""

    def wrapped(*args: object) -> Tensor:
        ctx = args[-1]
        assert isinstance(ctx, LayoutContext)
        out = fn(*args)
        if bool((ctx.sample_ids < 0).any()):
            row = int((ctx.sample_ids >= 0).nonzero()[0])
            bumped = out.detach().clone()
            flat = bumped[row].view(-1)
            flat[0] = torch.nextafter(flat[0].float(), torch.tensor(float("inf"))).to(out.dtype)
            if flat[0] == out[row].reshape(-1)[0]:  # bf16 rounding swallowed the step: force one bf16 ulp
                bits = out[row].reshape(-1)[:1].view(torch.int16) + 1
                flat[0] = bits.view(out.dtype)[0]
            out = out + (bumped - out).detach()
        return out

    return wrapped


def no_backward(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def wrapped(*args: object) -> Tensor:
        with torch.no_grad():
            return fn(*args)

    return wrapped


def hang(*args: object) -> Tensor:
    launches.record("guard.hang", "fwd")
    while True:
        time.sleep(1.0)


def broken(
    op: str, fn: Callable[..., Tensor], *, profile: str = "guard", extra_ops: frozenset[str] = frozenset()
) -> Candidate:
    """A portable candidate with its function replaced, declaring the same kernel id and ops (plus extras)."""
    base = portable(op)
    return replace(base, profile=profile, fn=fn, declared_ops=base.declared_ops | extra_ops)


def _broken_det_gemm_profile() -> tuple[str, list[Candidate]]:
    """Plug-in: portable everywhere except det_gemm, which mixes rows."""
    cands = [
        replace(registry.resolve("portable_cpu", op, device="cpu"), profile="broken_det_gemm")
        for op in ("rms_norm", "det_gemm", "silu")
    ]
    # The plug-in declares the ops its row mixing dispatches (forward and backward), so the dispatch watch
    # stays quiet and only the invariance judgments can catch it.
    mixing_ops = frozenset(
        {
            "aten.add",
            "aten.clamp",
            "aten.mul",
            "aten.ge",
            "aten.le",
            "aten.logical_and_",
            "aten.scalar_tensor",
            "aten.slice_backward",
            "aten.sum",
            "aten.where",
        }
    )
    cands = [
        replace(c, fn=mix_rows(c.fn), declared_ops=c.declared_ops | mixing_ops)
        if c.operator == "det_gemm"
        else c
        for c in cands
    ]
    return "broken_det_gemm", cands


def _hang_profile() -> tuple[str, list[Candidate]]:
    """Plug-in: silu hangs, rms_norm is portable."""
    cands = [
        replace(registry.resolve("portable_cpu", "rms_norm", device="cpu"), profile="hang_silu"),
        replace(registry.resolve("portable_cpu", "silu", device="cpu"), profile="hang_silu", fn=hang),
    ]
    return "hang_silu", cands


BROKEN_DET_GEMM = _broken_det_gemm_profile
HANG_SILU = _hang_profile
