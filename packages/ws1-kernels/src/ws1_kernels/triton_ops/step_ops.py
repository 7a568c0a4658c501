"""``triton_cuda_bf16``'s raw inference ops for the step path (``integrations.step``), as torch custom ops.

Why custom ops: ``torch.compile`` cannot trace into a Triton launcher written in Python (it reads tensor data
pointers and caches by shape), so each op is one op of the ``ws1_triton`` namespace (``_library.inference_op``:
a ``torch.library`` definition with a backend kernel, the dispatcher's cheapest path) with a fake implementation
that gives the output's shape, dtype and device. Dynamo then sees one opaque node per op,
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
from . import native
from ._library import NAMESPACE, inference_op
from .attention import slab_forward
from .embedding import gather_launch
from .gemm import gemm_forward_raw
from .logprob import LOGP_TILES, _logp_fwd
from .norm import norm_launch
from .pointwise import rope_launch, rope_table, swiglu_launch
from .pointwise import rope_rotate as rotate_by_table

__all__ = ["STEP_OPS"]

_NS = NAMESPACE


def _like(x: torch.Tensor, *_: object) -> torch.Tensor:
    return torch.empty_like(x)


@inference_op(
    "embedding(Tensor token_ids, Tensor weight) -> Tensor",
    lambda ids, w: w.new_empty((ids.shape[0], w.shape[1])),
)
def embedding(token_ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``weight[token_ids]``: ``[T] x [V,H] -> [T,H]``."""
    return gather_launch(token_ids, weight)


@inference_op("norm(Tensor x, Tensor weight, float eps) -> Tensor", _like)
def norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of ``x [T,H]`` or ``[T,Nh,D]``."""
    return norm_launch(x, weight, eps)


@inference_op("linear(Tensor x, Tensor weight) -> Tensor", lambda x, w: x.new_empty((x.shape[0], w.shape[0])))
def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [M,K] @ weight[N,K]^T``: the K walk in one fp32 accumulator, the tile of the frozen M bucket."""
    return gemm_forward_raw(x, weight)


@inference_op("rope(Tensor x, Tensor positions, float theta) -> Tensor", _like)
def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of ``x [T,Nh,D]`` at int64 ``positions [T]``."""
    return rope_launch(x, positions, theta)


@inference_op(
    "rope_angles(Tensor positions, float theta, int dim) -> Tensor",
    lambda positions, theta, dim: positions.new_empty((positions.shape[0], 2, dim // 2), dtype=torch.float32),
)
def rope_angles(positions: torch.Tensor, theta: float, dim: int) -> torch.Tensor:
    """rope's first kernel alone: the ``[T, 2, dim / 2]`` fp32 cos/sin table at int64 ``positions [T]``, made once
    per step and read by ``rope_rotate`` for q and k of every layer."""
    return rope_table(positions, theta, dim)


@inference_op("rope_rotate(Tensor x, Tensor table) -> Tensor", _like)
def rope_rotate(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """rope's second kernel alone: ``x [T,Nh,D]`` rotated by ``rope_angles``' table; with ``rope_angles`` the very
    kernels and arguments of ``rope``, so the same bits."""
    return rotate_by_table(x, table)


@inference_op(
    "attention(Tensor q, Tensor k_slab, Tensor v_slab, Tensor key_base, Tensor n_keys, float scale) -> Tensor",
    _like,
)
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


@inference_op("swiglu(Tensor gate, Tensor up) -> Tensor", _like)
def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``."""
    return swiglu_launch(gate, up)


@inference_op(
    "logp(Tensor logits, Tensor targets) -> Tensor",
    lambda logits, t: logits.new_empty((logits.shape[0],), dtype=torch.float32),
)
def logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The selected token's log-probability of each row: ``[T,V], [T] -> fp32 [T]``."""
    return _logp_fwd(logits, targets, LOGP_TILES, "fwd")[0]


if native.available():
    native.enable()

_ops = torch.ops.ws1_triton
STEP_OPS = StepOps(
    embedding=lambda ids, w: _ops.embedding(ids, w),
    norm=lambda x, w, eps: _ops.norm(x, w, eps),
    linear=lambda x, w: _ops.linear(x, w),
    rope=lambda x, positions, theta: _ops.rope(x, positions, theta),
    rope_angles=lambda positions, theta, dim: _ops.rope_angles(positions, theta, dim),
    rope_rotate=lambda x, table: _ops.rope_rotate(x, table),
    attention=lambda q, k, v, key_base, n_keys, scale: _ops.attention(q, k, v, key_base, n_keys, scale),
    swiglu=lambda gate, up: _ops.swiglu(gate, up),
    logp=lambda logits, targets: _ops.logp(logits, targets),
    namespaces=(_NS,),
    kernels=frozenset({"triton:_attn_slab_fwd"}),
)
