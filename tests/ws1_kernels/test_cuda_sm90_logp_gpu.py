"""The Hopper logp (`torch.ops.ws1_sm90.logp_fwd` / `logp_bwd`, csrc/sm90/logp_sm90.cu) and linear_logp's fused
forward (`ws1_sm90.linear_logp_fwd`, csrc/sm90/linear_logp_sm90.cu) on an sm_90 device.

What only the chip can show: the one-pass forward and the elementwise backward are right against a float64
reference (the negative control: a wrong target is seen); a row's bits do not depend on the other rows of the call,
on the row's address (16-byte loads and scalar loads give the same bits), or on the run; a CUDA graph replays them.
Accuracy and layout invariance of the whole operator are the matrix's judgment (`ws1 matrix --profile
cuda_bf16_sm90`); speed is `ws1 bench --op logp`'s.
"""

from __future__ import annotations

import pytest
import torch
from cuda_only import skip_module_without_hopper

from ws1_kernels import cuda_sm90
from ws1_kernels.cuda_sm90.logprob import FUSED_BUCKETS

pytestmark = [pytest.mark.gpu, pytest.mark.needs_build, pytest.mark.sm90]

skip_module_without_hopper()

DEV = "cuda"
V_FULL = 151936


def _logits(t: int, v: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(t, v, generator=gen, device=DEV) * 4
    x[0, : v // 3] = -float("inf")  # a masked stretch: neither the max nor the sum may see it
    if t > 1:
        x[1] *= 40  # a large-magnitude row
    return x.to(torch.bfloat16)


def _targets(t: int, v: int) -> torch.Tensor:
    tg = torch.arange(t, device=DEV, dtype=torch.int64) * 7919 % v
    tg[0] = v - 1  # past the masked stretch
    return tg


def _reference(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lsm = torch.log_softmax(logits.double(), dim=-1)
    return lsm.gather(1, targets[:, None])[:, 0], lsm


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def _misaligned_copy(x: torch.Tensor) -> torch.Tensor:
    """The same values, contiguous, starting 2 bytes past a 16-byte boundary."""
    buf = torch.empty(x.numel() + 8, dtype=x.dtype, device=x.device)
    out = buf[1 : 1 + x.numel()].view(x.shape)
    out.copy_(x)
    return out


@pytest.mark.parametrize("v", [V_FULL, 1000, 1001])
def test_the_forward_is_right(v: int) -> None:
    logits, targets = _logits(5, v), _targets(5, v)
    out, lse = torch.ops.ws1_sm90.logp_fwd(logits, targets)
    want, lsm = _reference(logits, targets)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, atol=5e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), (logits.double() - lsm)[:, -1], atol=5e-5, rtol=1e-5)


def test_the_check_sees_a_wrong_target() -> None:
    logits, targets = _logits(5, V_FULL), _targets(5, V_FULL)
    out, _ = torch.ops.ws1_sm90.logp_fwd(logits, (targets + 1) % V_FULL)
    want, _ = _reference(logits, targets)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(out.double(), want, atol=5e-5, rtol=1e-5)


@pytest.mark.parametrize("v", [V_FULL, 1001])
def test_the_backward_is_right(v: int) -> None:
    logits, targets = _logits(4, v), _targets(4, v)
    g = torch.tensor([1.0, -0.5, 0.25, 2.0], device=DEV)
    _, lse = torch.ops.ws1_sm90.logp_fwd(logits, targets)
    d = torch.ops.ws1_sm90.logp_bwd(logits, targets, lse, g)
    _, lsm = _reference(logits, targets)
    onehot = torch.nn.functional.one_hot(targets, v).double()
    want = g.double()[:, None] * (onehot - lsm.exp())
    assert d.dtype == torch.bfloat16 and d.shape == logits.shape
    torch.testing.assert_close(d.double(), want, atol=1e-6, rtol=2.0**-7)


def test_a_row_has_the_same_bits_alone_and_in_a_batch() -> None:
    logits, targets = _logits(9, V_FULL), _targets(9, V_FULL)
    out, lse = torch.ops.ws1_sm90.logp_fwd(logits, targets)
    for r in (0, 1, 8):
        o1, l1 = torch.ops.ws1_sm90.logp_fwd(logits[r : r + 1].clone(), targets[r : r + 1].clone())
        assert torch.equal(_bits(o1), _bits(out[r : r + 1])) and torch.equal(_bits(l1), _bits(lse[r : r + 1]))


@pytest.mark.parametrize("v", [V_FULL, 1000])
def test_16_byte_and_scalar_loads_give_the_same_bits(v: int) -> None:
    ext = cuda_sm90.extension()
    assert ext is not None
    logits, targets = _logits(6, v), _targets(6, v)
    skew = _misaligned_copy(logits)
    # the control: the two calls really take the two paths, so the equality below has teeth
    assert ext.logp_vector_path(logits) and not ext.logp_vector_path(skew)
    g = torch.linspace(-1, 1, 6, device=DEV)
    o_a, l_a = torch.ops.ws1_sm90.logp_fwd(logits, targets)
    o_s, l_s = torch.ops.ws1_sm90.logp_fwd(skew, targets)
    assert torch.equal(_bits(o_a), _bits(o_s)) and torch.equal(_bits(l_a), _bits(l_s))
    d_a = torch.ops.ws1_sm90.logp_bwd(logits, targets, l_a, g)
    d_s = torch.ops.ws1_sm90.logp_bwd(skew, targets, l_s, g)
    assert torch.equal(_bits(d_a), _bits(d_s))


def test_the_bits_repeat_over_100_runs() -> None:
    logits, targets = _logits(64, V_FULL), _targets(64, V_FULL)
    first, _ = torch.ops.ws1_sm90.logp_fwd(logits, targets)
    for _ in range(100):
        again, _ = torch.ops.ws1_sm90.logp_fwd(logits, targets)
        assert torch.equal(_bits(again), _bits(first))


def test_a_cuda_graph_replays_the_eager_bits() -> None:
    logits, targets = _logits(8, V_FULL), _targets(8, V_FULL)
    eager, _ = torch.ops.ws1_sm90.logp_fwd(logits, targets)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.ops.ws1_sm90.logp_fwd(logits, targets)  # warm-up off the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured, _ = torch.ops.ws1_sm90.logp_fwd(logits, targets)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(_bits(captured), _bits(eager))


def test_the_candidate_records_the_hopper_kernel_and_its_gradient_flows() -> None:
    from ws1_kernels import LayoutContext, launches
    from ws1_kernels.cuda_sm90 import logprob

    logits = _logits(3, 1000).requires_grad_(True)
    targets = _targets(3, 1000)
    ctx = LayoutContext(torch.zeros(3, dtype=torch.int64), torch.arange(3))
    with launches.observe() as seen:
        out = logprob.logp(logits, targets, ctx)
        out.sum().backward()
    assert seen.kernel_ids() == {logprob.KERNEL}
    assert logits.grad is not None and torch.isfinite(logits.grad[1:]).all()


# ---------------------------------------------------------------------------------------- linear_logp's forward


def _ab(m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=DEV).manual_seed(m + n + k)
    a = torch.randn(m, k, generator=gen, device=DEV).to(torch.bfloat16)
    b = (torch.randn(n, k, generator=gen, device=DEV) / 16).to(torch.bfloat16)
    return a, b


@pytest.mark.parametrize("b_trans", [True, False], ids=["logits", "dx"])
@pytest.mark.parametrize("m", [1, 63, 100, 1100])
def test_the_fp32_gemm_rounds_to_the_bf16_gemms_bits(m: int, b_trans: bool) -> None:
    """One mainloop, two epilogues: the fp32 output rounded to bf16 is the bf16 GEMM's output, bit for bit, in
    every M bucket of the bf16 GEMM (the fp32 one has one tile for all M), for the logits (b [N, K]) and for dx
    (b [K, N])."""
    a, b = _ab(m, 1024, 512)
    if not b_trans:
        b = b.T.contiguous()  # [K, N]
    c32 = torch.ops.ws1_sm90.gemm_f32(a, b, b_trans)
    assert c32.dtype == torch.float32 and c32.shape == (m, 1024)
    assert torch.equal(_bits(c32.to(torch.bfloat16)), _bits(torch.ops.ws1_sm90.gemm(a, b, b_trans)))
    want = a.double() @ (b.double().T if b_trans else b.double())
    torch.testing.assert_close(c32.double(), want, atol=1e-3, rtol=1e-5)


def test_the_bf16_check_sees_a_perturbed_product() -> None:
    a, b = _ab(100, 1024, 512)
    c32 = torch.ops.ws1_sm90.gemm_f32(a, b, True)
    c32[7, 9] += abs(float(c32[7, 9])) * 2**-6 + 1e-3  # a change that survives the rounding to bf16
    assert not torch.equal(_bits(c32.to(torch.bfloat16)), _bits(torch.ops.ws1_sm90.gemm(a, b, True)))


def test_a_row_of_the_fp32_gemm_has_the_same_bits_in_any_call() -> None:
    a, b = _ab(1100, 512, 256)
    whole = torch.ops.ws1_sm90.gemm_f32(a, b, True)
    for lo, hi in ((0, 1), (5, 68), (1000, 1100), (0, 64)):
        part = torch.ops.ws1_sm90.gemm_f32(a[lo:hi].contiguous(), b, True)
        assert torch.equal(_bits(part), _bits(whole[lo:hi]))


def _xwt(t: int, v: int, h: int = 512, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=DEV).manual_seed(seed + t + v)
    x = torch.randn(t, h, generator=gen, device=DEV).to(torch.bfloat16)
    w = (torch.randn(v, h, generator=gen, device=DEV) / 4).to(torch.bfloat16)
    if t > 1:
        x[1] *= 16  # a large-magnitude row
    return x, w, _targets(t, v)


# V_FULL: 1187 full vocab blocks; 1000 and 136: a partial last block (its columns past V must weigh nothing); 120:
# one block, so the large tile's (256 wide) second block lies wholly past V. t: 1 and 5 take the small tile, 130 the
# mid one, 1100 the large one (FUSED_BUCKETS).
@pytest.mark.parametrize("v", [V_FULL, 1000, 136, 120])
@pytest.mark.parametrize("t", [1, 5, 130, 1100])
def test_the_fused_forward_is_right(t: int, v: int) -> None:
    x, w, targets = _xwt(t, v)
    out, lse = torch.ops.ws1_sm90.linear_logp_fwd(x, w, targets)
    want, lsm = _reference(x.double() @ w.double().T, targets)
    torch.testing.assert_close(out.double(), want, atol=1e-4, rtol=1e-5)
    logits = x.double() @ w.double().T
    torch.testing.assert_close(lse.double(), torch.logsumexp(logits, -1), atol=1e-4, rtol=1e-5)
    # the negative control: the next column's logprob is another number, which the check above must not accept
    other = lsm.gather(1, ((targets + 1) % v)[:, None])[:, 0]
    assert ((out.double() - other).abs() > 1e-3).any()


@pytest.mark.parametrize("t", [5, 130, 1100])
def test_the_fused_target_logit_is_the_fp32_gemms_accumulator(t: int) -> None:
    """The epilogue sees the accumulators that gemm_f32 stores (the backward recomputes its logits with it): the
    target's logit minus lse, in fp32, is the fused output bit for bit. gemm_f32 has the mid tile for every M; the
    fused forward runs the small tile at t = 5, the mid one at 130 and the large one at 1100, so this also shows
    that every tile's accumulators agree."""
    assert [cuda_sm90.linear_logp_bucket(n) for n in (5, 130, 1100)] == [0, 1, 2]
    x, w, targets = _xwt(t, 1000)
    out, lse = torch.ops.ws1_sm90.linear_logp_fwd(x, w, targets)
    logits = torch.ops.ws1_sm90.gemm_f32(x, w, True)
    assert torch.equal(_bits(out), _bits(logits.gather(1, targets[:, None])[:, 0] - lse))
    # the control: another column's logit gives other bits
    assert not torch.equal(_bits(out), _bits(logits.gather(1, ((targets + 1) % 1000)[:, None])[:, 0] - lse))


def test_a_row_of_the_fused_forward_has_the_same_bits_in_any_call_and_run() -> None:
    x, w, targets = _xwt(300, V_FULL)
    out, lse = torch.ops.ws1_sm90.linear_logp_fwd(x, w, targets)
    for lo, hi in ((0, 1), (5, 68), (128, 300), (299, 300), (0, 300)):
        o, ls = torch.ops.ws1_sm90.linear_logp_fwd(x[lo:hi].contiguous(), w, targets[lo:hi].contiguous())
        assert torch.equal(_bits(o), _bits(out[lo:hi])) and torch.equal(_bits(ls), _bits(lse[lo:hi]))
    for _ in range(20):
        o, ls = torch.ops.ws1_sm90.linear_logp_fwd(x, w, targets)
        assert torch.equal(_bits(o), _bits(out)) and torch.equal(_bits(ls), _bits(lse))


def test_a_row_has_the_same_fused_bits_on_both_sides_of_each_tile_boundary() -> None:
    """The fused forward's own table (M <= 64 the 64 x 128 tile, M <= 256 the 128 x 128 one, above that the
    128 x 256 one): the rows of an 1100-row call have the bits of the same rows in calls of every bucket, each
    boundary from both sides. The control: another vocabulary block order (the columns rolled by 128) gives other
    bits for the rows' lse."""
    small, mid = FUSED_BUCKETS
    for m, bucket in ((small, 0), (small + 1, 1), (mid, 1), (mid + 1, 2)):
        assert cuda_sm90.linear_logp_bucket(m) == bucket, (m, bucket)
    x, w, targets = _xwt(1100, V_FULL)
    out, lse = torch.ops.ws1_sm90.linear_logp_fwd(x, w, targets)
    spans = [
        (1000, 1001),
        (1023, 1025),
        (40, 40 + small),
        (40, 41 + small),
        (100, 100 + mid),
        (100, 101 + mid),
    ]
    for lo, hi in (*spans, (0, 1024), (76, 1100)):
        o, ls = torch.ops.ws1_sm90.linear_logp_fwd(x[lo:hi].contiguous(), w, targets[lo:hi].contiguous())
        assert torch.equal(_bits(o), _bits(out[lo:hi])) and torch.equal(_bits(ls), _bits(lse[lo:hi])), (
            lo,
            hi,
        )
    rolled = torch.roll(w, 128, 0).contiguous()
    _, ls = torch.ops.ws1_sm90.linear_logp_fwd(x, rolled, (targets + 128) % V_FULL)
    assert not torch.equal(_bits(ls), _bits(lse))


def test_the_fused_forward_never_writes_the_logits() -> None:
    """Peak memory of the fused forward stays far below the [T, V] fp32 logits; the control: the unfused GEMM's
    output alone reaches them."""
    t, v = 1024, V_FULL
    x, w, targets = _xwt(t, v, h=256)
    logits_bytes = t * v * 4
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.ops.ws1_sm90.linear_logp_fwd(x, w, targets)
    torch.cuda.synchronize()
    fused_peak = torch.cuda.max_memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    torch.ops.ws1_sm90.gemm_f32(x, w, True)
    torch.cuda.synchronize()
    unfused_peak = torch.cuda.max_memory_allocated() - base
    assert fused_peak < logits_bytes / 16, (fused_peak, logits_bytes)
    assert unfused_peak >= logits_bytes


def test_a_cuda_graph_replays_the_fused_bits() -> None:
    x, w, targets = _xwt(64, 1000)
    want, want_lse = torch.ops.ws1_sm90.linear_logp_fwd(x, w, targets)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.ops.ws1_sm90.linear_logp_fwd(x, w, targets)  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = torch.ops.ws1_sm90.linear_logp_fwd(x, w, targets)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(_bits(out), _bits(want)) and torch.equal(_bits(lse), _bits(want_lse))


def test_the_linear_logp_candidate_agrees_with_the_generic_one_and_records_both_ids() -> None:
    from ws1_kernels import LayoutContext, launches
    from ws1_kernels.cuda import logprob as generic
    from ws1_kernels.cuda_sm90 import logprob

    t, h, v = 40, 256, 1000
    gen = torch.Generator(device=DEV).manual_seed(3)
    x = torch.randn(t, h, generator=gen, device=DEV).to(torch.bfloat16)
    targets = torch.randint(0, v, (t,), generator=gen, device=DEV)
    ctx = LayoutContext(torch.zeros(t, dtype=torch.int64), torch.arange(t))
    outs, grads = [], []
    for fn in (logprob.linear_logp, generic.linear_logp):
        w = (torch.randn(v, h, generator=torch.Generator(device=DEV).manual_seed(4), device=DEV) / 16).to(
            torch.bfloat16
        )
        w.main_grad = torch.zeros(v, h, device=DEV)  # type: ignore[attr-defined]
        w.requires_grad_(True)
        xi = x.clone().requires_grad_(True)
        with launches.observe() as seen:
            out = fn(xi, w, targets, ctx)
            out.sum().backward()
        outs.append(out)
        grads.append((xi.grad, w.main_grad))  # type: ignore[attr-defined]
        if fn is logprob.linear_logp:
            assert seen.kernel_ids() == {logprob.LINEAR_KERNEL, generic.LINEAR_KERNEL}
    torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(grads[0][0].float(), grads[1][0].float(), atol=1e-2, rtol=2.0**-7)
    torch.testing.assert_close(grads[0][1], grads[1][1], atol=1e-4, rtol=1e-4)
