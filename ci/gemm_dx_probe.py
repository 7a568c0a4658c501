"""The Hopper GEMM's forward and dx kernels alone against cuBLAS, in one process, at the bench's det_gemm and lm_head
shapes: the figures the issue's dx target names, without the weight gradient (which the Hopper profile still runs
on the generic kernel) mixed into the bench's backward rows. Medians of `triton.testing.do_bench`; JSON lines to
stdout, one per (shape, M, direction).

    python ci/gemm_dx_probe.py --m 1 --m 64 --m 512 --m 4096
    python ci/gemm_dx_probe.py --m 384 --m 512 --tile 1 --tile 3   # the mid tile against the mid bucket's wide one

`--tile T` also times `ws1_sm90.gemm_tile` on tile T (0 small, 1 mid, 2 large, 3 the mid bucket's 128 x 192) at
every point, forward and dx (directions `fwd_tile<T>`, `dx_tile<T>`): every tile gives the same bits, so which one
runs is a speed choice, and this is where it is made.
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import torch
import triton.testing

import ws1_kernels.cuda_sm90  # its extension() loads the Hopper module: torch.ops.ws1_sm90


def gemm_shapes(model: str = "qwen3-8b") -> dict[str, tuple[int, int]]:
    """name -> (K, N) of the forward `x [M, K] @ w [N, K]^T`: the operator spec's det_gemm and lm_head bench
    shapes at the manifest's widths, as `ws1 bench` reads them."""
    from ws1_harness.run.bench.shapes import op_shapes
    from ws1_workload import load_manifest

    table = op_shapes(load_manifest(None).model(model))
    return {
        name: (int(d["K"]), int(d["N"])) for op in ("det_gemm", "lm_head") for name, d in table[op].items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, action="append", dest="ms")
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument(
        "--padded",
        action="store_true",
        help="also time the forward on x zero-padded to 64 rows (is a short A the slow part at small M?)",
    )
    ap.add_argument(
        "--tile", type=int, action="append", dest="tiles", metavar="T", help="also time tile T (0-3)"
    )
    args = ap.parse_args()
    if any(t not in (0, 1, 2, 3) for t in args.tiles or ()):
        raise SystemExit(f"gemm_dx_probe: --tile must be 0, 1, 2 or 3, got {args.tiles}")
    if ws1_kernels.cuda_sm90.extension() is None:
        raise SystemExit(f"gemm_dx_probe: {ws1_kernels.cuda_sm90.missing_reason()}")
    for name, (k, n) in gemm_shapes().items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for m in args.ms or (1, 64, 512, 4096):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            wt = w.t()
            pairs = {
                "fwd": (partial(torch.ops.ws1_sm90.gemm, x, w, True), partial(torch.mm, x, wt)),
                "dx": (partial(torch.ops.ws1_sm90.gemm, dy, w, False), partial(torch.mm, dy, w)),
            }
            for t in args.tiles or ():
                pairs[f"fwd_tile{t}"] = (
                    partial(torch.ops.ws1_sm90.gemm_tile, x, w, True, t),
                    partial(torch.mm, x, wt),
                )
                pairs[f"dx_tile{t}"] = (
                    partial(torch.ops.ws1_sm90.gemm_tile, dy, w, False, t),
                    partial(torch.mm, dy, w),
                )
            if args.padded and m < 64:
                xp = torch.zeros(64, k, device="cuda", dtype=torch.bfloat16)
                xp[:m] = x
                pairs["fwd_pad64"] = (partial(torch.ops.ws1_sm90.gemm, xp, w, True), partial(torch.mm, x, wt))
            for direction, (ours, peer) in pairs.items():
                t_ours = triton.testing.do_bench(ours, rep=args.rep_ms, return_mode="median")
                t_peer = triton.testing.do_bench(peer, rep=args.rep_ms, return_mode="median")
                flops = 2.0 * m * n * k
                print(
                    json.dumps(
                        {
                            "shape": name,
                            "m": m,
                            "dir": direction,
                            "ws1_ms": round(t_ours, 5),
                            "cublas_ms": round(t_peer, 5),
                            "ratio": round(t_peer / t_ours, 3),
                            "ws1_tflops": round(flops / t_ours / 1e9, 1),
                        }
                    ),
                    flush=True,
                )
            del x, dy, wt
        del w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
