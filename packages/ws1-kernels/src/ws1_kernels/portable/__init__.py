"""The portable_cpu profile: pure-torch, batch-invariant candidates (see docs/kernels.md).

Each operator module exports ``OPS[operator] = OpEntry(...)``; ``BACKEND`` collects them (ws1_kernels.backend).
"""

import sys

from ..backend import Backend, collect_ops
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
    "BACKEND",
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


def _load():
    found, broken = collect_ops(sys.modules[__name__])
    if broken:  # a portable module that does not import is a bug, never a missing operator
        name, why = next(iter(broken.items()))
        raise ImportError(f"{name}: {why}")
    return found, None


BACKEND = Backend(device="cpu", min_arch=None, param_grad_rule="sample_blocks_main_grad", load=_load)
