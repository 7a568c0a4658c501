"""``triton_cuda_bf16``'s raw inference ops for the step path (``integrations.step``), as torch custom ops.

Why custom ops: ``torch.compile`` cannot trace into a Triton launcher written in Python (it reads tensor data
pointers and caches by shape), so each op is one ``torch.library.custom_op`` in the ``ws1_triton`` namespace with
a fake implementation that gives the output's shape, dtype and device. Dynamo then sees one opaque node per op,
``torch.compile(fullgraph=True)`` traces a whole step without a graph break, and the compiled step launches the
very kernels eager does. A CUDA graph captures the same launches: no op here reads a tensor back to the host.

Why these give the judged path's bits: each op launches the kernel of this profile's candidate for that
operator with the same tile (``norm_launch``, ``swiglu_launch``, ``rope_launch``, ``gather_launch``, the GEMM's
frozen table, the logp tiles), on inputs the step's plan validated once per step. Attention is the one new
kernel, ``_attn_slab_fwd``: the decode tile of ``_attn_fwd`` reading a row's keys in place from the slab, through
the same block step (see attention.py).

No op validates its inputs: the step plan (``integrations.step.plan_rows``) and the weights gathered once
(``StepWeights``) are where a step is checked, so a call costs its launch and not a validation.
"""

from __future__ import annotations

import torch

from ..step_ops import StepOps
from .attention import slab_forward
from .embedding import gather_launch
from .gemm import gemm_forward_raw
from .logprob import LOGP_TILES, _logp_fwd
from .norm import norm_launch
from .pointwise import rope_launch, swiglu_launch

__all__ = ["STEP_OPS"]

_NS = "ws1_triton"


@torch.library.custom_op(f"{_NS}::embedding", mutates_args=())
def embedding(token_ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``weight[token_ids]``: ``[T] x [V,H] -> [T,H]``."""
    return gather_launch(token_ids, weight)


@embedding.register_fake
def _(token_ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return weight.new_empty((token_ids.shape[0], weight.shape[1]))


@torch.library.custom_op(f"{_NS}::norm", mutates_args=())
def norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of ``x [T,H]`` or ``[T,Nh,D]``."""
    return norm_launch(x, weight, eps)


@norm.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op(f"{_NS}::linear", mutates_args=())
def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [M,K] @ weight[N,K]^T``: the K walk in one fp32 accumulator, the tile of the frozen M bucket."""
    return gemm_forward_raw(x, weight)


@linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op(f"{_NS}::rope", mutates_args=())
def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of ``x [T,Nh,D]`` at int64 ``positions [T]``."""
    return rope_launch(x, positions, theta)


@rope.register_fake
def _(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op(f"{_NS}::attention", mutates_args=())
def attention(
    q: torch.Tensor,
    k_slab: torch.Tensor,
    v_slab: torch.Tensor,
    key_base: torch.Tensor,
    n_keys: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal GQA attention of each row over ``n_keys`` keys from slab row ``key_base`` on."""
    return slab_forward(q, k_slab, v_slab, key_base, n_keys, scale)


@attention.register_fake
def _(
    q: torch.Tensor,
    k_slab: torch.Tensor,
    v_slab: torch.Tensor,
    key_base: torch.Tensor,
    n_keys: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return torch.empty_like(q)


@torch.library.custom_op(f"{_NS}::swiglu", mutates_args=())
def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``."""
    return swiglu_launch(gate, up)


@swiglu.register_fake
def _(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(gate)


@torch.library.custom_op(f"{_NS}::logp", mutates_args=())
def logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The selected token's log-probability of each row: ``[T,V], [T] -> fp32 [T]``."""
    return _logp_fwd(logits, targets, LOGP_TILES, "fwd")[0]


@logp.register_fake
def _(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return logits.new_empty((logits.shape[0],), dtype=torch.float32)


_ops = torch.ops.ws1_triton
STEP_OPS = StepOps(
    embedding=lambda ids, w: _ops.embedding(ids, w),
    norm=lambda x, w, eps: _ops.norm(x, w, eps),
    linear=lambda x, w: _ops.linear(x, w),
    rope=lambda x, positions, theta: _ops.rope(x, positions, theta),
    attention=lambda q, k, v, key_base, n_keys, scale: _ops.attention(q, k, v, key_base, n_keys, scale),
    swiglu=lambda gate, up: _ops.swiglu(gate, up),
    logp=lambda logits, targets: _ops.logp(logits, targets),
    namespaces=(_NS,),
    kernels=frozenset({"triton:_attn_slab_fwd"}),
)
