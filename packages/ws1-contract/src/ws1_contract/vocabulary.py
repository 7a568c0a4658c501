"""The fixed vocabulary of the numerical contract.

These names are part of the contract's identity, not configuration: the gate's matrix is built from them and a
contract that adds, drops or renames one is a different contract (a new schema version), never a silent change.
The JSON Schema repeats them as enums; the semantic rules and the resolver read them from here.
"""

from __future__ import annotations

SCHEMA_VERSION = 1

ACCURACY_JUDGMENTS = ("forward_accuracy", "gradient_accuracy")
INVARIANCE_JUDGMENTS = ("forward_invariance", "gradient_invariance")
JUDGMENTS = ("forward_accuracy", "forward_invariance", "gradient_accuracy", "gradient_invariance")
CHAIN_PARITY = "chain_parity"
ROLE_NAMES = (*JUDGMENTS, CHAIN_PARITY)

OP_CLASSES = ("elementwise", "reduction", "gemm", "attention", "logprob")
DTYPES = ("fp32", "bf16", "fp16", "fp8")

STATUS_APPLICABLE = "applicable"
STATUS_OPTIONAL = "optional"
STATUS_NOT_APPLICABLE = "not_applicable"
STATUS_OUT_OF_SCOPE = "out_of_scope"
IN_SCOPE_STATUSES = (STATUS_APPLICABLE, STATUS_OPTIONAL)

MODE_TOLERANCE = "tolerance"
MODE_BITWISE = "bitwise"

# Invariance is judged on raw bits: the right side of every invariance role is the canonical layout.
INVARIANCE_ROLE = ("transformed_layout", "canonical_layout")
# Accuracy is judged against fp32 gold only: a bf16 "reference" hides a bf16 candidate's own error.
ACCURACY_RIGHT = "fp32_reference"
CHAIN_ROLE = ("training_teacher_forcing", "rollout_decode")

# Chain-level logprob aggregates over the active tokens, d = logp_left - logp_right per token.
DIFFERENCE_FORMULA = "logp_left - logp_right"
AGGREGATE_FORMULAS = {
    "max_abs_dlogp": "max(abs(d))",
    "approx_kl0": "mean(exp(d)-1-d)",
    "clipfrac0": "mean((exp(d) < clip_low) | (exp(d) > clip_high))",
}
AGGREGATES = tuple(AGGREGATE_FORMULAS)
# Chain-level gradient aggregates, per parameter gradient g of the trainer against g_ref of the fp32 reference
# drop-in (normwise: a whole bf16 model's accumulated rounding has no element-wise bound that a correct chain
# keeps at every width, while a gradient a few per cent off moves the norm of the difference at once).
GRADIENT_FORMULAS = {
    "grad_rel_l2": "norm2(g - g_ref) / norm2(g_ref)",
    "grad_rel_max_abs": "max(abs(g - g_ref)) / max(abs(g_ref))",
}
GRADIENT_AGGREGATES = tuple(GRADIENT_FORMULAS)
CHAIN_FORMULAS = {**AGGREGATE_FORMULAS, **GRADIENT_FORMULAS}
CLIP_LOW = 0.8
CLIP_HIGH = 1.2

# Every threshold (atol, rtol, chain aggregate) lies in [0, MAX_THRESHOLD]. An rtol of 1 already accepts an
# error as large as the value itself and an atol of 1 a factor e on a logprob: a larger number judges nothing,
# and a huge one (1e308, or an integer of 400 digits, which JSON allows) breaks the float arithmetic of the
# resolver and the comparators.
MAX_THRESHOLD = 1.0

# A threshold may be marked `calibrated` only when measured on at least this many active tokens and seeds
# (an earlier gate called thresholds "calibrated" after 27 tokens).
MIN_CALIBRATION_TOKENS = 4096
MIN_CALIBRATION_SEEDS = 3
