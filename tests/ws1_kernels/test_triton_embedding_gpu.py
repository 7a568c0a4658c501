"""embedding of the Triton profile on the GPU: bf16 at Qwen3-8B widths (V=151936, H=4096).

The forward is an exact gather; main_grad must equal, bit for bit, the portable candidate's algorithm run on
the same device (its rounds of fp32 adds in logical occurrence order are elementwise and correctly rounded),
whatever the layout, with repeated ids and both ends of the vocabulary.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from triton_memops_support import Batch, assert_bitwise, check_declared, context, gen, layout, run_layout  # noqa: E402

from ws1_kernels import KernelInputError, portable  # noqa: E402
from ws1_kernels.triton_ops import _launch, embedding  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        _launch.interpreting(), reason="TRITON_INTERPRET=1 runs kernels on the CPU, not the GPU"
    ),
]

BF, DEV = torch.bfloat16, "cuda"
V, H = 151936, 4096
BIG = Batch((700, 250, 137, 13), (100, 50, 30, 5))


@pytest.fixture(scope="module")
def weight() -> torch.Tensor:
    return gen(1, (V, H), 0.02, BF, DEV)


def _ids(n: int) -> torch.Tensor:
    """Text-like ids: a few very frequent ones (repeats in every block), ids 0 and V-1, the rest spread."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V, (n,), generator=g)
    hot = torch.tensor([0, V - 1, 11, 198, 271])
    pick = torch.rand(n, generator=g) < 0.4
    ids[pick] = hot[torch.randint(0, len(hot), (int(pick.sum()),), generator=g)]
    return ids.to(DEV)


def _call(fn=embedding.embedding):
    return lambda r, p, ctx: fn(r["ids"], p["weight"], ctx)


def test_forward_is_an_exact_gather(weight: torch.Tensor) -> None:
    ids = _ids(BIG.total)
    out = run_layout(_call(), BIG, "padded_left", {}, {"weight": weight}, {"ids": ids}).out
    assert torch.equal(out, weight[ids])


def test_main_grad_equals_portable_algorithm_for_every_layout(weight: torch.Tensor) -> None:
    ids = _ids(BIG.total)
    g = gen(9, (BIG.total, H), 1.0, BF, DEV)
    start = torch.zeros(V, H, device=DEV)
    start[ids] = gen(11, (BIG.total, H), 1.0, torch.float32, DEV)  # main_grad carries an earlier call's sum
    kw = dict(ints={"ids": ids}, upstream=g, main_grad=start)
    port = run_layout(_call(portable.embedding), BIG, "packed", {}, {"weight": weight}, **kw)
    want = port.params["weight"].main_grad
    for name in ("packed", "split_1", "split_half", "permuted", "padded_right"):
        got = run_layout(_call(), BIG, name, {}, {"weight": weight}, **kw)
        assert got.params["weight"].grad is None
        assert_bitwise(f"main_grad {name}", got.params["weight"].main_grad[ids], want[ids])
        assert torch.equal(got.params["weight"].main_grad, want)


def test_declared_ops_and_kernels(weight: torch.Tensor) -> None:
    small = Batch((40, 17, 9), (5, 3, 2))
    call = layout(small, "padded_right")[0]
    ids = _ids(len(call.keys))
    w = weight[:1000].clone().requires_grad_()
    ids = ids % 1000
    g = gen(9, (len(call.keys), H), 1.0, BF, DEV)
    ctx = context(call)
    spec = embedding.OPS["embedding"]
    check_declared(spec, lambda: embedding.embedding(ids, w, ctx).backward(g), {"fwd", "bwd"})
    with torch.no_grad():
        check_declared(spec, lambda: embedding.embedding(ids, w, ctx), {"fwd"})


def test_bad_inputs_raise(weight: torch.Tensor) -> None:
    ctx = context(layout(Batch((3,), (1,)), "packed")[0])
    for ids in ([0, V, 1], [-1, 0, 1]):
        with pytest.raises(KernelInputError, match="outside"):
            embedding.embedding(torch.tensor(ids, device=DEV), weight, ctx)
    with pytest.raises(KernelInputError):
        embedding.embedding(torch.tensor([0, 1, 2]), weight, ctx)  # ids on the CPU, weight on the GPU
