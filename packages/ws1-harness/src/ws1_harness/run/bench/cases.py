"""Per operator: the inputs of a benchmark point, the candidate call, its stock peer and the work it does.

The peer is what a stock training stack would run for the same math: cuBLAS through `torch.mm`, the
materialised fp32 `log_softmax` + `gather`, an eager fp32 RMSNorm (Hugging Face's Qwen3RMSNorm math), `F.silu`,
SDPA, `F.embedding`. Both sides get the same tensors (bf16; ids int64). Work is what the operation must do at
the least, the same for both sides: FLOPs for the GEMMs and attention, bytes read + written for the
memory-bound ops, so a side's rate is work / its time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ws1_harness.run.bench.shapes import Point
from ws1_kernels import LayoutContext

Tensor = torch.Tensor
BF = torch.bfloat16
Inputs = dict[str, Any]
TFLOPS, GBS = "TFLOP/s", "GB/s"


@dataclass(frozen=True)
class OpCase:
    op: str
    peer: str  # what the stock peer runs, for the record
    metric: str  # TFLOP/s or GB/s
    make: Callable[[Point, torch.device, torch.Generator], Inputs]
    candidate: Callable[[Callable[..., Tensor], Inputs, LayoutContext, Point], Tensor]
    stock: Callable[[Inputs, Point], Tensor]
    grads: tuple[str, ...]  # float inputs that get gradients in the backward
    param: str | None  # the weight parameter (fp32 main_grad under sample_blocks_main_grad)
    work: Callable[[Point, str], float]  # FLOPs or bytes of one call of a phase ("fwd" or "bwd")
    # the call's LayoutContext when it needs the inputs (a decode step's key cache); None: `context(p)`
    context: Callable[[Point, Inputs], LayoutContext] | None = None
    # the row's call on the step path, for a profile that has step ops (``StepOps``, the rollout's raw ops): what
    # a rollout runs at this point, timed in place of the candidate's layout call. None: the candidate's call
    step: Callable[[Any, Inputs, Point], Tensor] | None = None
    # the peer with the candidate's weight-gradient rule, for a sample_blocks_main_grad candidate's backward: dW
    # accumulated into the weight's fp32 ``main_grad`` (read + write), as a trainer that keeps one does. None: the
    # op has no such peer (the row keeps its one peer)
    stock_main_grad: Callable[[Inputs, Point], Tensor] | None = None
    # the least bytes one call of a phase must read and write (phase, and whether dW is accumulated into an fp32
    # main_grad), for the roofline (bench/roofline.py); None: no roofline for the op's rows
    traffic: Callable[[Point, str, bool], float] | None = None


def context(p: Point) -> LayoutContext:
    """`samples` samples of `seq` consecutive positions each, host-side (segments never sync a device)."""
    b, s = p.samples, p.seq
    sample_ids = torch.arange(b, dtype=torch.int64).repeat_interleave(s)
    positions = torch.arange(s, dtype=torch.int64).repeat(b)
    return LayoutContext(sample_ids, positions)


def _randn(gen: torch.Generator, dev: torch.device, *shape: int, scale: float = 1.0) -> Tensor:
    t = torch.randn(shape, generator=gen, device=dev, dtype=BF)
    return t.mul_(scale) if scale != 1.0 else t


def _ids(gen: torch.Generator, dev: torch.device, n: int, high: int) -> Tensor:
    return torch.randint(0, high, (n,), generator=gen, device=dev, dtype=torch.int64)


def _d(p: Point, key: str) -> int:
    return int(p.dims[key])


# ---------------------------------------------------------------------------------------------- GEMMs


def _make_gemm(p: Point, dev: torch.device, gen: torch.Generator) -> Inputs:
    k, n = _d(p, "K"), _d(p, "N")
    return {"x": _randn(gen, dev, p.m, k), "weight": _randn(gen, dev, n, k, scale=k**-0.5)}


def _gemm_work(p: Point, phase: str) -> float:
    flops = 2.0 * p.m * _d(p, "N") * _d(p, "K")
    return flops if phase == "fwd" else 2.0 * flops  # backward: dx and dW


class _MainGradLinear(torch.autograd.Function):
    """``x @ w.T`` whose backward writes dx and accumulates dW into ``w.main_grad`` (fp32) in one GEMM.

    Why: a ``sample_blocks_main_grad`` candidate reads and writes an fp32 ``main_grad`` in its backward; stock
    autograd writes a fresh bf16 ``weight.grad``, a quarter of those bytes. At small M the weight gradient is
    those bytes, so the plain peer alone cannot say how much of a shortfall is the kernel and how much the rule.
    This peer does what a trainer that keeps ``main_grad`` runs (Megatron's gradient-accumulation fusion): on
    CUDA one cuBLAS GEMM with bf16 operands, fp32 C = D and beta = 1 (``torch.addmm(..., out_dtype=float32,
    out=main_grad)``); ``weight.grad`` stays None. On the CPU, where ``out_dtype`` does not exist, an fp32
    ``addmm_`` of the upcast operands (CPU rows exercise the machinery, never the speed)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, w)
        # the leaf's own attribute, read here where the leaf itself is at hand
        ctx.main_grad = w.main_grad  # type: ignore[attr-defined]
        return torch.mm(x, w.t())

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, None]:  # type: ignore[override]
        x, w = ctx.saved_tensors
        dx = torch.mm(dy, w) if ctx.needs_input_grad[0] else None
        _accumulate_main_grad(ctx.main_grad, dy, x)
        return dx, None


def _accumulate_main_grad(main_grad: Tensor, dy: Tensor, x: Tensor) -> None:
    """``main_grad += dy.T @ x`` in fp32: one GEMM with beta = 1 on CUDA, upcast operands on the CPU."""
    if main_grad.device.type == "cuda":
        torch.addmm(main_grad, dy.t(), x, out_dtype=torch.float32, out=main_grad)
    else:
        main_grad.addmm_(dy.t().float(), x.float())


MAIN_GRAD_PEER = (
    "torch.mm(x, w.t()); backward dx = dy @ w and w.main_grad += dy.T @ x in fp32 (CUDA: one cuBLAS addmm, bf16 "
    "operands, fp32 C = D, beta = 1)"
)


def _gemm_traffic(p: Point, phase: str, main_grad: bool) -> float:
    """Bytes a GEMM call must move at the least, each tensor once (bf16: 2 bytes). Forward: x, w read, y written.
    Backward: dy, w and x read, dx written, and dW either written fresh in bf16 or, under the main_grad rule, an
    fp32 main_grad read and written (8 bytes an element): at small M that term is nearly all of it."""
    m, k, n = p.m, _d(p, "K"), _d(p, "N")
    if phase == "fwd":
        return 2.0 * (m * k + n * k + m * n)
    dw = 8.0 * n * k if main_grad else 2.0 * n * k
    return 2.0 * (m * n + n * k + m * k + m * k) + dw


def _gemm_case(op: str) -> OpCase:
    return OpCase(
        op=op,
        peer="torch.mm(x, w.t()) (cuBLAS on CUDA); backward by autograd",
        metric=TFLOPS,
        make=_make_gemm,
        candidate=lambda fn, t, ctx, p: fn(t["x"], t["weight"], ctx),
        stock=lambda t, p: torch.mm(t["x"], t["weight"].t()),
        grads=("x", "weight"),
        param="weight",
        work=_gemm_work,
        stock_main_grad=lambda t, p: _MainGradLinear.apply(t["x"], t["weight"]),
        traffic=_gemm_traffic,
    )


# ---------------------------------------------------------------------------------------------- logprob


def _make_logp(p: Point, dev: torch.device, gen: torch.Generator) -> Inputs:
    v = _d(p, "V")
    return {"logits": _randn(gen, dev, p.m, v, scale=4.0), "targets": _ids(gen, dev, p.m, v)}


def _logp_stock(t: Inputs, p: Point) -> Tensor:
    return torch.log_softmax(t["logits"].float(), -1).gather(1, t["targets"][:, None]).squeeze(1)


def _logp_work(p: Point, phase: str) -> float:
    v = _d(p, "V")
    ids_out = p.m * (8 + 4)  # targets read, fp32 logprob written (fwd) or its gradient read (bwd)
    return (p.m * v * 2 if phase == "fwd" else 2 * p.m * v * 2) + ids_out  # logits read (+ dlogits written)


def _make_linear_logp(p: Point, dev: torch.device, gen: torch.Generator) -> Inputs:
    h, v = _d(p, "H"), _d(p, "V")
    return {
        "x": _randn(gen, dev, p.m, h),
        "weight": _randn(gen, dev, v, h, scale=h**-0.5),
        "targets": _ids(gen, dev, p.m, v),
    }


def _linear_logp_materialised(t: Inputs, p: Point) -> Tensor:
    logits = torch.mm(t["x"], t["weight"].t())
    return torch.log_softmax(logits.float(), -1).gather(1, t["targets"][:, None]).squeeze(1)


MATERIALISED = "materialised torch.mm(x, w.t()) -> float -> log_softmax -> gather"
LIGER = (
    "Liger-Kernel fused linear cross-entropy (liger_fused_linear_cross_entropy, reduction='none'), negated; "
    "it computes the gradients inside its forward, so compare its fwd + bwd with the candidate's"
)


def linear_logp_peer(device_type: str) -> tuple[str, Callable[[Inputs, Point], Tensor]]:
    """The fused peer a user would pick on a GPU: Liger-Kernel's fused linear cross-entropy, whose per-token
    loss is minus the selected token's logprob. Where it does not import (the CPU, or a GPU machine without the
    wheel) the materialised chain, and the row's `peer` says which ran."""
    if device_type == "cuda":
        try:
            from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy as flce
        except ImportError:
            flce = None
        if flce is not None:

            def liger(t: Inputs, p: Point) -> Tensor:
                out = flce(t["x"], t["weight"], t["targets"], reduction="none")
                return -(out[0] if isinstance(out, tuple) else out)

            return LIGER, liger
    return MATERIALISED, _linear_logp_materialised


def _linear_logp_stock(t: Inputs, p: Point) -> Tensor:
    return linear_logp_peer(t["x"].device.type)[1](t, p)


def _linear_logp_work(p: Point, phase: str) -> float:
    flops = 2.0 * p.m * _d(p, "V") * _d(p, "H")
    return flops if phase == "fwd" else 2.0 * flops


# ---------------------------------------------------------------------------------------------- norms


def _make_rms(p: Point, dev: torch.device, gen: torch.Generator) -> Inputs:
    h = _d(p, "H")
    return {"x": _randn(gen, dev, p.m, h), "weight": _randn(gen, dev, h, scale=0.1).add_(1.0)}


def _make_qk(p: Point, dev: torch.device, gen: torch.Generator) -> Inputs:
    nh, d = _d(p, "Nh"), _d(p, "D")
    return {"x": _randn(gen, dev, p.m, nh, d), "weight": _randn(gen, dev, d, scale=0.1).add_(1.0)}


def _rms_stock(t: Inputs, p: Point) -> Tensor:
    """fp32 math like the reference: x * rsqrt(mean(x^2) + eps) * w, rounded once to bf16."""
    xf = t["x"].float()
    var = xf.pow(2).mean(-1, keepdim=True)
    return (xf * torch.rsqrt(var + float(p.dims["eps"])) * t["weight"].float()).to(BF)


def _elems(p: Point, *keys: str) -> int:
    n = p.m
    for k in keys:
        n *= _d(p, k)
    return n


def _norm_work(keys: tuple[str, ...]) -> Callable[[Point, str], float]:
    def work(p: Point, phase: str) -> float:
        n = _elems(p, *keys)
        return (2 if phase == "fwd" else 3) * n * 2  # x in, y out (bwd: x, dy in, dx out); weight negligible

    return work


def _norm_case(op: str, make: Callable[..., Inputs], keys: tuple[str, ...]) -> OpCase:
    return OpCase(
        op=op,
        peer="eager fp32 RMSNorm: (x.float() * rsqrt(mean(x^2) + eps) * w.float()).bfloat16()",
        metric=GBS,
        make=make,
        candidate=lambda fn, t, ctx, p: fn(t["x"], t["weight"], float(p.dims["eps"]), ctx),
        stock=_rms_stock,
        grads=("x", "weight"),
        param="weight",
        work=_norm_work(keys),
    )


# ---------------------------------------------------------------------------------------------- pointwise


def _make_rope(p: Point, dev: torch.device, gen: torch.Generator) -> Inputs:
    from ws1_kernels.rope_math import rope_tables

    nh, d = _d(p, "Nh"), _d(p, "D")
    positions = torch.arange(p.seq, dtype=torch.int64, device=dev).repeat(p.samples)
    cos, sin = rope_tables(positions, d, float(p.dims["theta"]))  # fp32 [M, 1, D], built once like HF does
    return {"x": _randn(gen, dev, p.m, nh, d), "peer_cos": cos, "peer_sin": sin}


def _rope_stock(t: Inputs, p: Point) -> Tensor:
    xf = t["x"].float()
    half = xf.shape[-1] // 2
    rot = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * t["peer_cos"] + rot * t["peer_sin"]).to(BF)


def _make_f(names: tuple[str, ...]) -> Callable[[Point, torch.device, torch.Generator], Inputs]:
    def make(p: Point, dev: torch.device, gen: torch.Generator) -> Inputs:
        return {n: _randn(gen, dev, p.m, _d(p, "F")) for n in names}

    return make


def _rw_work(fwd_tensors: int, bwd_tensors: int, keys: tuple[str, ...]) -> Callable[[Point, str], float]:
    def work(p: Point, phase: str) -> float:
        return (fwd_tensors if phase == "fwd" else bwd_tensors) * _elems(p, *keys) * 2

    return work


# ---------------------------------------------------------------------------------------------- embedding


def _make_embedding(p: Point, dev: torch.device, gen: torch.Generator) -> Inputs:
    v, h = _d(p, "V"), _d(p, "H")
    return {"token_ids": _ids(gen, dev, p.m, v), "weight": _randn(gen, dev, v, h)}


def _embedding_work(p: Point, phase: str) -> float:
    rows = p.m * _d(p, "H")
    if phase == "fwd":
        return p.m * 8 + 2 * rows * 2  # ids, rows gathered, rows written
    return p.m * 8 + rows * 2 + 2 * rows * 4  # ids, dy read, the touched fp32 gradient rows read and written


# ---------------------------------------------------------------------------------------------- attention


def _make_attention(p: Point, dev: torch.device, gen: torch.Generator) -> Inputs:
    hq, hkv, d = _d(p, "Hq"), _d(p, "Hkv"), _d(p, "D")
    return {
        "q": _randn(gen, dev, p.m, hq, d),
        "k": _randn(gen, dev, p.m, hkv, d),
        "v": _randn(gen, dev, p.m, hkv, d),
    }


def _bhsd(t: Tensor, p: Point) -> Tensor:
    """Packed [B*S, H, D] -> [B, H, S, D] as a view (last dim contiguous, which SDPA's kernels accept)."""
    return t.view(p.samples, p.seq, t.shape[1], t.shape[2]).transpose(1, 2)


@functools.cache
def sdpa_peer(device_type: str, hq: int, hkv: int, d: int) -> tuple[str, Callable[..., Tensor]]:
    """SDPA as a user calls it: torch's default backend selection, probed once (forward and backward) on a
    small input. On CUDA: with `enable_gqa`, else on k/v repeated to the query heads (the repeat inside the
    timed call). Which backend the default picked is observed per row (`runner`: the CUDA profiler's kernels),
    never assumed. On the CPU: the default backend with `enable_gqa`.
    """

    def call(q: Tensor, k: Tensor, v: Tensor, scale: float, gqa: bool) -> Tensor:
        if gqa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    default = "F.scaled_dot_product_attention(causal, enable_gqa=True), default backend"
    if device_type != "cuda":
        return default, (lambda q, k, v, s: call(q, k, v, s, True))
    variants: list[tuple[str, Callable[..., Tensor]]] = [
        (default, lambda q, k, v, s: call(q, k, v, s, True)),
        (
            "F.scaled_dot_product_attention(causal) on k/v repeat_interleave'd (in the timed call), default backend",
            lambda q, k, v, s: call(q, k, v, s, False),
        ),
    ]
    for name, fn in variants:
        try:
            q = torch.randn(1, hq, 64, d, device="cuda", dtype=BF, requires_grad=True)
            k = torch.randn(1, hkv, 64, d, device="cuda", dtype=BF, requires_grad=True)
            v = torch.randn(1, hkv, 64, d, device="cuda", dtype=BF, requires_grad=True)
            fn(q, k, v, d**-0.5).sum().backward()
            return name, fn
        except Exception:  # noqa: BLE001 - try the next variant
            continue
    return variants[0]


def _attention_stock(t: Inputs, p: Point) -> Tensor:
    _, fn = sdpa_peer(t["q"].device.type, _d(p, "Hq"), _d(p, "Hkv"), _d(p, "D"))
    return fn(_bhsd(t["q"], p), _bhsd(t["k"], p), _bhsd(t["v"], p), _d(p, "D") ** -0.5)


def _attention_work(p: Point, phase: str) -> float:
    pairs = p.samples * p.seq * (p.seq + 1) / 2  # causal (query, key) pairs
    flops = 4.0 * pairs * _d(p, "Hq") * _d(p, "D")  # QK^T and PV
    return flops if phase == "fwd" else 2.5 * flops  # backward: five matmuls for two


# ---------------------------------------------------------------------------------------------- decode


def _make_decode(p: Point, dev: torch.device, gen: torch.Generator) -> Inputs:
    """M samples, each a new token at position C after C cached keys; the cache holds C + 1 rows per sample
    (the new token's key and value at row C) so the peer reads one preallocated tensor, as a serving cache is."""
    hq, hkv, d, c = _d(p, "Hq"), _d(p, "Hkv"), _d(p, "D"), _d(p, "C")
    k_cache = _randn(gen, dev, p.m, c + 1, hkv, d)
    v_cache = _randn(gen, dev, p.m, c + 1, hkv, d)
    rows = torch.arange(p.m, device=dev, dtype=torch.int32)
    return {
        "q": _randn(gen, dev, p.m, hq, d),
        "k": k_cache[:, c].contiguous(),
        "v": v_cache[:, c].contiguous(),
        "k_cache": k_cache,
        "v_cache": v_cache,
        # the step path's view of the same cache: one slab of M * (C + 1) rows (no copy), each sample's
        # position 0 at row s * (C + 1), C + 1 keys each (the new token's included)
        "key_base": rows * (c + 1),
        "n_keys": torch.full_like(rows, c + 1),
    }


def _decode_context(p: Point, t: Inputs) -> LayoutContext:
    """One row per sample at position C; each sample's first C cached keys and values as its key prefix."""
    c = _d(p, "C")
    sample_ids = torch.arange(p.m, dtype=torch.int64)
    positions = torch.full((p.m,), c, dtype=torch.int64)
    prefix = {s: (t["k_cache"][s, :c], t["v_cache"][s, :c]) for s in range(p.m)}
    return LayoutContext(sample_ids, positions, kv_prefix=prefix)


def _decode_stock(t: Inputs, p: Point) -> Tensor:
    """SDPA of one query per sample against its whole cache (no mask: the last position sees every key), at
    torch's default backend selection (the row records the kernels it picked)."""
    q = t["q"][:, :, None, :]  # [B, Hq, 1, D]
    k, v = t["k_cache"].transpose(1, 2), t["v_cache"].transpose(1, 2)  # [B, Hkv, C + 1, D] views
    return F.scaled_dot_product_attention(q, k, v, scale=_d(p, "D") ** -0.5, enable_gqa=True)


def _decode_step(ops: Any, t: Inputs, p: Point) -> Tensor:
    """The rollout's decode attention: ``StepOps.attention`` reading every sample's keys in place from the cache
    slab, as the step path runs it at every layer (no prefix list, no concatenation, no host table)."""
    hkv, d = _d(p, "Hkv"), _d(p, "D")
    k, v = t["k_cache"].view(-1, hkv, d), t["v_cache"].view(-1, hkv, d)
    return ops.attention(t["q"], k, v, t["key_base"], t["n_keys"], d**-0.5)


def _decode_work(p: Point, phase: str) -> float:
    """Bytes of the key and value cache read (bf16), which bounds a decode step."""
    return 2.0 * p.m * (_d(p, "C") + 1) * _d(p, "Hkv") * _d(p, "D") * 2


# ---------------------------------------------------------------------------------------------- table

CASES: Mapping[str, OpCase] = {
    "det_gemm": _gemm_case("det_gemm"),
    "lm_head": _gemm_case("lm_head"),
    "logp": OpCase(
        op="logp",
        peer="torch.log_softmax(logits.float(), -1).gather(1, targets[:, None])",
        metric=GBS,
        make=_make_logp,
        candidate=lambda fn, t, ctx, p: fn(t["logits"], t["targets"], ctx),
        stock=_logp_stock,
        grads=("logits",),
        param=None,
        work=_logp_work,
    ),
    "linear_logp": OpCase(
        op="linear_logp",
        peer=MATERIALISED,  # refined per device by linear_logp_peer
        metric=TFLOPS,
        make=_make_linear_logp,
        candidate=lambda fn, t, ctx, p: fn(t["x"], t["weight"], t["targets"], ctx),
        stock=_linear_logp_stock,
        grads=("x", "weight"),
        param="weight",
        work=_linear_logp_work,
    ),
    "rms_norm": _norm_case("rms_norm", _make_rms, ("H",)),
    "qk_norm": _norm_case("qk_norm", _make_qk, ("Nh", "D")),
    "rope": OpCase(
        op="rope",
        peer="x*cos + rotate_half(x)*sin in fp32 (cos/sin tables built once, outside the timing)",
        metric=GBS,
        make=_make_rope,
        candidate=lambda fn, t, ctx, p: fn(t["x"], float(p.dims["theta"]), ctx),
        stock=_rope_stock,
        grads=("x",),
        param=None,
        work=_rw_work(2, 2, ("Nh", "D")),
    ),
    "silu": OpCase(
        op="silu",
        peer="F.silu(x)",
        metric=GBS,
        make=_make_f(("x",)),
        candidate=lambda fn, t, ctx, p: fn(t["x"], ctx),
        stock=lambda t, p: F.silu(t["x"]),
        grads=("x",),
        param=None,
        work=_rw_work(2, 3, ("F",)),
    ),
    "swiglu": OpCase(
        op="swiglu",
        peer="F.silu(gate) * up",
        metric=GBS,
        make=_make_f(("gate", "up")),
        candidate=lambda fn, t, ctx, p: fn(t["gate"], t["up"], ctx),
        stock=lambda t, p: F.silu(t["gate"]) * t["up"],
        grads=("gate", "up"),
        param=None,
        work=_rw_work(3, 5, ("F",)),
    ),
    "embedding": OpCase(
        op="embedding",
        peer="F.embedding(ids, w)",
        metric=GBS,
        make=_make_embedding,
        candidate=lambda fn, t, ctx, p: fn(t["token_ids"], t["weight"], ctx),
        stock=lambda t, p: F.embedding(t["token_ids"], t["weight"]),
        grads=("weight",),
        param="weight",
        work=_embedding_work,
    ),
    "attention": OpCase(
        op="attention",
        peer="SDPA",  # refined per device by sdpa_peer
        metric=TFLOPS,
        make=_make_attention,
        candidate=lambda fn, t, ctx, p: fn(t["q"], t["k"], t["v"], _d(p, "D") ** -0.5, ctx),
        stock=_attention_stock,
        grads=("q", "k", "v"),
        param=None,
        work=_attention_work,
    ),
    "attention_decode": OpCase(
        op="attention_decode",
        peer="F.scaled_dot_product_attention(enable_gqa=True), default backend, one query per sample on "
        "[B, Hkv, C + 1, D] cache views",
        metric=GBS,
        make=_make_decode,
        candidate=lambda fn, t, ctx, p: fn(t["q"], t["k"], t["v"], _d(p, "D") ** -0.5, ctx),
        stock=_decode_stock,
        grads=(),
        param=None,
        work=_decode_work,
        context=_decode_context,
        step=_decode_step,
    ),
}


#: rows whose peer is SDPA at torch's default backend selection: the runner records the kernels it ran
SDPA_OPS = frozenset({"attention", "attention_decode"})


def peer_name(case: OpCase, p: Point, device: torch.device) -> str:
    if case.op == "attention":
        name, _ = sdpa_peer(device.type, _d(p, "Hq"), _d(p, "Hkv"), _d(p, "D"))
        return f"{name} on [B={p.samples}, H, S={p.seq}, D]"
    if case.op == "linear_logp":
        return linear_logp_peer(device.type)[0]
    return case.peer


def fp32_logits_bytes(p: Point) -> int | None:
    """Size of the fp32 [M, V] logits that linear_logp exists to avoid (None for the other ops)."""
    return p.m * _d(p, "V") * 4 if p.op == "linear_logp" else None
