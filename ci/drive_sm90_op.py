"""Call one Hopper op a few times at one shape, for a profiler (Nsight Compute) to catch one launch of its kernel.

`ws1 bench` times ops, but under `ncu` a bench run profiles whichever kernels its setup launches too, and its
Python start-up dominates a short replay. This driver makes exactly `--iters` calls of one op at the lm_head shape
(x [M, 4096] bf16, w [151936, 4096] bf16) on fresh random inputs and nothing else, so that `--launch-skip` picks a
warm launch of the op's own kernel:

    ncu --section SpeedOfLight --section WarpStateStats -k regex:device_kernel --launch-skip 2 --launch-count 1 \\
        python ci/drive_sm90_op.py --op linear_logp --m 512

ops: `linear_logp` (the fused forward: the GEMM with its log-sum-exp epilogue, then the fold of its partials),
`gemm` (the lm_head GEMM of the M bucket `ws1_sm90.gemm` picks), `gemm_f32` (the fused forward's mainloop and tile
with a plain fp32 store instead of its epilogue), `wgrad` (the weight gradient of an [N, K] weight over M rows of
one sample, `--consumers` warpgroups a CTA and `--stage-rows` rows a stage, by default the variant the wiring
launches, into a main_grad made outside the timing), `cublas_wgrad` (the peer a user would otherwise run for it:
`dy.T @ x` through cuBLAS, bf16 out). It needs the Hopper module on the path and an sm_90 device; it prints the
median time per call from CUDA events (with the profiler attached that figure is the profiler's, not the
kernel's). Exit 0 after the calls, 2 on a bad argument or a missing module/device.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

OPS = ("linear_logp", "gemm", "gemm_f32", "wgrad", "cublas_wgrad")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line, `<name>: <what>`, exit 2 (not usage and error on two lines)."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._name = name

    def error(self, message: str) -> NoReturn:
        print(f"{self._name}: {message}", file=sys.stderr)
        raise SystemExit(2)


def one_sample_table(m: int, device: Any) -> Any:
    """The weight gradient's block table of M rows that are one sample, positions 0..M-1 (no empty slot but the
    last block's tail)."""
    import torch

    from ws1_kernels import LayoutContext
    from ws1_kernels.row_tables import block_table

    ctx = LayoutContext(torch.zeros(m, dtype=torch.int64), torch.arange(m, dtype=torch.int64))
    return block_table(ctx, m, device)


def wgrad_variant(consumers: int | None, stage_rows: int | None) -> tuple[int, int]:
    """The weight gradient's variant to drive: each value given, else the wiring's (``WGRAD_VARIANT``), so that a
    profile of the default is a profile of what runs."""
    from ws1_kernels.cuda_sm90.linear import WGRAD_VARIANT

    return (
        WGRAD_VARIANT[0] if consumers is None else consumers,
        WGRAD_VARIANT[1] if stage_rows is None else stage_rows,
    )


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser("drive_sm90_op", description=__doc__.splitlines()[0])
    p.add_argument("--op", choices=OPS, required=True)
    p.add_argument("--m", type=int, required=True, help="rows (tokens)")
    p.add_argument("--n", type=int, default=151936, help="vocab (the GEMM's N)")
    p.add_argument("--k", type=int, default=4096, help="hidden (the GEMM's K)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--consumers", type=int, default=None, choices=(1, 2), help="wgrad: warpgroups a CTA")
    p.add_argument(
        "--stage-rows", type=int, default=None, choices=(32, 64), help="wgrad: rows a pipeline stage"
    )
    a = p.parse_args(argv)
    if min(a.m, a.n, a.k, a.iters) <= 0:
        print(
            f"drive_sm90_op: --m, --n, --k and --iters must be positive, got {a.m} {a.n} {a.k} {a.iters}",
            file=sys.stderr,
        )
        return 2
    import torch

    from ws1_kernels import cuda_sm90

    if cuda_sm90.extension() is None or not torch.cuda.is_available():
        print(f"drive_sm90_op: {cuda_sm90.missing_reason() or 'no CUDA device'}", file=sys.stderr)
        return 2
    consumers, stage_rows = wgrad_variant(a.consumers, a.stage_rows)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(a.m, a.k, device="cuda", generator=g).to(torch.bfloat16)
    wgrad = "wgrad" in a.op  # the weight gradient's ops take dy, not the weight
    w = None if wgrad else (torch.randn(a.n, a.k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    targets = torch.randint(0, a.n, (a.m,), device="cuda", generator=g)
    dy = torch.randn(a.m, a.n, device="cuda", generator=g).to(torch.bfloat16) if wgrad else None
    table: Any = one_sample_table(a.m, x.device) if a.op == "wgrad" else None
    main_grad = torch.zeros(a.n, a.k, device="cuda") if a.op == "wgrad" else None
    calls = {
        "linear_logp": lambda: torch.ops.ws1_sm90.linear_logp_fwd(x, w, targets),
        "gemm": lambda: torch.ops.ws1_sm90.gemm(x, w, True),
        "gemm_f32": lambda: torch.ops.ws1_sm90.gemm_f32(x, w, True),
        "wgrad": lambda: torch.ops.ws1_sm90.wgrad(
            dy,
            x,
            table.rows,
            table.n_blocks,
            main_grad,
            None,
            consumers,
            stage_rows,
        ),
        "cublas_wgrad": lambda: torch.mm(dy.t(), x),  # type: ignore[union-attr]
    }
    call = calls[a.op]
    times = []
    for _ in range(a.iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    print(
        f"drive_sm90_op {a.op} M={a.m} N={a.n} K={a.k}: median {times[len(times) // 2]:.3f} ms over {a.iters}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
