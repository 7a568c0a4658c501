"""ws1's speed targets, judged per row of a bench run against figures measured in the same run.

A target is met or missed; `None` means no target applies to the row (or a figure it needs is missing). The
GEMM and attention targets are ratios to the stock peer (peer time / candidate time, > 1 is faster than stock);
memory-bound ops are judged against the run's own copy ceiling, at sizes where launch latency no longer
dominates (>= 8192 rows); the selected-token logprob also has an absolute time at the full vocabulary.
The numbers are for the H200; on other devices they are still computed but say little. A profile built for one
chip's instructions is held to its own, stricter numbers where its issue set them (`PROFILE_TARGETS`: the Hopper
profile's GEMM, attention and logp); every other profile, and every other operator, to ws1's Triton targets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

GEMM_OPS = ("det_gemm", "lm_head")
# Triton targets vs cuBLAS: 0.9 where cuBLAS is compute-bound (M >= 512), 0.8 where it is weight-bandwidth or
# launch bound (M <= 64); the backward (dx and dW) 0.8. Between 64 and 512 no target is set.
GEMM_FWD_LARGE_M, GEMM_FWD_LARGE = 512, 0.9
GEMM_FWD_SMALL_M, GEMM_FWD_SMALL = 64, 0.8
GEMM_BWD = 0.8
# Attention vs SDPA (flash where torch picks it): forward 0.8, deterministic backward 0.7.
ATTN_FWD, ATTN_BWD = 0.8, 0.7
# Decode against a 4096-token cache: the key/value read at >= 70% of the copy ceiling, from batch 64 up (at batch
# 1 the 17 MB read takes ~4 us at the ceiling, below one kernel launch: latency, not bandwidth, bounds it).
DECODE_FRACTION, DECODE_MIN_BATCH = 0.70, 64
# Fused selected-token logprob at 4096 x full vocab: reading the bf16 logits once at the copy ceiling.
LOGP_MS, LOGP_ROWS, LOGP_VOCAB = 0.37, 4096, 151936


@dataclass(frozen=True)
class TargetSet:
    """The figures that differ between profiles: the GEMM forward at large and small M and its backward, attention
    forward and backward (ratios to the stock peer), and logp's time at 4096 x the full vocabulary (ms)."""

    name: str
    gemm_fwd_large: float
    gemm_fwd_small: float
    gemm_bwd: float
    attn_fwd: float
    attn_bwd: float
    logp_ms: float


#: ws1's Triton targets, for every profile without its own
DEFAULT = TargetSet(
    "ws1 (the Triton profile's)", GEMM_FWD_LARGE, GEMM_FWD_SMALL, GEMM_BWD, ATTN_FWD, ATTN_BWD, LOGP_MS
)
#: the Hopper profile's own (its issue): wgmma and TMA should reach cuBLAS at large M and beat it where cuBLAS reads
#: the weights below copy speed (M <= 64); dx and dW 0.9x; attention 0.9x SDPA forward and 0.8x backward (a
#: deterministic flash backward is about 0.82x a non-deterministic one); logp one read of the logits near the copy
#: ceiling
HOPPER = TargetSet("cuda_bf16_sm90 (the Hopper profile's)", 0.95, 1.0, 0.9, 0.9, 0.8, 0.33)
PROFILE_TARGETS: Mapping[str, TargetSet] = {"cuda_bf16_sm90": HOPPER}


def targets_of(profile: str | None) -> TargetSet:
    """The target set a profile's rows are judged by (DEFAULT for a profile without its own, or none given)."""
    return PROFILE_TARGETS.get(profile or "", DEFAULT)


# Memory-bound ops: >= 85% of the copy ceiling (GB/s, bytes read + written) at >= 8192 rows.
COPY_FRACTION, COPY_MIN_ROWS = 0.85, 8192
# Whole-model steps against the stock model in the same process (bench/steps.py): a training forward + backward
# within 1.15x of stock, a rollout decode step within 1.15x too (ratio >= 1 / slowdown): the RL-loop issue's targets
# for both (an earlier 1.2x for decode was looser than the target it stood for).
TRAIN_STEP_SLOWDOWN, DECODE_STEP_SLOWDOWN = 1.15, 1.15
# A fused operator against the operator it fuses, both the profile's own candidates at the same M in the same run:
# linear_logp's forward (the lm_head GEMM plus the log-sum-exp) within 1.1x of the lm_head forward alone. Judged
# only when the run measured both (`--op linear_logp --op lm_head`); a row that has no reference says so.
FUSED_OVER_GEMM = 1.1
REFERENCE_OF: Mapping[tuple[str, str], tuple[str, str]] = {("linear_logp", "fwd"): ("lm_head", "fwd")}
MEMORY_BOUND: Mapping[str, tuple[str, ...]] = {
    "rms_norm": ("fwd", "bwd"),
    "qk_norm": ("fwd", "bwd"),
    "rope": ("fwd", "bwd"),
    "silu": ("fwd", "bwd"),
    "swiglu": ("fwd", "bwd"),
    "logp": ("fwd", "bwd"),
    "embedding": ("fwd",),  # its backward scatters into the weight gradient: no bandwidth target
}


@dataclass(frozen=True)
class Target:
    """`kind`: "ratio_min" (ratio >= value), "ms_max" (candidate ms <= value), "copy_fraction_min"
    (candidate GB/s >= value x the run's copy ceiling) or "reference_ratio_max" (candidate ms <= value x the
    candidate ms of the row REFERENCE_OF names, at the same M in the same run)."""

    kind: str
    value: float
    text: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def target_for(
    op: str, phase: str, m: int, dims: Mapping[str, Any], profile: str | None = None
) -> Target | None:
    """The target of one row of `profile`'s run, or None."""
    ts = targets_of(profile)
    if op in ("train_step", "decode_step"):
        slowdown = TRAIN_STEP_SLOWDOWN if op == "train_step" else DECODE_STEP_SLOWDOWN
        return Target(
            "ratio_min", 1.0 / slowdown, f"within {slowdown}x of stock (ratio >= {1.0 / slowdown:.3f})"
        )
    if op in GEMM_OPS:
        if phase == "bwd":
            return Target("ratio_min", ts.gemm_bwd, f"ratio >= {ts.gemm_bwd}")
        if m >= GEMM_FWD_LARGE_M:
            return Target("ratio_min", ts.gemm_fwd_large, f"ratio >= {ts.gemm_fwd_large}")
        if m <= GEMM_FWD_SMALL_M:
            return Target("ratio_min", ts.gemm_fwd_small, f"ratio >= {ts.gemm_fwd_small}")
        return None
    if (op, phase) in REFERENCE_OF:
        ref_op, ref_phase = REFERENCE_OF[(op, phase)]
        return Target(
            "reference_ratio_max",
            FUSED_OVER_GEMM,
            f"<= {FUSED_OVER_GEMM}x {ref_op} {ref_phase} (same M, this run)",
        )
    if op == "attention":
        value = ts.attn_fwd if phase == "fwd" else ts.attn_bwd
        return Target("ratio_min", value, f"ratio >= {value}")
    if op == "attention_decode":
        if m < DECODE_MIN_BATCH:
            return None
        return Target("copy_fraction_min", DECODE_FRACTION, f">= {DECODE_FRACTION:.0%} of copy (KV read)")
    if op == "logp" and phase == "fwd" and m == LOGP_ROWS and dims.get("V") == LOGP_VOCAB:
        return Target("ms_max", ts.logp_ms, f"<= {ts.logp_ms} ms")
    if phase in MEMORY_BOUND.get(op, ()) and m >= COPY_MIN_ROWS:
        return Target("copy_fraction_min", COPY_FRACTION, f">= {COPY_FRACTION:.0%} of copy")
    return None


def judge(
    target: Target | None,
    ratio: float | None,
    candidate_ms: float | None,
    candidate_rate: float | None,
    copy_gbs: float | None,
    reference_ms: float | None = None,
) -> bool | None:
    """Met (True), missed (False), or not judged (None: no target, or a figure is missing; `reference_ms` is the
    referenced row's candidate time, for a "reference_ratio_max" target)."""
    if target is None:
        return None
    if target.kind == "reference_ratio_max":
        if candidate_ms is None or not reference_ms:
            return None
        return candidate_ms <= target.value * reference_ms
    if target.kind == "ratio_min":
        return None if ratio is None else ratio >= target.value
    if target.kind == "ms_max":
        return None if candidate_ms is None else candidate_ms <= target.value
    if target.kind == "copy_fraction_min":
        if candidate_rate is None or not copy_gbs:
            return None
        return candidate_rate >= target.value * copy_gbs
    raise ValueError(f"targets: unknown target kind {target.kind!r}")


def link_references(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Judge the rows whose target is another row of the same run (REFERENCE_OF), once every row is measured:
    each gets `reference` (the referenced row's op, phase, M and candidate ms, or None when the run has no ok row
    of it) and its `target_met`. Returns the rows it judged."""
    ok = {(r["op"], r["phase"], r["m"]): r for r in rows if r["status"] == "ok"}
    linked = []
    for r in rows:
        if (r["op"], r["phase"]) not in REFERENCE_OF or r.get("target") is None:
            continue
        ref_op, ref_phase = REFERENCE_OF[(r["op"], r["phase"])]
        ref = ok.get((ref_op, ref_phase, r["m"]))
        ref_ms = None if ref is None else ref["candidate_ms"]
        r["reference"] = (
            None if ref is None else {"op": ref_op, "phase": ref_phase, "m": r["m"], "candidate_ms": ref_ms}
        )
        target = Target(**r["target"])
        r["target_met"] = (
            judge(target, None, r["candidate_ms"], None, None, reference_ms=ref_ms)
            if r["status"] == "ok"
            else None
        )
        linked.append(r)
    return linked


def table(profile: str | None = None) -> list[dict[str, Any]]:
    """The target table of `profile`'s run as written into every bench JSON (so a reader sees the rules the rows
    were judged by; the first entry names the set)."""
    ts = targets_of(profile)
    return [
        {"set": ts.name},
        {
            "ops": list(GEMM_OPS),
            "phase": "fwd",
            "when": f"M >= {GEMM_FWD_LARGE_M}",
            "rule": f"ratio >= {ts.gemm_fwd_large}",
        },
        {
            "ops": list(GEMM_OPS),
            "phase": "fwd",
            "when": f"M <= {GEMM_FWD_SMALL_M}",
            "rule": f"ratio >= {ts.gemm_fwd_small}",
        },
        {"ops": list(GEMM_OPS), "phase": "bwd", "when": "any M", "rule": f"ratio >= {ts.gemm_bwd}"},
        {"ops": ["attention"], "phase": "fwd", "when": "any M", "rule": f"ratio >= {ts.attn_fwd}"},
        {"ops": ["attention"], "phase": "bwd", "when": "any M", "rule": f"ratio >= {ts.attn_bwd}"},
        {
            "ops": ["attention_decode"],
            "phase": "fwd",
            "when": f"batch >= {DECODE_MIN_BATCH}, cache 4096",
            "rule": f"KV read >= {DECODE_FRACTION:.0%} of copy",
        },
        {
            "ops": ["logp"],
            "phase": "fwd",
            "when": f"M = {LOGP_ROWS}, V = {LOGP_VOCAB}",
            "rule": f"candidate <= {ts.logp_ms} ms",
        },
        {
            "ops": sorted(MEMORY_BOUND),
            "phase": "fwd, bwd (embedding: fwd)",
            "when": f"M >= {COPY_MIN_ROWS}",
            "rule": f"candidate GB/s >= {COPY_FRACTION} x copy ceiling",
        },
        {
            "ops": [op for op, _ in REFERENCE_OF],
            "phase": "fwd",
            "when": "the run also measured "
            + ", ".join(f"{o} {p}" for o, p in REFERENCE_OF.values())
            + " at that M",
            "rule": f"candidate ms <= {FUSED_OVER_GEMM} x that row's candidate ms",
        },
        {
            "ops": ["train_step"],
            "phase": "fwd+bwd",
            "when": "any tokens",
            "rule": f"within {TRAIN_STEP_SLOWDOWN}x of stock: ratio >= 1/{TRAIN_STEP_SLOWDOWN}",
        },
        {
            "ops": ["decode_step"],
            "phase": "fwd",
            "when": "any batch",
            "rule": f"within {DECODE_STEP_SLOWDOWN}x of stock: ratio >= 1/{DECODE_STEP_SLOWDOWN}",
        },
    ]
