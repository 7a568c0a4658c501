"""A toy operator added the way docs/kernels.md says: its spec, its fp32 reference and one portable candidate,
all in this one file, with no edit anywhere else in the tree.

`toy_cube(x) = x^3` per element (class elementwise). Importing this module registers the operator's spec
(`ws1_contract.operators.register_operator`) and reference (`ws1_kernels.reference.register`); the attributes
below are plug-in profiles for `ws1 matrix --candidates toy_operator:<NAME>`:

- `TOY`: the healthy candidate (fp32 math, one rounding to bf16, its own backward);
- `TOY_OFF`: its output 1.1x too large (forward accuracy must go red);
- `TOY_SMALL_CALLS`: a call of fewer than 8 rows rounds differently (forward invariance must go red).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ws1_contract import operators as spec
from ws1_kernels import LayoutContext, reference
from ws1_kernels.launches import record
from ws1_kernels.registry import Candidate

OPERATOR = "toy_cube"
KERNEL = "ws1.test.toy_cube.pointwise"
Tensor = torch.Tensor

spec.register_operator(
    OPERATOR,
    {
        "op_class": "elementwise",
        "inputs": [{"name": "x", "role": "float", "shape": ["F"]}],
        "call": ["x"],
        "output": {"shape": ["F"], "dtype": "bfloat16"},
    },
)


def _reference(x: Tensor, ctx: LayoutContext) -> Tensor:
    """fp32 gold: the textbook formula, differentiable by autograd."""
    xf = x.float()
    return xf * xf * xf


reference.register(OPERATOR, _reference)


class _Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):  # type: ignore[override]
        record(KERNEL, "fwd")
        ctx.save_for_backward(x)
        xf = x.float()
        return (xf * xf * xf * factor).to(torch.bfloat16)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        record(KERNEL, "bwd")
        (x,) = ctx.saved_tensors
        xf = x.float()
        return (3.0 * xf * xf * g.float()).to(torch.bfloat16), None


def cube(x: Tensor, ctx: LayoutContext) -> Tensor:
    return _Cube.apply(x, 1.0)


def cube_off(x: Tensor, ctx: LayoutContext) -> Tensor:
    return _Cube.apply(x, 1.1)


def cube_small_calls(x: Tensor, ctx: LayoutContext) -> Tensor:
    """Batch-variant: a call of fewer than 8 rows scales by 1 + 2^-7 (a different path for small calls)."""
    return _Cube.apply(x, 1.0 + 2.0**-7 if x.shape[0] < 8 else 1.0)


DECLARED = frozenset({"aten._to_copy", "aten.mul", "aten.detach"})


def _profile(name: str, fn: Callable[..., Tensor]) -> Callable[[], tuple[str, list[Candidate]]]:
    def make() -> tuple[str, list[Candidate]]:
        cand = Candidate(
            profile=name,
            operator=OPERATOR,
            kernel_id=KERNEL,
            device="cpu",
            min_arch=None,
            param_grad_rule=None,
            declared_ops=DECLARED,
            fn=fn,
        )
        return name, [cand]

    return make


TOY = _profile("toy_portable", cube)
TOY_OFF = _profile("toy_off", cube_off)
TOY_SMALL_CALLS = _profile("toy_small_calls", cube_small_calls)
