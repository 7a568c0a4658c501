"""Operator adapters: how the harness feeds each chain node and which of its tensors are judged.

An adapter knows an operator's per-token inputs (row shapes at the tier's model widths), its parameters, its
non-tensor arguments, and how to call a candidate or the fp32 reference on one physical call. It never
computes anything the judgment depends on: the candidate's outputs and gradients are its own.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ws1_workload import ModelConfig
from ws1_workload.inputs import order_probe_positions

Tensor = torch.Tensor


@dataclass(frozen=True)
class TokenInput:
    """A per-token input: one row of `row_shape` per logical token.

    kind: "float" (random bf16 values, scaled by `scale`), "token_id" (the fixture's token ids) or "target"
    (the next token id, the id a logprob scores).
    """

    name: str
    row_shape: tuple[int, ...]
    kind: str = "float"
    scale: float = 1.0
    differentiable: bool = True


@dataclass(frozen=True)
class ParamInput:
    """A parameter: generated once per case from (case_id, name); its gradient follows the candidate's rule."""

    name: str
    shape: tuple[int, ...]
    scale: float = 1.0
    offset: float = 0.0
    #: a [N, K] weight that meets dot-order probe rows (`ws1_workload.inputs`): its probe columns (the forward's
    #: K sum) and probe rows (dx's N sum) are made equal, so the probes' +1 and -1 products cancel exactly
    order_probe: bool = False


@dataclass(frozen=True)
class OperatorAdapter:
    """Everything the harness needs to run one operator on any physical layout."""

    operator: str
    token_inputs: tuple[TokenInput, ...]
    params: tuple[ParamInput, ...]
    output_row_shape: tuple[int, ...]
    output_dtype: torch.dtype
    invoke: Callable[[Callable[..., Tensor], Mapping[str, Tensor], Mapping[str, Tensor], Any], Tensor]

    @property
    def grad_inputs(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.token_inputs if t.kind == "float" and t.differentiable)


def _pow2_scale(fan_in: int) -> float:
    """1/sqrt(fan_in) rounded to a power of two, so scaled bf16 values stay exactly representable."""
    return 2.0 ** -round(math.log2(math.sqrt(fan_in)))


@functools.lru_cache(maxsize=2)
def shared_param(seed: str, param: ParamInput) -> Tensor:
    """`make_param`, remembered for the two most recent (seed, parameter) pairs of this process.

    Callers never write into it: the harness clones a fresh leaf per layout. Two entries bound the host memory
    (a full-vocab bf16 weight is 1.2 GB).
    """
    return make_param(seed, param)


def make_param(case_id: str, param: ParamInput) -> Tensor:
    """Deterministic bf16 parameter from (case_id, name): never zero, exactly representable in bf16.

    Generated in row chunks straight into bf16: a [151936, 4096] weight must not cost 10 GB of fp32
    temporaries on a 24 GB machine.
    """
    digest = hashlib.sha256(f"ws1-param|{case_id}|{param.name}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    out = torch.empty(param.shape, dtype=torch.bfloat16)
    flat = out.view(param.shape[0], -1) if out.dim() > 1 else out.view(1, -1)
    rows_per_chunk = max(1, (1 << 22) // max(1, flat.shape[1]))
    for r0 in range(0, flat.shape[0], rows_per_chunk):
        r1 = min(flat.shape[0], r0 + rows_per_chunk)
        values = torch.randn((r1 - r0, flat.shape[1]), generator=gen, dtype=torch.float32)
        values = values * param.scale + param.offset
        values = torch.where(values == 0, torch.full_like(values, param.scale), values).to(torch.bfloat16)
        # rounding to bf16 may flush a tiny value to zero: never zero
        flat[r0:r1] = torch.where(values == 0, torch.full_like(values, param.scale), values)
    if param.order_probe:
        equalise_order_probe(out)
    return out


def equalise_order_probe(weight: Tensor) -> None:
    """Copy the weight's `plus` probe column over its `tiny` and `minus` columns, then the same for rows.

    A dot-order probe row (zeros but 2^-30, +1, -1 at `order_probe_positions`) against such a weight gives the
    products `2^-30 c`, `c`, `-c` with one `c` per output: the survivor of the probe is `2^-30 c` or exactly 0
    depending on the order of summation only. Two columns and two rows of a random weight change nothing else.
    """
    if weight.dim() != 2:
        raise ValueError(f"an order-probe weight is [N, K], got shape {tuple(weight.shape)}")
    tiny, plus, minus = order_probe_positions(weight.shape[1])
    weight[:, tiny] = weight[:, plus]
    weight[:, minus] = weight[:, plus]
    tiny, plus, minus = order_probe_positions(weight.shape[0])
    weight[tiny] = weight[plus]
    weight[minus] = weight[plus]


def build_adapters(model: ModelConfig) -> dict[str, OperatorAdapter]:
    """The adapters of every differentiable chain node at the widths of `model`."""
    h, d = model.hidden, model.head_dim
    hq, hkv, f, v = model.num_heads, model.num_kv_heads, model.intermediate, model.vocab
    eps, theta = model.rms_eps, model.rope_theta
    scale = 1.0 / math.sqrt(d)

    adapters = [
        OperatorAdapter(
            "embedding",
            (TokenInput("token_ids", (), kind="token_id", differentiable=False),),
            (ParamInput("weight", (v, h)),),
            (h,),
            torch.bfloat16,
            lambda fn, x, p, ctx: fn(x["token_ids"], p["weight"], ctx),
        ),
        OperatorAdapter(
            "rms_norm",
            (TokenInput("x", (h,)),),
            (ParamInput("weight", (h,), scale=0.125, offset=1.0),),
            (h,),
            torch.bfloat16,
            lambda fn, x, p, ctx: fn(x["x"], p["weight"], eps, ctx),
        ),
        OperatorAdapter(
            "qk_norm",
            (TokenInput("x", (hq, d)),),
            (ParamInput("weight", (d,), scale=0.125, offset=1.0),),
            (hq, d),
            torch.bfloat16,
            lambda fn, x, p, ctx: fn(x["x"], p["weight"], eps, ctx),
        ),
        # down_proj: the widest reduction of the model (K = intermediate), a shape on which cuBLAS is
        # batch-variant on the H200 (anchors.md).
        OperatorAdapter(
            "det_gemm",
            (TokenInput("x", (f,)),),
            (ParamInput("weight", (h, f), scale=_pow2_scale(f), order_probe=True),),
            (h,),
            torch.bfloat16,
            lambda fn, x, p, ctx: fn(x["x"], p["weight"], ctx),
        ),
        OperatorAdapter(
            "rope",
            (TokenInput("x", (hq, d)),),
            (),
            (hq, d),
            torch.bfloat16,
            lambda fn, x, p, ctx: fn(x["x"], theta, ctx),
        ),
        OperatorAdapter(
            "attention",
            (TokenInput("q", (hq, d)), TokenInput("k", (hkv, d)), TokenInput("v", (hkv, d))),
            (),
            (hq, d),
            torch.bfloat16,
            lambda fn, x, p, ctx: fn(x["q"], x["k"], x["v"], scale, ctx),
        ),
        OperatorAdapter(
            "silu",
            (TokenInput("x", (f,)),),
            (),
            (f,),
            torch.bfloat16,
            lambda fn, x, p, ctx: fn(x["x"], ctx),
        ),
        OperatorAdapter(
            "swiglu",
            (TokenInput("gate", (f,)), TokenInput("up", (f,))),
            (),
            (f,),
            torch.bfloat16,
            lambda fn, x, p, ctx: fn(x["gate"], x["up"], ctx),
        ),
        OperatorAdapter(
            "lm_head",
            (TokenInput("x", (h,)),),
            (ParamInput("weight", (v, h), scale=_pow2_scale(h), order_probe=True),),
            (v,),
            torch.bfloat16,
            lambda fn, x, p, ctx: fn(x["x"], p["weight"], ctx),
        ),
        OperatorAdapter(
            "logp",
            (
                TokenInput("logits", (v,), scale=4.0),
                TokenInput("targets", (), kind="target", differentiable=False),
            ),
            (),
            (),
            torch.float32,
            lambda fn, x, p, ctx: fn(x["logits"], x["targets"], ctx),
        ),
        OperatorAdapter(
            "linear_logp",
            (TokenInput("x", (h,)), TokenInput("targets", (), kind="target", differentiable=False)),
            (ParamInput("weight", (v, h), scale=_pow2_scale(h) * 4),),
            (),
            torch.float32,
            lambda fn, x, p, ctx: fn(x["x"], p["weight"], x["targets"], ctx),
        ),
    ]
    return {a.operator: a for a in adapters}
