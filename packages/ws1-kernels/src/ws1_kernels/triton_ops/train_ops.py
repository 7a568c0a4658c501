"""``triton_cuda_bf16``'s training ops as torch custom ops with autograd, so ``torch.compile(fullgraph=True)``
traces a whole training forward and backward (``integrations.train_compiled``) without a graph break.

Why custom ops: Dynamo cannot trace into the Triton launcher (it reads data pointers, caches by shape) nor into
the candidates' host-side tables, so every kernel call is one opaque ``torch.library.custom_op`` in the
``ws1_triton`` namespace with a fake implementation, and ``register_autograd`` gives each forward op its
backward ops. AOTAutograd then traces the joint graph from the fakes; at run time each op launches the
candidate's own kernels.

Why these give the candidates' bits: each op body calls the launch function the candidate's autograd uses, with
the same tiles and the same tables (``norm_backward``, ``embedding_backward``, ``swiglu_backward``,
``rope_rotate``, ``logp_backward``, the GEMM's forward, dx and ``gemm_wgrad``, the attention's ``_forward`` and
``_backward``), in the same order within a layer.

Where the layout comes from: the tables depend on the call's ``LayoutContext`` (rows in logical order, the
sample-aligned weight-gradient blocks, the attention plan, the rope angles), which no op can take as an argument.
The ops read it from ``train_scope`` at run time, the pattern serving engines use for attention metadata: the
context of the call is set around the compiled forward and its backward, and the tables are built once per
context and cached on it (the candidates' own caches), never once per layer.

Where the weight gradients go: a forward op takes the weight's ``main_grad`` (fp32) as an input it does not
read; its backward op adds the weight gradient into it in place (``mutates_args``), in the fixed block order of
``sample_blocks_main_grad``, and returns no gradient for the weight itself, as the candidates do.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..context import LayoutContext
from ..errors import KernelInputError
from ..row_tables import block_table, logical_rows
from . import attention as att
from .embedding import embedding_backward, gather_launch
from .gemm import _dx, _forward, _rows_for, gemm_wgrad, wgrad_tile
from .logprob import LOGP_TILES, _logp_fwd, logp_backward
from .norm import norm_backward, norm_launch
from .pointwise import _ctx_table, rope_rotate, swiglu_backward, swiglu_launch

__all__ = ["current_scope", "train_scope"]

_NS = "ws1_triton"
#: process-wide, not thread-local: autograd runs a CUDA backward on its own device thread
_SCOPE: list[LayoutContext] = []


@contextmanager
def train_scope(lctx: LayoutContext) -> Iterator[LayoutContext]:
    """Make ``lctx`` the layout every training op reads, for the forward and its backward (one trainer per
    process: the scope is process-wide so that autograd's device thread sees it)."""
    if not isinstance(lctx, LayoutContext):
        raise KernelInputError(f"train_scope: need a LayoutContext, got {type(lctx).__name__}")
    _SCOPE.append(lctx)
    try:
        yield lctx
    finally:
        _SCOPE.pop()


def current_scope(where: str) -> LayoutContext:
    """The innermost ``train_scope``'s context (``KernelInputError`` outside one: no op guesses a layout)."""
    if not _SCOPE:
        raise KernelInputError(f"{where}: no train_scope is open (run the forward and backward inside one)")
    return _SCOPE[-1]


def _allow_fp32(t: torch.Tensor) -> bool:
    """fp32 operands run the fp32 twins (interpreter tests); bf16 the candidates' own path."""
    return t.dtype == torch.float32


# ---------------------------------------------------------------------------------------------- embedding


@torch.library.custom_op(f"{_NS}::train_embedding", mutates_args=())
def train_embedding(token_ids: torch.Tensor, weight: torch.Tensor, main_grad: torch.Tensor) -> torch.Tensor:
    """``weight[token_ids]``; its backward adds into ``main_grad``."""
    return gather_launch(token_ids, weight)


@train_embedding.register_fake
def _(token_ids: torch.Tensor, weight: torch.Tensor, main_grad: torch.Tensor) -> torch.Tensor:
    return weight.new_empty((token_ids.shape[0], weight.shape[1]))


@torch.library.custom_op(f"{_NS}::train_embedding_wgrad", mutates_args=("main_grad",))
def train_embedding_wgrad(token_ids: torch.Tensor, dy: torch.Tensor, main_grad: torch.Tensor) -> None:
    """``main_grad[id] += dy[row]``, rows in logical order (pads skipped)."""
    rows = logical_rows(current_scope("ws1_triton.train_embedding_wgrad"), dy.device)
    if rows is not None:
        embedding_backward(token_ids, dy, rows, main_grad)


@train_embedding_wgrad.register_fake
def _(token_ids: torch.Tensor, dy: torch.Tensor, main_grad: torch.Tensor) -> None:
    return None


def _embedding_setup(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    token_ids, _weight, main_grad = inputs
    ctx.save_for_backward(token_ids, main_grad)


def _embedding_bwd(ctx, dy):  # type: ignore[no-untyped-def]
    token_ids, main_grad = ctx.saved_tensors
    torch.ops.ws1_triton.train_embedding_wgrad(token_ids, dy, main_grad)
    return None, None, None


train_embedding.register_autograd(_embedding_bwd, setup_context=_embedding_setup)


# ---------------------------------------------------------------------------------------------- norm


@torch.library.custom_op(f"{_NS}::train_norm", mutates_args=())
def train_norm(x: torch.Tensor, weight: torch.Tensor, main_grad: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of ``x [T,H]`` or ``[T,Nh,D]``."""
    return norm_launch(x, weight, eps)


@train_norm.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, main_grad: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op(f"{_NS}::train_norm_bwd", mutates_args=("main_grad",))
def train_norm_bwd(
    x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, main_grad: torch.Tensor, eps: float
) -> torch.Tensor:
    """dx, and ``main_grad += dw`` in the block order of the scope's context."""
    table = block_table(current_scope("ws1_triton.train_norm_bwd"), x.shape[0], x.device)
    dx = norm_backward(x, weight, dy, eps, table, main_grad, do_dx=True, do_dw=True)
    assert dx is not None
    return dx


@train_norm_bwd.register_fake
def _(
    x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, main_grad: torch.Tensor, eps: float
) -> torch.Tensor:
    return torch.empty_like(x)


def _norm_setup(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    x, weight, main_grad, eps = inputs
    ctx.save_for_backward(x, weight, main_grad)
    ctx.eps = eps


def _norm_bwd(ctx, dy):  # type: ignore[no-untyped-def]
    x, weight, main_grad = ctx.saved_tensors
    return torch.ops.ws1_triton.train_norm_bwd(x, weight, dy, main_grad, ctx.eps), None, None, None


train_norm.register_autograd(_norm_bwd, setup_context=_norm_setup)


# ---------------------------------------------------------------------------------------------- linear


@torch.library.custom_op(f"{_NS}::train_linear", mutates_args=())
def train_linear(x: torch.Tensor, weight: torch.Tensor, main_grad: torch.Tensor) -> torch.Tensor:
    """``x [M,K] @ weight[N,K]^T``: the candidate's forward (frozen M-bucket tile, K in one accumulator)."""
    return _forward(x, weight, None, None, "fwd")


@train_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, main_grad: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op(f"{_NS}::train_linear_dx", mutates_args=())
def train_linear_dx(dy: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``dy [M,N] @ weight [N,K]``: the candidate's dx kernel."""
    return _dx(dy.contiguous(), weight, None, None, "bwd")


@train_linear_dx.register_fake
def _(dy: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return dy.new_empty((dy.shape[0], weight.shape[1]))


@torch.library.custom_op(f"{_NS}::train_linear_wgrad", mutates_args=("main_grad",))
def train_linear_wgrad(dy: torch.Tensor, x: torch.Tensor, main_grad: torch.Tensor) -> None:
    """``main_grad += dy^T x`` over the scope's sample-aligned blocks, in order."""
    tile = wgrad_tile(main_grad.shape[0], main_grad.shape[1])
    rows = _rows_for(current_scope("ws1_triton.train_linear_wgrad"), dy.device, tile.blocks_per_step)
    gemm_wgrad(dy.contiguous(), x, main_grad, rows, tile=tile, phase="bwd")


@train_linear_wgrad.register_fake
def _(dy: torch.Tensor, x: torch.Tensor, main_grad: torch.Tensor) -> None:
    return None


def _linear_setup(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    x, weight, main_grad = inputs
    ctx.save_for_backward(x, weight, main_grad)


def _linear_bwd(ctx, dy):  # type: ignore[no-untyped-def]
    x, weight, main_grad = ctx.saved_tensors
    dx = torch.ops.ws1_triton.train_linear_dx(
        dy, weight
    )  # dx first, then the weight gradient: as the candidate
    torch.ops.ws1_triton.train_linear_wgrad(dy, x, main_grad)
    return dx, None, None


train_linear.register_autograd(_linear_bwd, setup_context=_linear_setup)


# ---------------------------------------------------------------------------------------------- rope


def _rope_table(x: torch.Tensor, theta: float, where: str) -> torch.Tensor:
    lctx = current_scope(where)
    _, positions = lctx.on(x.device)
    return _ctx_table(lctx, positions, theta, x.shape[2])


@torch.library.custom_op(f"{_NS}::train_rope", mutates_args=())
def train_rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of ``x [T,Nh,D]`` at the scope's positions."""
    return rope_rotate(x, _rope_table(x, theta, "ws1_triton.train_rope"))


@train_rope.register_fake
def _(x: torch.Tensor, theta: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op(f"{_NS}::train_rope_bwd", mutates_args=())
def train_rope_bwd(dy: torch.Tensor, theta: float) -> torch.Tensor:
    """The inverse rotation of the upstream gradient."""
    return rope_rotate(dy, _rope_table(dy, theta, "ws1_triton.train_rope_bwd"), backward=True)


@train_rope_bwd.register_fake
def _(dy: torch.Tensor, theta: float) -> torch.Tensor:
    return torch.empty_like(dy)


def _rope_setup(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    ctx.theta = inputs[1]


def _rope_bwd(ctx, dy):  # type: ignore[no-untyped-def]
    return torch.ops.ws1_triton.train_rope_bwd(dy, ctx.theta), None


train_rope.register_autograd(_rope_bwd, setup_context=_rope_setup)


# ---------------------------------------------------------------------------------------------- attention


def _attention_plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, where: str):  # type: ignore[no-untyped-def]
    """(scale, tiles, plan) of the scope's context: validated and built once per context and shape (cached on
    the context by the candidate's ``_prepare``)."""
    return att._prepare(q, k, v, scale, current_scope(where), None, _allow_fp32(q))


@torch.library.custom_op(f"{_NS}::train_attention", mutates_args=())
def train_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal GQA attention over the scope's samples: ``(out [T,Hq,D], lse fp32 [T,Hq])``."""
    checked, tiles, plan = _attention_plan(q, k, v, scale, "ws1_triton.train_attention")
    return att._forward(q, k, v, checked, plan, tiles)


@train_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::train_attention_bwd", mutates_args=())
def train_attention_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv): the candidate's delta, dq and dk/dv kernels (no atomics; fixed key-block order)."""
    checked, tiles, plan = _attention_plan(q, k, v, scale, "ws1_triton.train_attention_bwd")
    dq, dk, dv = att._backward(q, k, v, out, lse, dout, checked, plan, tiles, True, True)
    assert dq is not None and dk is not None and dv is not None
    return dq, dk, dv


@train_attention_bwd.register_fake
def _(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _attention_setup(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    q, k, v, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.scale = scale


def _attention_bwd(ctx, dout, _dlse):  # type: ignore[no-untyped-def]
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.ws1_triton.train_attention_bwd(q, k, v, out, lse, dout, ctx.scale)
    return dq, dk, dv, None


train_attention.register_autograd(_attention_bwd, setup_context=_attention_setup)


# ---------------------------------------------------------------------------------------------- swiglu


@torch.library.custom_op(f"{_NS}::train_swiglu", mutates_args=())
def train_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``."""
    return swiglu_launch(gate, up)


@train_swiglu.register_fake
def _(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(gate)


@torch.library.custom_op(f"{_NS}::train_swiglu_bwd", mutates_args=())
def train_swiglu_bwd(
    gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d gate, d up)."""
    dg, du = swiglu_backward(gate, up, dy)
    assert dg is not None and du is not None
    return dg, du


@train_swiglu_bwd.register_fake
def _(gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(gate), torch.empty_like(up)


def _swiglu_setup(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    ctx.save_for_backward(*inputs)


def _swiglu_bwd(ctx, dy):  # type: ignore[no-untyped-def]
    gate, up = ctx.saved_tensors
    return torch.ops.ws1_triton.train_swiglu_bwd(gate, up, dy)


train_swiglu.register_autograd(_swiglu_bwd, setup_context=_swiglu_setup)


# ---------------------------------------------------------------------------------------------- logp


@torch.library.custom_op(f"{_NS}::train_logp", mutates_args=())
def train_logp(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(selected-token logprob fp32 [T], logsumexp fp32 [T]) of each row."""
    out, lse = _logp_fwd(logits, targets, LOGP_TILES, "fwd")
    return out, lse


@train_logp.register_fake
def _(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows = (logits.shape[0],)
    return logits.new_empty(rows, dtype=torch.float32), logits.new_empty(rows, dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::train_logp_bwd", mutates_args=())
def train_logp_bwd(
    logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, g: torch.Tensor
) -> torch.Tensor:
    """d logits of the ``g``-weighted selected logprobs."""
    return logp_backward(logits, targets, lse, g, LOGP_TILES)


@train_logp_bwd.register_fake
def _(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(logits)


def _logp_setup(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    logits, targets = inputs
    ctx.save_for_backward(logits, targets, output[1])


def _logp_bwd(ctx, g, _dlse):  # type: ignore[no-untyped-def]
    logits, targets, lse = ctx.saved_tensors
    return torch.ops.ws1_triton.train_logp_bwd(logits, targets, lse, g), None


train_logp.register_autograd(_logp_bwd, setup_context=_logp_setup)
