"""One forward and one backward of every candidate of a profile at small, odd shapes: the body that
compute-sanitizer (memcheck, racecheck) watches in `ci/device_gpu_run.sh sanitize`.

Why not `ws1 bench` itself: the bench also runs the stock peers, its ceilings (cuBLAS) and a CUDA-graph capture
for host cost; racecheck fails inside cuBLAS's Hopper kernels ("failed to handle a hardware exception") and the
capture's refused calls are API errors that drown the report. This driver runs the candidates alone, on the
bench's own inputs (run/bench/cases.py, at the manifest's tiny widths), so the sanitizer's verdict is about ws1's
kernels only. Exit 0 when every call returned; a raising call prints one line and exits 1.

    compute-sanitizer --tool memcheck --kernel-name kns=ws1_ --error-exitcode 1 \\
        python ci/sanitize_cuda.py --profile cuda_bf16 --m 1 --m 7 --m 33
"""

from __future__ import annotations

import argparse
import sys

import torch

from ws1_harness.run.bench import cases as C
from ws1_harness.run.bench import runner as R
from ws1_harness.run.bench.records import BenchInputError
from ws1_harness.run.bench.timing import one_line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cuda_bf16")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--m", type=int, action="append", dest="ms")
    ap.add_argument("--attn-seq", type=int, default=33)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    from pathlib import Path

    opts = R.Options(
        profile=args.profile,
        device=args.device,
        model=args.model,
        out=Path("."),
        ms=tuple(args.ms or (1, 7, 33)),
        attn_seq=args.attn_seq,
    )
    try:
        plan = R.make_plan(opts)
    except BenchInputError as exc:  # bad arguments: one line, exit 2
        print(f"sanitize_cuda: {exc}", file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    calls = failed = 0
    for op in plan.ops:
        cand, why = R._resolve(opts, op)
        if cand is None:
            print(f"sanitize {op}: unavailable: {why}", flush=True)
            failed += 1
            continue
        case = C.CASES[op]
        for p in plan.points[op]:
            gen = torch.Generator(device=dev).manual_seed(R.SEED)
            try:
                inputs = case.make(p, dev, gen)
                ctx = case.context(p, inputs) if case.context is not None else C.context(p)
                with torch.no_grad():
                    case.candidate(cand.fn, inputs, ctx, p)
                calls += 1
                if plan.differentiable[op]:
                    main_grad = cand.param_grad_rule == "sample_blocks_main_grad"
                    t, _ = R._leaves(inputs, case, main_grad)
                    out = case.candidate(cand.fn, t, ctx, p)
                    torch.autograd.backward(out, torch.ones_like(out))
                    calls += 1
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                print(f"sanitize {op} {p.shape} M={p.m}: ok", flush=True)
            except Exception as exc:  # noqa: BLE001 - one line per failing point, then the exit status
                failed += 1
                print(f"sanitize {op} {p.shape} M={p.m}: {one_line(exc)}", flush=True)
    print(f"sanitize: {calls} calls, {failed} failed ({args.profile}, {args.model} widths)", flush=True)
    return 1 if failed or not calls else 0


if __name__ == "__main__":
    sys.exit(main())
