"""Triton attention on CUDA, bf16, Qwen3-8B widths (32 query / 8 kv heads, head_dim 128).

Accuracy against the fp32 reference (contract tolerances), then bit-for-bit invariance across every layout
(packed, alone, two micro-batches, permuted, right/left pad rows, chunked prefill, decode) for the forward and,
for training layouts, dQ/dK/dV; backward identical run to run.  Sample lengths straddle the forward's 32-row
query tiles and 64-key blocks (63, 64, 65, 1029 = 16 * 64 + 5) and include a one-token sample.
"""

from __future__ import annotations

import functools

import pytest
import torch
from kernels_support import Batch, assert_bitwise, layout, logical_index

pytest.importorskip("triton")

from ws1_contract import load_contract  # noqa: E402
from ws1_kernels import KernelInputError, LayoutContext, reference, registry  # noqa: E402
from ws1_kernels.triton_ops import _launch  # noqa: E402
from ws1_kernels.triton_ops import attention as att  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

HQ, HKV, D = 32, 8, 128
SCALE = D**-0.5
BF = torch.bfloat16
DEV = "cuda"
# decode: the last 5-10 tokens of each sample, one row per sample per call, keys below from kv_prefix
BATCH = Batch(lengths=(1, 63, 64, 65, 300, 1029), prompt_lens=(0, 58, 58, 60, 290, 1020))
TRAINING = ("split_1", "split_half", "permuted", "padded_right", "padded_left")
INFERENCE = ("chunked_97", "decode")


def _tol(judgment: str) -> tuple[float, float]:
    spec = load_contract().resolve(judgment, "attention", "bf16")
    return spec.atol, spec.rtol


@functools.cache
def _logical() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n = BATCH.total
    rows = {
        "q": torch.randn((n, HQ, D), generator=g),  # the scale the workload draws at (calibrated thresholds)
        "k": torch.randn((n, HKV, D), generator=g),
        "v": torch.randn((n, HKV, D), generator=g),
        "gout": torch.randn((n, HQ, D), generator=g),
    }
    return {k: t.to(BF).to(DEV) for k, t in rows.items()}


def _run(name: str, backward: bool) -> dict[str, torch.Tensor]:
    """Run the operator once per physical call of layout ``name``; outputs and gradients in logical order."""
    rows = _logical()
    n = BATCH.total
    out = torch.zeros((n, HQ, D), dtype=BF, device=DEV)
    grads = {k: torch.zeros_like(rows[k]) for k in ("q", "k", "v")}
    for ci, call in enumerate(layout(BATCH, name)):
        idx = logical_index(BATCH, call).to(DEV)
        real = idx >= 0
        g = torch.Generator(device=DEV).manual_seed(1000 + ci)
        phys = {}
        for k in ("q", "k", "v"):
            t = rows[k][idx.clamp(min=0)].clone()
            garbage = torch.randn(t.shape, generator=g, device=DEV).to(BF) * 100.0
            phys[k] = torch.where(real[:, None, None], t, garbage).requires_grad_(backward)
        prefix, seen = {}, set()
        for s, p in call.keys:  # a sample's first row in the call: its keys below come from kv_prefix
            if s >= 0 and s not in seen:
                seen.add(s)
                if p > 0:
                    o = BATCH.offsets[s]
                    prefix[s] = (rows["k"][o : o + p], rows["v"][o : o + p])
        sid = torch.tensor([s for s, _ in call.keys], dtype=torch.int64)
        pos = torch.tensor([p for _, p in call.keys], dtype=torch.int64)
        o = att.attention(phys["q"], phys["k"], phys["v"], SCALE, LayoutContext(sid, pos, prefix))
        out[idx[real]] = o.detach()[real]
        if backward:
            o.backward(torch.where(real[:, None, None], rows["gout"][idx.clamp(min=0)], 0.0))
            for k in ("q", "k", "v"):
                grads[k][idx[real]] = phys[k].grad[real]
    return {"out": out, **{f"d{k}": grads[k] for k in grads}} if backward else {"out": out}


@functools.cache
def _packed() -> dict[str, torch.Tensor]:
    return _run("packed", backward=True)


def _assert_close(name: str, got: torch.Tensor, want: torch.Tensor, judgment: str) -> None:
    atol, rtol = _tol(judgment)
    g, w = got.double(), want.double()
    assert torch.isfinite(g).all(), f"{name}: non-finite values"
    bad = (g - w).abs() > atol + rtol * w.abs()
    assert not bad.any(), (
        f"{name}: {int(bad.sum())} elements out of tolerance, max {float((g - w).abs().max())}"
    )


def test_accuracy_against_fp32_reference() -> None:
    rows = _logical()
    leaves = {k: rows[k].to(torch.float32, copy=True).requires_grad_(True) for k in ("q", "k", "v")}
    call = layout(BATCH, "packed")[0]
    ctx = LayoutContext(
        torch.tensor([s for s, _ in call.keys], dtype=torch.int64),
        torch.tensor([p for _, p in call.keys], dtype=torch.int64),
    )
    ref = reference.attention(leaves["q"], leaves["k"], leaves["v"], SCALE, ctx)
    ref.backward(rows["gout"].float())
    got = _packed()
    _assert_close("out", got["out"], ref.detach(), "forward_accuracy")
    for k in ("q", "k", "v"):
        _assert_close(f"d{k}", got[f"d{k}"], leaves[k].grad, "gradient_accuracy")


@pytest.mark.parametrize("name", TRAINING + INFERENCE)
def test_forward_bitwise_across_layouts(name: str) -> None:
    assert_bitwise(f"{name} out", _run(name, backward=False)["out"], _packed()["out"])


@pytest.mark.parametrize("name", TRAINING)
def test_gradients_bitwise_across_layouts(name: str) -> None:
    got = _run(name, backward=True)
    for k in ("dq", "dk", "dv"):
        assert_bitwise(f"{name} {k}", got[k], _packed()[k])


RERUNS = 100  # forward and backward repeated; any scheduling-dependent reduction would show up as a flip


def test_forward_and_backward_identical_run_to_run() -> None:
    first = _packed()
    for i in range(RERUNS):
        again = _run("packed", backward=True)
        for k in ("out", "dq", "dk", "dv"):
            assert_bitwise(f"rerun {i} {k}", again[k], first[k])


# cached keys per sample: whole and partial key blocks, a one-block prefix, none
CACHE_LENS = (1100, 1151, 64, 0)


@pytest.mark.parametrize("aligned", [True, False])
def test_decode_step_on_a_cache_gives_the_prefill_bits(aligned: bool) -> None:
    """A serving-shaped decode step (one new token per sample, kv_prefix = views of one preallocated cache, as
    `ws1 bench --op attention_decode` runs it) gives the bits of the same tokens in one packed prefill.
    ``aligned=False`` moves every prefix to an address that is not a multiple of 16 bytes, which takes the
    unhinted loads."""
    g = torch.Generator().manual_seed(7)
    n, c = len(CACHE_LENS), max(CACHE_LENS) + 1
    kc = torch.randn((n, c, HKV, D), generator=g).to(BF).to(DEV)
    vc = torch.randn((n, c, HKV, D), generator=g).to(BF).to(DEV)
    qs = [torch.randn((length + 1, HQ, D), generator=g).to(BF).to(DEV) for length in CACHE_LENS]
    sid = torch.cat([torch.full((length + 1,), s, dtype=torch.int64) for s, length in enumerate(CACHE_LENS)])
    pos = torch.cat([torch.arange(length + 1) for length in CACHE_LENS])
    packed = att.attention(
        torch.cat(qs), torch.cat([kc[s, : ln + 1] for s, ln in enumerate(CACHE_LENS)]),
        torch.cat([vc[s, : ln + 1] for s, ln in enumerate(CACHE_LENS)]), SCALE, LayoutContext(sid, pos),
    )  # fmt: skip
    last = torch.tensor(CACHE_LENS).cumsum(0) + torch.arange(n)  # each sample's last row in the packed call

    def view(t: torch.Tensor) -> torch.Tensor:
        if aligned:
            return t
        flat = torch.empty(t.numel() + 1, dtype=BF, device=DEV)[1:]  # 2 bytes past an aligned allocation
        return flat.copy_(t.flatten()).view(t.shape)

    prefix = {s: (view(kc[s, :ln]), view(vc[s, :ln])) for s, ln in enumerate(CACHE_LENS) if ln}
    if not aligned:
        assert all(t.data_ptr() % 16 for pair in prefix.values() for t in pair)
    ctx = LayoutContext(torch.arange(n), torch.tensor(CACHE_LENS), prefix)
    ln = torch.tensor(CACHE_LENS, device=DEV)
    step = att.attention(
        torch.stack([q[-1] for q in qs]), kc[torch.arange(n, device=DEV), ln].contiguous(),
        vc[torch.arange(n, device=DEV), ln].contiguous(), SCALE, ctx,
    )  # fmt: skip
    assert_bitwise("decode step", step, packed[last.to(DEV)])


def test_attention_forward_gives_the_operator_bits() -> None:
    rows = _logical()
    cu = [0, *torch.tensor(BATCH.lengths).cumsum(0).tolist()]
    out = att.attention_forward(rows["q"], rows["k"], rows["v"], SCALE, cu)
    assert_bitwise("attention_forward", out, _packed()["out"])


def test_registry_resolves_the_triton_candidate() -> None:
    cand = registry.resolve("triton_cuda_bf16", "attention", "cuda")
    assert cand.fn is att.attention


def test_bad_input_on_cuda() -> None:
    q = torch.zeros((4, HQ, D), dtype=BF, device=DEV)
    k = torch.zeros((4, HKV, D), dtype=BF, device=DEV)
    ctx = LayoutContext(torch.zeros(4, dtype=torch.int64), torch.arange(4))
    with pytest.raises(KernelInputError):
        att.attention(q.float(), k.float(), k.float(), SCALE, ctx)
    with pytest.raises(KernelInputError):
        att.attention(q, k.cpu(), k, SCALE, ctx)
    if not _launch.interpreting():
        with pytest.raises(KernelInputError):
            att.attention(q.cpu(), k.cpu(), k.cpu(), SCALE, ctx)
