"""fp32 references: the gold side of forward_accuracy and gradient_accuracy.

Same signatures as the candidates.  Inputs are upcast to fp32 (pass fp32 leaves, e.g.
``x.detach().float().requires_grad_()``, to get fp32 gradients), the math is plain fp32 torch, differentiable
by ordinary autograd, and TF32 is off inside every call (restored after).  Outputs are fp32.  No blocking, no
invariance tricks: this is the textbook formula.  Weight gradients land in ``weight.grad``.

``of(operator)`` is how every caller finds an operator's reference: the function of that name here, or the one a
plug-in operator brought with ``register`` (ws1_contract.operators.register_operator adds its spec).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from . import _validate as v
from .context import LayoutContext
from .op_checks import check_attention, check_rope
from .rope_math import rope_tables, rotate

__all__ = [
    "attention",
    "of",
    "register",
    "det_gemm",
    "embedding",
    "fp32_math",
    "linear_logp",
    "lm_head",
    "logp",
    "qk_norm",
    "rms_norm",
    "rope",
    "silu",
    "swiglu",
]

_T = TypeVar("_T")
_F32 = None  # dtype check: any float dtype is accepted and upcast


# Where torch keeps the precision of fp32 arithmetic. Torch 2.9 and later hold it per backend and operation
# (``fp32_precision``: "ieee" is plain fp32, "tf32" and "bf16" are reduced; the generic one sets all); the legacy
# switches (``allow_tf32``, ``set_float32_matmul_precision``) write into these, and their getters raise once the
# two APIs have left the settings in a state they cannot express. So the per-backend settings are what is saved,
# set and restored, parents before children. The legacy switches are set too (they keep state of their own that
# their getters consult) and restored where they could be read.
_PRECISION_SITES: tuple[tuple[str, ...], ...] = (
    (),
    ("cuda", "matmul"),
    ("cudnn",),
    ("cudnn", "conv"),
    ("cudnn", "rnn"),
    ("mkldnn",),
    ("mkldnn", "matmul"),
    ("mkldnn", "conv"),
    ("mkldnn", "rnn"),
)


def _precision_sites() -> list[tuple[object, str]]:
    """The per-backend ``fp32_precision`` settings this torch has (none before torch 2.9)."""
    out: list[tuple[object, str]] = []
    for path in _PRECISION_SITES:
        obj: object = torch.backends
        for part in path:
            obj = getattr(obj, part, None)
        if obj is not None and hasattr(obj, "fp32_precision"):
            out.append((obj, "fp32_precision"))
    return out


def _read(getter: Callable[[], _T]) -> _T | None:
    try:
        return getter()
    except RuntimeError:  # the two APIs left a state this legacy getter cannot express
        return None


# the legacy switches: (read, write, the fp32 value); each also writes the per-backend settings it covers
_LEGACY: tuple[tuple[Callable[[], Any], Callable[[Any], None], Any], ...] = (
    (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision, "highest"),
    (
        lambda: torch.backends.cuda.matmul.allow_tf32,
        lambda value: setattr(torch.backends.cuda.matmul, "allow_tf32", value),
        False,
    ),
    (
        lambda: torch.backends.cudnn.allow_tf32,
        lambda value: setattr(torch.backends.cudnn, "allow_tf32", value),
        False,
    ),
)


@contextmanager
def fp32_math() -> Iterator[None]:
    """Plain fp32 arithmetic for the duration: no TF32 and no bf16 inside fp32 matmuls or convolutions, on CUDA,
    cuDNN and oneDNN. Every setting it touches is restored on exit, also when the block raises.

    The one way ws1 enters fp32 reference math (the per-operator references here, the harness's reference runs,
    and the fp32 reference chain: the Qwen3 drop-in on these references); tests/test_fp32_math.py checks it.
    """
    sites = _precision_sites()
    saved_sites = [getattr(obj, attr) for obj, attr in sites]
    saved_legacy = [_read(read) for read, _write, _fp32 in _LEGACY]
    try:
        for _read_it, write, fp32 in _LEGACY:
            write(fp32)
        for obj, attr in sites:
            setattr(obj, attr, "ieee")
        yield
    finally:
        for (_read_it, write, _fp32), value in zip(_LEGACY, saved_legacy, strict=True):
            if value is not None:
                write(value)
        for (obj, attr), value in zip(sites, saved_sites, strict=True):
            setattr(obj, attr, value)


def embedding(token_ids: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    where = "reference.embedding"
    v.tensor(where, "weight", weight, 2, _F32)
    v.token_ids(where, "token_ids", token_ids, weight.shape[0])
    ctx.check_rows(where, token_ids.shape[0])
    with fp32_math():
        return weight.float()[token_ids]


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, ctx: LayoutContext) -> torch.Tensor:
    where = "reference.rms_norm"
    v.tensor(where, "x", x, 2, _F32)
    v.tensor(where, "weight", weight, 1, _F32)
    v.dims(where, "weight", weight, (x.shape[1],))
    eps = v.positive(where, "eps", eps)
    ctx.check_rows(where, x.shape[0])
    with fp32_math():
        return _rms(x, weight, eps)


def qk_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, ctx: LayoutContext) -> torch.Tensor:
    where = "reference.qk_norm"
    v.tensor(where, "x", x, 3, _F32)
    v.tensor(where, "weight", weight, 1, _F32)
    v.dims(where, "weight", weight, (x.shape[2],))
    eps = v.positive(where, "eps", eps)
    ctx.check_rows(where, x.shape[0])
    with fp32_math():
        return _rms(x, weight, eps)


def _linear(where: str, x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    v.tensor(where, "x", x, 2, _F32)
    v.tensor(where, "weight", weight, 2, _F32)
    v.dims(where, "weight", weight, (None, x.shape[1]))
    ctx.check_rows(where, x.shape[0])
    with fp32_math():
        return x.float() @ weight.float().t()


def det_gemm(x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    return _linear("reference.det_gemm", x, weight, ctx)


def lm_head(x: torch.Tensor, weight: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    return _linear("reference.lm_head", x, weight, ctx)


def rope(x: torch.Tensor, theta: float, ctx: LayoutContext) -> torch.Tensor:
    theta = check_rope("reference.rope", x, theta, ctx, _F32)
    with fp32_math():
        cos, sin = rope_tables(ctx.on(x.device)[1], x.shape[-1], theta)
        return rotate(x.float(), cos, sin)


def attention(
    q: torch.Tensor, k: torch.Tensor, v_: torch.Tensor, scale: float, ctx: LayoutContext
) -> torch.Tensor:
    """Explicit per-sample causal softmax(q k^T * scale) v with GQA; prefix keys first."""
    scale = check_attention("reference.attention", q, k, v_, scale, ctx, _F32)
    group = q.shape[1] // k.shape[1]
    with fp32_math():
        rows = []
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        for seg in ctx.segments:
            kk, vv = k[seg.start : seg.end].float(), v_[seg.start : seg.end].float()
            pre = ctx.kv_prefix.get(seg.sample_id)
            if pre is not None:
                kk = torch.cat([pre[0].float(), kk])
                vv = torch.cat([pre[1].float(), vv])
            kh = kk.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, L, D]
            vh = vv.repeat_interleave(group, dim=1).transpose(0, 1)
            qh = q[seg.start : seg.end].float().transpose(0, 1)  # [Hq, n, D]
            s = (qh @ kh.transpose(1, 2)) * scale
            qpos = torch.arange(seg.first_position, seg.first_position + seg.length, device=q.device)
            kpos = torch.arange(kk.shape[0], device=q.device)
            s = s.masked_fill(kpos[None, :] > qpos[:, None], float("-inf"))
            rows.append((seg, (torch.softmax(s, dim=-1) @ vh).transpose(0, 1)))
        if not rows:
            return out
        index = torch.cat([torch.arange(seg.start, seg.end, device=q.device) for seg, _ in rows])
        return out.index_put((index,), torch.cat([o for _, o in rows]))


def silu(x: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    v.tensor("reference.silu", "x", x, 2, _F32)
    ctx.check_rows("reference.silu", x.shape[0])
    with fp32_math():
        return torch.nn.functional.silu(x.float())


def swiglu(gate: torch.Tensor, up: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    where = "reference.swiglu"
    v.tensor(where, "gate", gate, 2, _F32)
    v.tensor(where, "up", up, 2, _F32)
    v.dims(where, "up", up, tuple(gate.shape))
    ctx.check_rows(where, gate.shape[0])
    with fp32_math():
        return torch.nn.functional.silu(gate.float()) * up.float()


def logp(logits: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    where = "reference.logp"
    v.tensor(where, "logits", logits, 2, _F32)
    ctx.check_rows(where, logits.shape[0])
    v.token_ids(where, "targets", targets, logits.shape[1])
    v.dims(where, "targets", targets, (logits.shape[0],))
    with fp32_math():
        return torch.log_softmax(logits.float(), dim=-1).gather(1, targets[:, None]).squeeze(1)


def linear_logp(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext
) -> torch.Tensor:
    where = "reference.linear_logp"
    logits = _linear(where, x, weight, ctx)
    v.token_ids(where, "targets", targets, weight.shape[0])
    v.dims(where, "targets", targets, (x.shape[0],))
    with fp32_math():
        return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None]).squeeze(1)


_PLUGIN_REFERENCES: dict[str, Callable[..., torch.Tensor]] = {}
_NOT_OPERATORS = frozenset({"fp32_math", "of", "register"})


def register(operator: str, fn: Callable[..., torch.Tensor]) -> None:
    """The fp32 reference of a plug-in operator (its spec registered with ws1_contract.operators)."""
    if operator in __all__:
        raise ValueError(f"reference.register: {operator!r} is a built-in operator's reference")
    if not callable(fn):
        raise TypeError(f"reference.register({operator!r}): not callable")
    _PLUGIN_REFERENCES[operator] = fn


def of(operator: str) -> Callable[..., torch.Tensor]:
    """The fp32 reference of `operator`; KeyError naming the operator when it has none."""
    if operator in _PLUGIN_REFERENCES:
        return _PLUGIN_REFERENCES[operator]
    if operator in __all__ and operator not in _NOT_OPERATORS:
        fn: Callable[..., torch.Tensor] = globals()[operator]
        return fn
    raise KeyError(f"no fp32 reference for operator {operator!r}")
