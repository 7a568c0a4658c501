"""The portable_cpu profile: pure-torch, batch-invariant candidates (see docs/kernels.md)."""

from ._blocks import (
    KEY_BLOCK,
    QUERY_BLOCK,
    ROW_BLOCK,
    VOCAB_BLOCK,
    WGRAD_BLOCK,
    clear_fp32_cache,
    fp32_cache_bytes,
)
from .attention import attention
from .embedding import embedding
from .linear import det_gemm, lm_head
from .logprob import linear_logp, logp
from .norm import qk_norm, rms_norm
from .pointwise import rope, silu, swiglu

__all__ = [
    "KEY_BLOCK",
    "QUERY_BLOCK",
    "ROW_BLOCK",
    "VOCAB_BLOCK",
    "WGRAD_BLOCK",
    "attention",
    "clear_fp32_cache",
    "det_gemm",
    "embedding",
    "fp32_cache_bytes",
    "linear_logp",
    "lm_head",
    "logp",
    "qk_norm",
    "rms_norm",
    "rope",
    "silu",
    "swiglu",
]
