"""Host cost of the CUDA extension's ops at M = 1, three ways, on the GPU (supporting evidence for docs/cuda.md).

`ws1 bench` gives each candidate's host cost (the wrapper a training step calls: validation, launch log,
autograd). This script adds what the step path (`integrations.step`) pays: the raw `torch.ops.ws1.*` call
with no wrapper, and one whole decode step of a Qwen3 model at the manifest's widths, eager against its CUDA
graph. Figures by `ws1_harness.run.bench.host.measure` (issue / eager / graph-replay microseconds per call).

    python ci/host_cost_cuda.py --out host.json [--layers 4] [--batch 1 --batch 64]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from ws1_harness.run.bench import host as H


def _raw_ops(dev: str) -> dict[str, object]:
    bf = torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=dev, dtype=bf)

    x, w_qkv, w = r(1, 4096), r(6144, 4096), r(4096)
    q = r(1, 32, 128)
    pos = torch.zeros(1, dtype=torch.int64, device=dev)
    ids = torch.zeros(1, dtype=torch.int64, device=dev)
    emb = r(151936, 4096)
    k, v = r(4096, 8, 128), r(4096, 8, 128)
    kb = torch.zeros(1, dtype=torch.int32, device=dev)
    nk = torch.full((1,), 4096, dtype=torch.int32, device=dev)
    gate, up = r(1, 12288), r(1, 12288)
    logits = r(1, 151936)
    return {
        "gemm qkv": lambda: torch.ops.ws1.gemm(x, w_qkv, True),
        "norm_fwd hidden": lambda: torch.ops.ws1.norm_fwd(x, w, 1e-6),
        "rope q_heads": lambda: torch.ops.ws1.rope(q, pos, 1e6, False),
        "embedding_fwd": lambda: torch.ops.ws1.embedding_fwd(ids, emb),
        # the op the step path calls at these widths: the tiled forward, one block per row
        "attn_fwd_tiled 4096 keys": lambda: torch.ops.ws1.attn_fwd_tiled(q, k, v, kb, nk, None, 128**-0.5),
        "swiglu_fwd": lambda: torch.ops.ws1.swiglu_fwd(gate, up),
        "logp_fwd": lambda: torch.ops.ws1.logp_fwd(logits, ids),
    }


def _steps(layers: int, batches: list[int], cache_len: int) -> dict[str, object]:
    from ws1_harness.run.bench.steps import random_weights
    from ws1_kernels.integrations import qwen3
    from ws1_kernels.integrations.step import (
        GraphStep,
        SlabCache,
        StepPlan,
        StepWeights,
        step_forward,
        step_ops,
    )
    from ws1_workload import load_manifest

    cfg = dataclasses.replace(load_manifest(None).model("qwen3-8b"), num_layers=layers)
    weights = random_weights(cfg, torch.device("cuda"))
    model = qwen3.build_model(qwen3.qwen3_config(cfg), weights, "cuda_bf16", device="cuda")
    w, ops = StepWeights.of(model), step_ops("cuda_bf16")
    out: dict[str, object] = {}
    for b in batches:
        cache = SlabCache.allocate(
            layers, b, cache_len + 1, w.kv_heads, w.head_dim, device="cuda", dtype=torch.bfloat16
        )
        slots = torch.arange(b, device="cuda")
        positions = torch.full((b,), cache_len, dtype=torch.int64, device="cuda")
        ids = torch.zeros(b, dtype=torch.int64, device="cuda")
        plan = StepPlan.from_device(slots, positions, cache.max_len)
        out[f"decode step eager b={b}"] = lambda plan=plan, ids=ids, cache=cache: step_forward(
            ops, w, ids, plan, cache.k, cache.v
        )
        gs = GraphStep(ops, w, cache, b)
        out[f"decode step graph b={b}"] = lambda gs=gs, ids=ids, slots=slots, positions=positions: gs(
            ids, slots, positions
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, action="append", dest="batches")
    ap.add_argument("--cache", type=int, default=2048)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_cost_cuda: needs a CUDA device", file=sys.stderr)
        return 2
    rows: dict[str, object] = {}
    calls = dict(_raw_ops("cuda"))
    try:
        calls.update(_steps(args.layers, args.batches or [1, 64], args.cache))
    except Exception as exc:  # noqa: BLE001 - the raw-op figures still count
        rows["decode steps"] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        print(f"decode steps: {rows['decode steps']}", flush=True)
    for name, fn in calls.items():
        cost = H.measure("cuda", fn)  # type: ignore[arg-type]
        rows[name] = cost.to_json()
        print(f"{name}: {cost}", flush=True)
    doc = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "layers": args.layers,
        "cache": args.cache,
        "method": "ws1_harness.run.bench.host.measure: median of bursts; issue = host, graph = device",
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
