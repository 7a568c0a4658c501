"""Where a Triton op call's host time goes at M = 1, layer by layer (supporting evidence for the host-cost target).

`ws1 bench` gives each candidate's host cost as one figure (47-123 us per call on the H200 at 9dd0891, against a
10 us target). This script peels the qkv GEMM's call apart on the GPU, each layer timed by
`ws1_harness.run.bench.host.measure` (issue / eager / graph-replay microseconds per call):

- `torch.empty`: the output allocation alone (the floor of any op that returns a new tensor);
- `triton launch`: `ws1_gemm_fixed_k[grid](...)` with the plan precomputed: Triton's own launch path
  (`JITFunction.run`: binding, specialisation, cache key, then the compiled kernel's launcher);
- `bound launch`: the same launch through ws1's bound-kernel fast path (`triton_ops._bound`), the compiled kernel
  bound once per specialisation;
- `gemm_forward_raw`: the step path's GEMM (tile pick, cached plan, allocation, launch record, launch);
- `step op linear`: the same through the profile's step op (`torch.ops.ws1_triton.linear`, a `torch.library`
  definition with a CUDA kernel: dispatch); with the C++ step path built (`ws1_launch_ext`, docs/step.md) that
  kernel is C++ and replays the recorded launch, and `step op linear, Python twin` times the Python path it
  replaces (`torch.ops.ws1_triton.linear_py`) in the same process;
- `custom_op linear`: the same wrapped as a `torch.library.custom_op` (how the step ops were defined before: its
  autograd wrapper and aliasing check run on every call), for comparison in the same process;
- `candidate det_gemm`: the training candidate under no_grad (validation, layout context, then the same launch);
- `step op <op>` for every other step op at one decode row of the 8B model (embedding, norm, rope, attention over
  2048 cached keys, swiglu, logp over the full vocabulary; and rope's two parts, which the step path calls: the
  angles once a step, the rotation for q and k of every layer): the host cost target covers every op call, and with the
  C++ path built each of them replays (`step_native` in the output counts the hits).

Then a cProfile of 2000 `gemm_forward_raw` calls (the step path's GEMM), by own time: the functions that take the host's time.

    python ci/host_cost_triton.py --out host-triton.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
from pathlib import Path

import torch

from ws1_harness.run.bench import host as H
from ws1_kernels.step_ops import StepOps

#: where the calls run: cuda, or cpu under TRITON_INTERPRET=1 (a logic run of the script, no figure)
DEVICE = ["cuda"]


def _calls(dev: str, n: int, k: int) -> dict[str, object]:
    from ws1_kernels.context import LayoutContext
    from ws1_kernels.integrations.step import step_ops
    from ws1_kernels.triton_ops import gemm as G
    from ws1_kernels.triton_ops import native
    from ws1_kernels.triton_ops._launch import launcher

    bf = torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(1, k, generator=gen, device=dev, dtype=bf)
    w = torch.randn(n, k, generator=gen, device=dev, dtype=bf)
    m = 1
    tile = G.fwd_table(n, k).pick(m)
    progs, opts = G._plan(tile, m, n, k, False, G._sm_count(x.device))
    out = torch.empty((m, n), dtype=bf, device=dev)
    ops = step_ops("triton_cuda_bf16")
    ctx = LayoutContext(torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))

    def raw_launch() -> object:
        return G.ws1_gemm_fixed_k[(progs,)](
            x, w, out, m, n, k, x.stride(0), 1, k, out.stride(0), progs, **opts
        )

    def bound_launch() -> object:
        args = (x, w, out, m, n, k, x.stride(0), 1, k, out.stride(0), progs)
        return launcher()(G.ws1_gemm_fixed_k, (progs,), args, opts)

    @torch.library.custom_op("ws1_host_cost::linear", mutates_args=())
    def custom_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return G.gemm_forward_raw(x, w)

    def candidate() -> torch.Tensor:
        with torch.no_grad():
            return G.det_gemm(x, w, ctx)

    twin = {}
    if native.available():
        twin["step op linear, Python twin"] = lambda: torch.ops.ws1_triton.linear_py(x, w)
    return {
        "torch.empty": lambda: torch.empty((m, n), dtype=bf, device=dev),
        "triton launch": raw_launch,
        "bound launch": bound_launch,
        "gemm_forward_raw": lambda: G.gemm_forward_raw(x, w),
        "step op linear": lambda: ops.linear(x, w),
        **twin,
        "custom_op linear": lambda: custom_linear(x, w),
        "candidate det_gemm": candidate,
        **_other_step_ops(dev, ops, gen),
    }


def _other_step_ops(dev: str, ops: StepOps, gen: torch.Generator) -> dict[str, object]:
    """The other step ops at one decode row of the 8B model (on the CPU interpreter: small widths, same calls)."""
    bf = torch.bfloat16
    big = dev == "cuda"
    hidden, vocab, inter = (4096, 151936, 12288) if big else (64, 256, 128)
    hq, hkv, d, cached = (32, 8, 128, 2048) if big else (4, 2, 16, 8)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=dev, dtype=bf)

    ids = torch.zeros(1, dtype=torch.int64, device=dev)
    table, x, w_norm = rnd(vocab, hidden), rnd(1, hidden), rnd(hidden)
    q, k_slab, v_slab = rnd(1, hq, d), rnd(cached, hkv, d), rnd(cached, hkv, d)
    base = torch.zeros(1, dtype=torch.int32, device=dev)
    n_keys = torch.full((1,), cached, dtype=torch.int32, device=dev)
    pos = torch.full((1,), cached - 1, dtype=torch.int64, device=dev)
    gate, up, logits = rnd(1, inter), rnd(1, inter), rnd(1, vocab)
    split_rope = {}
    if (
        ops.rope_angles is not None and ops.rope_rotate is not None
    ):  # the step path's rope: angles once a step
        angles = ops.rope_angles(pos, 1e6, d)
        split_rope = {
            "step op rope_angles (once a step)": lambda: ops.rope_angles(pos, 1e6, d),
            "step op rope_rotate (q and k of every layer)": lambda: ops.rope_rotate(q, angles),
        }
    return {
        "step op embedding": lambda: ops.embedding(ids, table),
        "step op norm": lambda: ops.norm(x, w_norm, 1e-6),
        "step op rope": lambda: ops.rope(q, pos, 1e6),
        **split_rope,
        "step op attention": lambda: ops.attention(q, k_slab, v_slab, base, n_keys, d**-0.5),
        "step op swiglu": lambda: ops.swiglu(gate, up),
        "step op logp": lambda: ops.logp(logits, ids),
    }


def _native_state() -> dict[str, object]:
    """Whether the step ops ran their C++ path, and its counters (hits: replayed calls)."""
    from ws1_kernels.triton_ops import native

    return {"loaded": native.available(), **(native.stats() if native.available() else {})}


def _profile(fn: object, calls: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()  # type: ignore[operator]
    prof.disable()
    H.synchronize(DEVICE[0])
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(20)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=6144, help="output width (default: the qkv projection)")
    ap.add_argument("--k", type=int, default=4096, help="reduced width (default: hidden)")
    ap.add_argument("--profile-calls", type=int, default=2000)
    args = ap.parse_args(argv)
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if not torch.cuda.is_available() and not interp:
        print(
            "host_cost_triton: needs a CUDA device (or TRITON_INTERPRET=1 for a logic run)", file=sys.stderr
        )
        return 2
    DEVICE[0] = "cpu" if interp else "cuda"
    rows: dict[str, object] = {}
    calls = _calls(DEVICE[0], args.n, args.k)
    for name, fn in calls.items():
        try:
            cost = H.measure(DEVICE[0], fn)  # type: ignore[arg-type]
            rows[name] = cost.to_json()
        except Exception as exc:  # noqa: BLE001 - one layer failing leaves the others' figures
            rows[name] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        print(f"{name}: {rows[name]}", flush=True)
    profile = _profile(calls["gemm_forward_raw"], args.profile_calls)
    print(profile, flush=True)
    doc = {
        "device": torch.cuda.get_device_name()
        if DEVICE[0] == "cuda"
        else "cpu (TRITON_INTERPRET: logic only)",
        "torch": torch.__version__,
        "method": "ws1_harness.run.bench.host.measure: median of bursts; issue = host, graph = device",
        "rows": rows,
        "step_native": _native_state(),
        "raw_profile_tottime": profile,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
