"""What `ws1 bench` measures: the benchmark points (operator, shape, M) at a model's widths.

Widths come from the workload manifest's model config (`qwen3-8b` by default, `tiny` for quick CPU runs), so the
benchmark and the gate measure the same layer shapes. M is the number of physical rows (tokens) of one call.
Attention packs M tokens as samples of `attn_seq` tokens (M <= attn_seq: one sample of M), the B x S packing of
an RL micro-batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# M of one call: decode (1), small and medium batches, a prefill/training micro-batch, and a large packed batch.
DEFAULT_M: tuple[int, ...] = (1, 16, 64, 512, 4096, 16384)
# Attention rows are whole samples of attn_seq tokens: 1, 4, 8 and 16 samples of 1024 tokens.
DEFAULT_ATTN_M: tuple[int, ...] = (1024, 4096, 8192, 16384)
DEFAULT_ATTN_SEQ = 1024
# Decode: M samples, one new token each, against a cache of DECODE_CACHE earlier tokens per sample (the rollout
# engine's step at batch 1, 64 and 256).
DEFAULT_DECODE_M: tuple[int, ...] = (1, 64, 256)
DECODE_CACHE = 4096

# Operators the bench knows, in report order (the layout-only `pack` has no candidate and is never benched).
BENCH_OPS: tuple[str, ...] = (
    "det_gemm",
    "lm_head",
    "logp",
    "linear_logp",
    "rms_norm",
    "qk_norm",
    "rope",
    "silu",
    "swiglu",
    "embedding",
    "attention",
    "attention_decode",
)
# A bench op that times another operator's candidate in another mode: the registry and manifest name.
OPERATOR_OF: Mapping[str, str] = {"attention_decode": "attention"}


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
    """op -> shape name -> dims, from a `ws1_workload.ModelConfig` (duck-typed: only its width fields)."""
    hidden = int(model.hidden)  # type: ignore[attr-defined]
    heads = int(model.num_heads)  # type: ignore[attr-defined]
    kv = int(model.num_kv_heads)  # type: ignore[attr-defined]
    hd = int(model.head_dim)  # type: ignore[attr-defined]
    inter = int(model.intermediate)  # type: ignore[attr-defined]
    vocab = int(model.vocab)  # type: ignore[attr-defined]
    eps = float(model.rms_eps)  # type: ignore[attr-defined]
    theta = float(model.rope_theta)  # type: ignore[attr-defined]
    return {
        # The four projections of a decoder layer, all through det_gemm (K = input width, N = output width).
        "det_gemm": {
            "qkv": {"K": hidden, "N": (heads + 2 * kv) * hd},
            "o": {"K": heads * hd, "N": hidden},
            "gate_up": {"K": hidden, "N": 2 * inter},
            "down": {"K": inter, "N": hidden},
        },
        "lm_head": {"lm_head": {"K": hidden, "N": vocab}},
        "logp": {"vocab": {"V": vocab}},
        "linear_logp": {"vocab": {"H": hidden, "V": vocab}},
        "rms_norm": {"hidden": {"H": hidden, "eps": eps}},
        "qk_norm": {"q_heads": {"Nh": heads, "D": hd, "eps": eps}},
        "rope": {"q_heads": {"Nh": heads, "D": hd, "theta": theta}},
        "silu": {"intermediate": {"F": inter}},
        "swiglu": {"intermediate": {"F": inter}},
        "embedding": {"vocab": {"V": vocab, "H": hidden}},
        "attention": {"gqa": {"Hq": heads, "Hkv": kv, "D": hd, "S": attn_seq}},
        # S = 1: every sample holds one query row (the new token) at position C, after C cached keys
        "attention_decode": {"gqa_cache": {"Hq": heads, "Hkv": kv, "D": hd, "S": 1, "C": DECODE_CACHE}},
    }


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
