"""Operator adapters: how the harness feeds each chain node and which of its tensors are judged.

Every adapter is read off the operator spec (`manifests/operators.yaml`, `ws1_contract.operators`): no operator
is described here.

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

from ws1_contract import operators as spec
from ws1_contract.operators import OperatorSpec
from ws1_harness.run import param_cache
from ws1_workload import ModelConfig
from ws1_workload.inputs import order_probe_positions, run_in_threads

Tensor = torch.Tensor
_DTYPES: Mapping[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float32": torch.float32}


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
    Large parameters come from the machine's shared folder when `WS1_PARAM_CACHE` names one (`param_cache`):
    every process of a GPU run then draws each full-vocabulary weight once between them.
    """
    folder = param_cache.cache_dir()
    if folder is None or math.prod(param.shape) < SHARED_MIN_NUMEL:
        return make_param(seed, param)
    key = param_cache.cache_key(seed, param.name, param.shape, param.scale, param.offset, param.order_probe)
    tensor, _ = param_cache.load_or_make(folder, key, param.shape, lambda: make_param(seed, param))
    return tensor


#: parameters at least this large go through the shared folder (a [4096, 1024] weight takes about 0.1 s to draw)
SHARED_MIN_NUMEL = 1 << 22


#: elements per block of `make_param`: each block has its own generator, so blocks are drawn in threads
PARAM_BLOCK_NUMEL = 1 << 22


def param_block_seed(base: int, block: int) -> int:
    """The generator seed of a parameter's row block: the parameter's own seed for block 0 (a parameter of one
    block draws what it always drew), then the next seeds in turn."""
    return (base + block) & ((1 << 63) - 1)


def make_param(case_id: str, param: ParamInput, threads: int | None = None) -> Tensor:
    """Deterministic bf16 parameter from (case_id, name): never zero, exactly representable in bf16.

    Drawn in row blocks of about `PARAM_BLOCK_NUMEL` elements straight into bf16: a [151936, 4096] weight must not
    cost 10 GB of fp32 temporaries on a 24 GB machine. Each block has its own generator (`param_block_seed`), so
    blocks are drawn by up to `threads` threads (default: torch's intra-op thread count) and the bits do not depend
    on how many: one sequential stream made a full-vocabulary weight take 5-10 s of one core while a GPU slot
    waited. Each block's arithmetic runs in place (scale and offset, zeros replaced by the scale before and after
    rounding to bf16). tests/ws1_harness/test_param_cache.py pins the bits.
    """
    digest = hashlib.sha256(f"ws1-param|{case_id}|{param.name}".encode()).digest()
    base = int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
    out = torch.empty(param.shape, dtype=torch.bfloat16)
    flat = out.view(param.shape[0], -1) if out.dim() > 1 else out.view(1, -1)
    rows_per_block = max(1, PARAM_BLOCK_NUMEL // max(1, flat.shape[1]))
    blocks = -(-flat.shape[0] // rows_per_block)

    def draw(block: int) -> None:
        r0 = block * rows_per_block
        r1 = min(flat.shape[0], r0 + rows_per_block)
        gen = torch.Generator().manual_seed(param_block_seed(base, block))
        values = torch.randn((r1 - r0, flat.shape[1]), generator=gen, dtype=torch.float32)
        values.mul_(param.scale).add_(param.offset)
        values.masked_fill_(values == 0, param.scale)
        rows = flat[r0:r1]
        rows.copy_(values)  # round to nearest even, as .to(torch.bfloat16)
        # rounding to bf16 may flush a tiny value to zero: never zero
        rows.masked_fill_(rows == 0, param.scale)

    workers = max(1, min(threads or torch.get_num_threads(), blocks))
    run_in_threads([functools.partial(draw, block) for block in range(blocks)], workers)
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


def adapter_for(op: OperatorSpec, model: ModelConfig) -> OperatorAdapter:
    """The adapter of one operator, read off its spec at the widths of `model`: its inputs with their roles and
    shapes, its parameter with its draw, and its call (inputs and scalars by name, then the layout context)."""
    w = spec.widths(model)
    token_inputs = tuple(
        TokenInput(
            i.name,
            tuple(spec.evaluate(d, w) for d in i.shape),
            kind=i.role,
            scale=i.scale,
            differentiable=i.differentiable,
        )
        for i in op.token_inputs
    )
    params = tuple(
        ParamInput(
            i.name,
            tuple(spec.evaluate(d, w) for d in i.shape),
            scale=i.scale * (_pow2_scale(w[i.fan_in]) if i.fan_in else 1.0),
            offset=i.offset,
            order_probe=i.order_probe,
        )
        for i in op.params
    )
    scalars = {a: spec.scalar(a, model) for a in op.call if a in spec.shipped_table().scalars}
    call = op.call

    def invoke(
        fn: Callable[..., Tensor], x: Mapping[str, Tensor], p: Mapping[str, Tensor], ctx: Any
    ) -> Tensor:
        args = [x[a] if a in x else p[a] if a in p else scalars[a] for a in call]
        return fn(*args, ctx)

    return OperatorAdapter(
        op.name,
        token_inputs,
        params,
        tuple(spec.evaluate(d, w) for d in op.output_shape),
        _DTYPES[op.output_dtype],
        invoke,
    )


def build_adapters(model: ModelConfig) -> dict[str, OperatorAdapter]:
    """The adapters of every operator with a candidate (the spec's, and any plug-in operator's)."""
    return {name: adapter_for(op, model) for name, op in spec.operators().items() if not op.layout_only}
