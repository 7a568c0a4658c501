"""Which backward the CUDA attention runs (`cuda/attention.py`, no GPU needed): the row-block forward's own backward
where the forward ran on tiles (the Hopper profile passes its pair), the generic `ws1.attn_bwd` where the forward
names none; the kernel id recorded is the one that ran. Fake ops stand in for the kernels, so the property is the
dispatch alone.
"""

from __future__ import annotations

import pytest
import torch

from ws1_kernels import LayoutContext
from ws1_kernels.cuda import attention as generic
from ws1_kernels.launches import observe

T, HQ, HKV, D = 5, 4, 2, 8


def _fake_forward(backward: generic.TiledBackward | None) -> generic.TiledForward:
    def call(q, k, v, key_base, n_keys, blocks, scale):  # type: ignore[no-untyped-def]
        assert blocks is not None  # the row blocks were built for a tiled forward
        return q.clone(), torch.zeros(q.shape[0], q.shape[1])

    return generic.TiledForward("fake.fwd", 4, lambda hq, hkv, d: True, call, backward)


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, LayoutContext]:
    q = torch.randn(T, HQ, D, requires_grad=True)
    k = torch.randn(T, HKV, D, requires_grad=True)
    v = torch.randn(T, HKV, D, requires_grad=True)
    return q, k, v, LayoutContext(torch.tensor([0, 0, 0, 1, 1]), torch.tensor([0, 1, 2, 0, 1]))


def test_the_forwards_own_backward_runs_and_is_recorded() -> None:
    seen: list[LayoutContext] = []

    def bwd(q, k, v, o, dout, lse, scale, layout):  # type: ignore[no-untyped-def]
        seen.append(layout)
        return torch.full_like(q, 1.0), torch.full_like(k, 2.0), torch.full_like(v, 3.0)

    q, k, v, ctx = _inputs()
    with observe() as log:
        generic._Attention.apply(
            q, k, v, 0.5, ctx, _fake_forward(generic.TiledBackward("fake.bwd", bwd))
        ).sum().backward()
    assert log.events == [("fake.fwd", "fwd"), ("fake.bwd", "bwd")]
    assert seen == [ctx]  # the call's own layout reaches the backward
    assert bool((q.grad == 1).all() and (k.grad == 2).all() and (v.grad == 3).all())


def test_the_control_a_forward_without_one_takes_the_generic_backward() -> None:
    q, k, v, ctx = _inputs()
    with observe() as log:
        o = generic._Attention.apply(q, k, v, 0.5, ctx, _fake_forward(None))
        # the generic op is the extension's; on this host it is absent, so the call fails after the record
        with pytest.raises((AttributeError, RuntimeError)):
            o.sum().backward()
    assert log.events == [("fake.fwd", "fwd"), (generic.KERNEL, "bwd")]
    assert q.grad is None
