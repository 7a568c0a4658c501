"""Time the Hopper weight gradient's variants against cuBLAS's `dy.T @ x`, in one process, on one device.

`ws1 bench` times the candidates a user runs (dx and dW together, the variant the wiring picks). Choosing that
variant needs the kernel alone, every variant side by side, and the peer in the same process: this script. For
each shape and row count it makes M rows of one sample (one sample-aligned block table), then times
`ws1_sm90.wgrad` for each variant and `torch.mm(dy.t(), x)` (bf16 out) with `ws1 bench`'s own timer
(`ws1_harness.run.bench.timing.make_timer`: the median of `triton.testing.do_bench`, the L2 flushed before each
call). The op's time includes its gather.

    python ci/wgrad_tiles_sm90.py --variant 1:32 --variant 2:64 --m 512 --m 4096 --out wgrad-tiles.json

`--shape NAME:N:K` (repeatable; default the operator spec's bench shapes of lm_head and det_gemm at the 8B
model's widths, as `ws1 bench` evaluates them), `--m` rows (repeatable; default 512 and 4096), `--variant C` or
`C:S` (repeatable; default the wired variant, `WGRAD_VARIANT`, then 1:64 and 2:64): C consumer warpgroups, and,
where the build's op has it, S rows a pipeline stage (`stage_rows`). Prints one line per shape and M, and writes
the figures with the device, torch and the commit (`WS1_SOURCE_COMMIT`) to `--out` when given. Exit 0 after
the runs, 2 on a bad argument (one line) or a missing module or device.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from drive_sm90_op import OneLineParser, one_sample_table  # noqa: E402  (a sibling script, not a package)

TILE = 128  # the kernel's tile (cuda_sm90.linear.WGRAD_TILE, a CPU test checks): N and K multiples of it
#: the operators whose weight gradient the kernel takes; their shapes are the operator spec's bench shapes
SPEC_OPS = ("lm_head", "det_gemm")


@dataclass(frozen=True)
class Variant:
    consumers: int
    stage_rows: int | None  # None: the op's default (a build without the argument)

    @property
    def label(self) -> str:
        return f"{self.consumers}wg" + ("" if self.stage_rows is None else f"/{self.stage_rows}")


@dataclass(frozen=True)
class Shape:
    name: str
    n: int
    k: int


@dataclass
class Row:
    shape: str
    n: int
    k: int
    m: int
    cublas_ms: float
    variants: dict[str, float]


class BadArgument(ValueError):
    pass


def parse_shape(text: str) -> Shape:
    parts = text.split(":")
    if len(parts) != 3 or not parts[0] or not all(p.isdigit() for p in parts[1:]):
        raise BadArgument(f"--shape {text!r}: expected NAME:N:K with positive integers")
    n, k = int(parts[1]), int(parts[2])
    if n <= 0 or k <= 0 or n % TILE or k % TILE:
        raise BadArgument(f"--shape {text!r}: N and K must be positive multiples of {TILE}")
    return Shape(parts[0], n, k)


def spec_shapes(model: str = "qwen3-8b") -> list[Shape]:
    """The operator spec's bench shapes of ``SPEC_OPS`` at ``model``'s widths (`ws1 bench`'s own evaluation)."""
    from ws1_harness.run.bench.shapes import op_shapes
    from ws1_workload.manifest import load_manifest

    table = op_shapes(load_manifest(None).model(model))
    return [Shape(name, int(d["N"]), int(d["K"])) for op in SPEC_OPS for name, d in table[op].items()]


def parse_variant(text: str) -> Variant:
    parts = text.split(":")
    if len(parts) not in (1, 2) or not all(p.isdigit() for p in parts):
        raise BadArgument(f"--variant {text!r}: expected C or C:S (consumers, stage rows)")
    consumers = int(parts[0])
    stage_rows = int(parts[1]) if len(parts) == 2 else None
    if consumers not in (1, 2) or stage_rows not in (None, 32, 64):
        raise BadArgument(f"--variant {text!r}: consumers must be 1 or 2, stage rows 32 or 64")
    return Variant(consumers, stage_rows)


#: the variants timed beside the wired one when no --variant is given
OTHER_VARIANTS = ("1:64", "2:64")


def default_variants() -> list[Variant]:
    """The wiring's variant (``WGRAD_VARIANT``) first, then ``OTHER_VARIANTS`` less it."""
    from ws1_kernels.cuda_sm90.linear import WGRAD_VARIANT

    wired = Variant(*WGRAD_VARIANT)
    return [wired, *(v for v in map(parse_variant, OTHER_VARIANTS) if v != wired)]


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser("wgrad_tiles_sm90", description=__doc__.splitlines()[0])
    p.add_argument("--shape", action="append", default=None, help="NAME:N:K (repeatable)")
    p.add_argument("--m", action="append", type=int, default=None, help="rows (repeatable)")
    p.add_argument("--variant", action="append", default=None, help="C or C:S (repeatable)")
    p.add_argument("--warmup-ms", type=float, default=25.0)
    p.add_argument("--rep-ms", type=float, default=100.0)
    p.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    a = p.parse_args(argv)
    try:
        variants = [parse_variant(v) for v in a.variant] if a.variant else default_variants()
        ms = a.m or [512, 4096]
        if min(ms) <= 0 or a.warmup_ms < 0 or a.rep_ms <= 0:
            raise BadArgument(
                f"--m and --rep-ms must be positive and --warmup-ms not negative, got --m {ms}, "
                f"--warmup-ms {a.warmup_ms}, --rep-ms {a.rep_ms}"
            )
        if a.out is not None and a.out.exists():
            raise BadArgument(f"--out {a.out}: exists; give a new path")
        shapes = [parse_shape(s) for s in a.shape] if a.shape else spec_shapes()
    except BadArgument as e:
        print(f"wgrad_tiles_sm90: {e}", file=sys.stderr)
        return 2
    import torch

    from ws1_kernels import cuda_sm90

    if cuda_sm90.extension() is None or not torch.cuda.is_available():
        print(f"wgrad_tiles_sm90: {cuda_sm90.missing_reason() or 'no CUDA device'}", file=sys.stderr)
        return 2
    from ws1_harness.run.bench.timing import make_timer

    timer = make_timer("cuda", a.warmup_ms, a.rep_ms)
    rows = []
    for s in shapes:
        for m in ms:
            rows.append(_time_shape(torch, s, m, variants, timer))
            torch.cuda.empty_cache()  # the shape's tensors went with its frame
    if a.out is not None:
        record: dict[str, Any] = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "commit": os.environ.get("WS1_SOURCE_COMMIT", "unknown"),
            "timer": timer.name,
            "warmup_ms": a.warmup_ms,
            "rep_ms": a.rep_ms,
            "rows": [asdict(r) for r in rows],
        }
        a.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


def _time_shape(torch: Any, shape: Shape, m: int, variants: list[Variant], timer: Any) -> Row:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, shape.k, device="cuda", generator=g).to(torch.bfloat16)
    dy = torch.randn(m, shape.n, device="cuda", generator=g).to(torch.bfloat16)
    table = one_sample_table(m, x.device)
    mg = torch.zeros(shape.n, shape.k, device="cuda")
    times: dict[str, float] = {}
    for v in variants:
        if shape.k % (TILE * v.consumers):
            continue  # the op refuses it, by the weight's K: not a variant of this shape
        extra = () if v.stage_rows is None else (v.stage_rows,)
        times[v.label] = timer(
            lambda v=v, extra=extra: torch.ops.ws1_sm90.wgrad(
                dy, x, table.rows, table.n_blocks, mg, None, v.consumers, *extra
            )
        )
    peer = timer(lambda: torch.mm(dy.t(), x))
    flop = 2.0 * m * shape.n * shape.k
    cells = ", ".join(
        f"{k} {t:.3f} ms ({flop / t / 1e9:.0f} TFLOP/s, {peer / t:.3f}x)" for k, t in times.items()
    )
    print(
        f"wgrad_tiles_sm90 {shape.name} N={shape.n} K={shape.k} M={m}: {cells}; cuBLAS {peer:.3f} ms",
        flush=True,
    )
    return Row(shape.name, shape.n, shape.k, m, peer, times)


if __name__ == "__main__":
    raise SystemExit(main())
