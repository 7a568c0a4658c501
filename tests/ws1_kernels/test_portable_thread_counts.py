"""portable_cpu gives the same bits under every intra-op thread count and every storage alignment.

A `ws1 matrix --profile portable_cpu --op silu` run was once red on a loaded 2-core host (15 elements one bf16
ulp off, from the middle of the packed call on). One suspect is the CPU work split: ATen cuts an elementwise op
over threads, and a kernel whose bits depend on where a thread's chunk starts (a vector body and a scalar
tail) would change bits with the thread count. This test runs every portable pointwise and norm operator,
forward and backward, at sizes ATen splits (above its 32768-element grain), under 1, 2, 3, 4 and 7 threads
and at storage offsets of 0 to 3 elements, and asks for identical raw bits. It passes on this host; the
observed red is not explained by it (the issue note says so).
"""

from __future__ import annotations

import pytest
import torch

from ws1_kernels import LayoutContext, registry

THREADS = (1, 2, 3, 4, 7)
OFFSETS = (0, 1, 3)
T, F = 97, 1024  # 99328 elements: ATen splits it over threads, with chunk starts off the vector width


def _shifted(x: torch.Tensor, offset: int) -> torch.Tensor:
    """`x` copied into a buffer at an element offset (another alignment of the same values)."""
    buf = torch.empty(x.numel() + offset, dtype=x.dtype)
    out = buf[offset:].view_as(x)
    out.copy_(x)
    return out


def _inputs(op: str) -> tuple[tuple[torch.Tensor, ...], tuple[object, ...]]:
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(T, F, generator=gen) * 3).to(torch.bfloat16)
    if op == "swiglu":
        return (x, (torch.randn(T, F, generator=gen)).to(torch.bfloat16)), ()
    if op == "rms_norm":
        return (x, (1 + 0.1 * torch.randn(F, generator=gen)).to(torch.bfloat16)), (1e-6,)
    return (x,), ()


def _run(
    op: str, tensors: tuple[torch.Tensor, ...], extra: tuple[object, ...], offset: int
) -> list[torch.Tensor]:
    fn = registry.resolve("portable_cpu", op).fn
    ctx = LayoutContext(torch.zeros(T, dtype=torch.long), torch.arange(T))
    leaves = [_shifted(t, offset).requires_grad_(True) for t in tensors]
    out = fn(*leaves, *extra, ctx)
    gen = torch.Generator().manual_seed(4)
    out.backward(torch.randn(out.shape, generator=gen).to(out.dtype))
    grads = [leaf.grad for leaf in leaves if leaf.grad is not None]
    for leaf in leaves:  # a parameter's gradient may go to main_grad instead
        mg = getattr(leaf, "main_grad", None)
        if mg is not None:
            grads.append(mg)
    return [out.detach(), *grads]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.parametrize("op", ["silu", "swiglu", "rms_norm"])
def test_same_bits_under_every_thread_count_and_alignment(op: str) -> None:
    tensors, extra = _inputs(op)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = [_bits(t) for t in _run(op, tensors, extra, 0)]
        for threads in THREADS:
            torch.set_num_threads(threads)
            for offset in OFFSETS:
                got = [_bits(t) for t in _run(op, tensors, extra, offset)]
                for i, (a, b) in enumerate(zip(want, got, strict=True)):
                    assert torch.equal(a, b), (
                        f"{op} tensor {i}: bits differ at {threads} threads, offset {offset}"
                    )
    finally:
        torch.set_num_threads(before)


def _split_by_threads(x: torch.Tensor) -> torch.Tensor:
    """A row sum cut into one part per intra-op thread, parts added in order: a kernel whose bits follow the
    thread count, by construction (each part is summed by the same tree, so only the cut moves)."""
    parts = torch.tensor_split(x, torch.get_num_threads(), dim=1)
    acc = torch.zeros(x.shape[0], dtype=torch.float32)
    for part in parts:
        acc = acc + part.sum(dim=1)
    return acc


def test_the_check_sees_a_thread_dependent_kernel() -> None:
    """Negative control: the same comparison over thread counts catches a kernel that splits by thread."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, 4099, generator=gen) * 1e3
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = _bits(_split_by_threads(x))
        differs = []
        for threads in THREADS[1:]:
            torch.set_num_threads(threads)
            differs.append(not torch.equal(want, _bits(_split_by_threads(x))))
    finally:
        torch.set_num_threads(before)
    assert any(differs)
