"""The step path's scenario, shared by the CPU test (fp32 reference ops) and the GPU test (cuda_bf16, bitwise).

Three requests go through a slab cache in five steps, with chunked prefill, decode, a request leaving and a new
one taking its slot over its stale keys; every row's logits are keyed by (request, position). The judged path
gives the same rows from one packed ``forward_call`` over the three whole sequences."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ws1_kernels import LayoutContext
from ws1_kernels.integrations import qwen3
from ws1_kernels.integrations.step import GraphStep, SlabCache, StepPlan, StepWeights, plan_rows, step_forward
from ws1_kernels.rope_math import rope_tables, rotate
from ws1_kernels.step_ops import StepOps

LENGTHS = {0: 8, 1: 5, 2: 5}  # request -> whole sequence length
# each step: (request, tokens it brings); "leave 1" before step 3's successor, "join 2" takes the freed slot
STEPS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, 3), (1, 3)),
    ((0, 2), (1, 1)),
    ((0, 1), (1, 1)),
    ((0, 1), (2, 4)),
    ((0, 1), (2, 1)),
)
LEAVE_BEFORE = {3: 1}  # step index -> request that leaves before it
JOIN_BEFORE = {3: 2}


def sequences(vocab: int, device: Any) -> dict[int, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return {r: torch.randint(0, vocab, (n,), generator=gen).to(device) for r, n in LENGTHS.items()}


def packed_logits(
    model: torch.nn.Module, seqs: dict[int, torch.Tensor]
) -> dict[tuple[int, int], torch.Tensor]:
    """The judged path: one packed forward_call over the whole sequences."""
    ids = torch.cat([seqs[r] for r in sorted(seqs)])
    sid = torch.cat([torch.full((LENGTHS[r],), r, dtype=torch.int64) for r in sorted(seqs)])
    pos = torch.cat([torch.arange(LENGTHS[r], dtype=torch.int64) for r in sorted(seqs)])
    with torch.no_grad():
        logits, _ = qwen3.forward_call(model, ids, LayoutContext(sid, pos))
    return {(int(s), int(p)): logits[i] for i, (s, p) in enumerate(zip(sid, pos, strict=True))}


def run_steps(
    model: torch.nn.Module,
    ops: StepOps,
    seqs: dict[int, torch.Tensor],
    *,
    mode: str = "eager",
    bucket: int = 4,
    slots: int = 2,
    tamper: Callable[[StepPlan], StepPlan] | None = None,
    compile_backend: str = "inductor",
) -> dict[tuple[int, int], torch.Tensor]:
    """Every step row's logits by (request, position); ``mode``: eager, compiled (fullgraph, with
    ``compile_backend``) or graph (steps of at most ``bucket`` rows replayed from one CUDA graph, pads
    included). ``tamper`` alters each eager plan (a negative control)."""
    w = StepWeights.of(model)
    dev = w.embed.device
    cache = SlabCache.allocate(
        len(w.layers), slots, max(LENGTHS.values()), w.kv_heads, w.head_dim, device=dev, dtype=w.embed.dtype
    )
    fwd = step_forward
    if mode == "compiled":
        torch._dynamo.reset()  # a fresh trace: a cache hit from an earlier test would prove nothing
        fwd = torch.compile(step_forward, fullgraph=True, dynamic=False, backend=compile_backend)
    graph = GraphStep(ops, w, cache, bucket) if mode == "graph" else None
    cache.join(0)
    cache.join(1)
    out: dict[tuple[int, int], torch.Tensor] = {}
    for i, step in enumerate(STEPS):
        if i in LEAVE_BEFORE:
            cache.leave(LEAVE_BEFORE[i])
        if i in JOIN_BEFORE:
            cache.join(JOIN_BEFORE[i])
        rids = [r for r, _ in step]
        counts = [n for _, n in step]
        starts = [cache.length[r] for r in rids]
        rows = sum(counts)
        use_graph = graph is not None and rows <= bucket
        slot_t, pos_t = plan_rows(cache, rids, counts, pad_to=bucket if use_graph else None)
        ids = torch.cat([seqs[r][s : s + n] for r, s, n in zip(rids, starts, counts, strict=True)])
        if use_graph:
            ids = torch.cat([ids, torch.zeros(bucket - rows, dtype=torch.int64, device=dev)])
        with torch.no_grad():
            if use_graph:
                logits = graph(ids, slot_t.to(dev), pos_t.to(dev)).clone()
            else:
                plan = StepPlan.from_device(slot_t.to(dev), pos_t.to(dev), cache.max_len)
                if tamper is not None:
                    plan = tamper(plan)
                logits = fwd(ops, w, ids, plan, cache.k, cache.v)
        keys = [(r, s + j) for r, s, n in zip(rids, starts, counts, strict=True) for j in range(n)]
        for j, key in enumerate(keys):
            out[key] = logits[j]
    return out


def _ref_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _ref_attention(q, k, v, key_base, n_keys, scale):  # type: ignore[no-untyped-def]
    group = q.shape[1] // k.shape[1]
    out = torch.zeros_like(q)
    for t in range(q.shape[0]):
        b, n = int(key_base[t]), int(n_keys[t])
        kk = k[b : b + n].float().repeat_interleave(group, dim=1)  # [n, Hq, D]
        vv = v[b : b + n].float().repeat_interleave(group, dim=1)
        s = torch.einsum("hd,nhd->hn", q[t].float(), kk) * scale
        out[t] = torch.einsum("hn,nhd->hd", s.softmax(-1), vv).to(q.dtype)
    return out


def _ref_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    cos, sin = rope_tables(positions, x.shape[-1], theta)
    return rotate(x.float(), cos, sin).to(x.dtype)


#: textbook torch, any dtype: the CPU side of the step tests
REFERENCE_STEP_OPS = StepOps(
    embedding=lambda ids, w: w[ids],
    norm=_ref_norm,
    linear=lambda x, w: x @ w.t(),
    rope=_ref_rope,
    attention=_ref_attention,
    swiglu=lambda g, u: torch.nn.functional.silu(g) * u,
    logp=lambda logits, t: torch.log_softmax(logits.float(), -1).gather(1, t[:, None])[:, 0],
)


def gpu_model(profile: str) -> torch.nn.Module:
    """The tiny model cut to two layers, swapped to ``profile`` on the GPU (the GPU step tests)."""
    import dataclasses as dc

    from ws1_workload import load_manifest, synthetic_weights, tensor_shapes

    m = load_manifest()
    cfg = dc.replace(m.model("tiny"), num_layers=2)
    weights = synthetic_weights(m, "tiny", names=tensor_shapes(cfg))
    return qwen3.build_model(qwen3.qwen3_config(cfg), weights, profile, device="cuda")


def raw_bits(t: torch.Tensor) -> torch.Tensor:
    """The integer view of a float tensor (bf16 or fp32): what "bit for bit" compares."""
    return t.contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def mismatched(got: dict, ref: dict) -> list:
    """The keys whose rows differ in any bit (``got`` must cover exactly ``ref``'s keys)."""
    assert set(got) == set(ref)
    return [k for k in sorted(ref) if not torch.equal(raw_bits(got[k]), raw_bits(ref[k]))]


def step_mismatches(model: torch.nn.Module, ops: StepOps, mode: str) -> list:
    """The GPU tests' property: the scenario's step rows (eager, compiled or graph) that differ in any bit from
    the packed forward_call's rows (none, when the step path is right)."""
    seqs = sequences(model.lm_head.weight.shape[0], "cuda")
    ref = packed_logits(model, seqs)
    return mismatched(run_steps(model, ops, seqs, mode=mode), ref)


def short_plan_mismatches(model: torch.nn.Module, ops: StepOps) -> tuple[list, int]:
    """Its control: (the rows that differ, the rows) when every row's plan is one key short; every row past
    position 0 must differ."""
    import dataclasses

    seqs = sequences(model.lm_head.weight.shape[0], "cuda")
    ref = packed_logits(model, seqs)

    def short(plan: StepPlan) -> StepPlan:
        return dataclasses.replace(plan, n_keys=(plan.n_keys - 1).clamp(min=1))

    return mismatched(run_steps(model, ops, seqs, tamper=short), ref), len(ref)
