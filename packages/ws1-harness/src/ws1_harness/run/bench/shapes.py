"""What `ws1 bench` measures: the benchmark points (operator, shape, M) at a model's widths.

The shapes are the operator spec's `bench:` entries (`manifests/operators.yaml`), evaluated at the workload
manifest's model widths (`qwen3-8b` by default, `tiny` for quick CPU runs), so the benchmark and the gate measure
the same layer shapes. M is the number of physical rows (tokens) of one call.
Attention packs M tokens as samples of `attn_seq` tokens (M <= attn_seq: one sample of M), the B x S packing of
an RL micro-batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ws1_contract import operators as spec

# M of one call: decode (1), small and medium batches, a prefill/training micro-batch, and a large packed batch.
DEFAULT_M: tuple[int, ...] = (1, 16, 64, 512, 4096, 16384)
# Attention rows are whole samples of attn_seq tokens: 1, 4, 8 and 16 samples of 1024 tokens.
DEFAULT_ATTN_M: tuple[int, ...] = (1024, 4096, 8192, 16384)
DEFAULT_ATTN_SEQ = 1024
# Decode: M samples, one new token each, against a cache of DECODE_CACHE earlier tokens per sample (the rollout
# engine's step at batch 1, 64 and 256).
DEFAULT_DECODE_M: tuple[int, ...] = (1, 64, 256)
DECODE_CACHE = 4096

# A bench op that times another operator's candidate in another mode (its shapes are below, not in the spec):
# bench op -> the registry / manifest operator it runs.
OPERATOR_OF: Mapping[str, str] = {"attention_decode": "attention"}


def bench_ops() -> tuple[str, ...]:
    """Every bench op in report order: each spec operator with bench shapes (chain order), each mode after its
    operator. The layout-only `pack` has none."""
    out: list[str] = []
    for name, op in spec.operators().items():
        if op.bench:
            out.append(name)
            out.extend(mode for mode, of in OPERATOR_OF.items() if of == name)
    return tuple(out)


BENCH_OPS: tuple[str, ...] = bench_ops()


def operator_of(op: str) -> str:
    """The registry / manifest operator a bench op runs (itself, except for a mode such as decode)."""
    return OPERATOR_OF.get(op, op)


@dataclass(frozen=True)
class Point:
    """One benchmark point: `dims` name the op's widths (K, N, H, V, F, Hq, Hkv, D, S, ...)."""

    op: str
    shape: str
    m: int
    dims: Mapping[str, int | float] = field(default_factory=dict)

    @property
    def samples(self) -> int:
        """Samples in the call: attention packs M rows as samples of S tokens; the other ops see one sample."""
        s = int(self.dims.get("S", self.m))
        return max(1, self.m // s)

    @property
    def seq(self) -> int:
        return int(self.dims.get("S", self.m))


def op_shapes(
    model: object, attn_seq: int = DEFAULT_ATTN_SEQ
) -> dict[str, dict[str, dict[str, int | float]]]:
    """op -> shape name -> dims, from a `ws1_workload.ModelConfig` (duck-typed: only its width fields).

    Each spec operator's bench dims, evaluated at the model's widths, plus the call scalars the case needs (eps,
    theta); attention's samples are `attn_seq` tokens long (S); decode attention is one query per sample (S = 1)
    after a cache of C keys."""
    table = spec.shipped_table()
    widths = spec.widths(model)
    out: dict[str, dict[str, dict[str, int | float]]] = {}
    for name, op in spec.operators().items():
        scalars = {a: spec.scalar(a, model) for a in op.call if a in table.scalars and a != "scale"}
        for shape, dims in op.bench.items():
            d: dict[str, int | float] = {k: spec.evaluate(v, widths) for k, v in dims.items()}
            out.setdefault(name, {})[shape] = {**d, **scalars}
    if "attention" in out:
        for dims in out["attention"].values():
            dims["S"] = attn_seq
        out["attention_decode"] = {
            f"{shape}_cache": {**dims, "S": 1, "C": DECODE_CACHE} for shape, dims in out["attention"].items()
        }
    return out


def all_shape_names(shapes: Mapping[str, Mapping[str, object]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for per_op in shapes.values() for name in per_op))


def points(
    op: str,
    shapes: Mapping[str, Mapping[str, Mapping[str, int | float]]],
    ms: Sequence[int] | None,
    shape_filter: Sequence[str] | None,
) -> list[Point]:
    """The points of one operator: its shapes (filtered) times the M list (the op's default when None).

    Attention takes S = min(attn_seq, M): a call of M <= S rows is one sample of M tokens.
    """
    out: list[Point] = []
    for name, dims in shapes[op].items():
        if shape_filter and name not in shape_filter:
            continue
        default = {"attention": DEFAULT_ATTN_M, "attention_decode": DEFAULT_DECODE_M}.get(op, DEFAULT_M)
        m_list = ms if ms else default
        for m in m_list:
            d = dict(dims)
            if op == "attention":
                d["S"] = min(int(d["S"]), m)
            out.append(Point(op, name, m, d))
    return out


def attention_m_error(m: int, seq: int) -> str | None:
    """None when M packs into whole samples of `seq` tokens (or is one shorter sample), else why not."""
    if m <= seq or m % seq == 0:
        return None
    return f"attention M={m} is neither <= --attn-seq {seq} nor a multiple of it"
