"""The CUDA extension's ops on the GPU (`cuda_bf16`): what only a built extension on a device can show.

The build records its arch list and the runtime reports which code each kernel runs (binary and PTX versions);
the ops are real torch ops (fake implementations: `torch.compile(fullgraph=True)` traces them with no break and
gives eager's bits; a CUDA graph replays them with eager's bits); bad input is one-line `KernelInputError`.
Accuracy and layout invariance are the matrix's judgment (`ws1 matrix --profile cuda_bf16`). In a GPU session
(`WS1_REQUIRE_GPU=1`) a missing extension is an error, never a skip.
"""

from __future__ import annotations

import pytest
import torch
from cuda_only import skip_module_without_extension

from ws1_kernels import KernelInputError, LayoutContext, cuda

pytestmark = [pytest.mark.gpu, pytest.mark.needs_build]

skip_module_without_extension()

from ws1_kernels.cuda import norm, pointwise, rope  # noqa: E402

DEV = "cuda"


def _ctx(lengths: tuple[int, ...]) -> LayoutContext:
    ids = torch.cat([torch.full((n,), s, dtype=torch.int64) for s, n in enumerate(lengths)])
    pos = torch.cat([torch.arange(n, dtype=torch.int64) for n in lengths])
    return LayoutContext(ids, pos)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def test_the_build_records_its_archs_and_the_code_that_runs() -> None:
    targets = cuda.built_targets()
    assert targets, "the extension records no arch list"
    rows = cuda.kernel_attributes()
    names = {r["name"] for r in rows}
    assert {
        "ws1_silu_fwd",
        "ws1_norm_fwd",
        "ws1_norm_bwd_blocks",
        "ws1_rope_rotate",
        "ws1_embedding_gather",
        "ws1_logp_fwd",
        "ws1_gemm_fixed_k",
        "ws1_gemm_wgrad_blocks",
    } <= names
    for r in rows:
        assert r["error"] == "", r
        assert int(r["ptx_version"]) > 0 and int(r["binary_version"]) > 0, r
    major, minor = torch.cuda.get_device_capability()
    assert cuda.runs_on((major, minor), targets)


def test_compiled_forward_traces_with_no_break_and_gives_eager_bits() -> None:
    torch.manual_seed(0)
    ctx = _ctx((5, 11))
    x = torch.randn(16, 256, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(256, device=DEV, dtype=torch.bfloat16)
    q = torch.randn(16, 4, 64, device=DEV, dtype=torch.bfloat16)
    positions = ctx.on(DEV)[1]

    def f(
        x: torch.Tensor, w: torch.Tensor, q: torch.Tensor, p: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.ops.ws1.norm_fwd(x, w, 1e-6)
        return torch.ops.ws1.swiglu_fwd(h, h), torch.ops.ws1.rope(q, p, 1e6, False)

    eager = f(x, w, q, positions)
    compiled = torch.compile(f, fullgraph=True)(x, w, q, positions)
    for a, b in zip(eager, compiled, strict=True):
        assert torch.equal(_bits(a), _bits(b))


def test_a_cuda_graph_replays_the_eager_bits() -> None:
    torch.manual_seed(1)
    ctx = _ctx((7, 9))
    x = torch.randn(16, 512, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(512, device=DEV, dtype=torch.bfloat16)
    eager = pointwise.silu(norm.rms_norm(x, w, 1e-6, ctx), ctx)
    static_x = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        pointwise.silu(norm.rms_norm(static_x, w, 1e-6, ctx), ctx)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = pointwise.silu(norm.rms_norm(static_x, w, 1e-6, ctx), ctx)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(_bits(out), _bits(eager))
    # negative control: new input copied in changes the replayed output
    static_x.copy_(x * 2)
    graph.replay()
    torch.cuda.synchronize()
    assert not torch.equal(_bits(out), _bits(eager))


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda c: pointwise.silu(torch.randn(4, 8, device=DEV), c), "bfloat16"),
        (lambda c: pointwise.silu(torch.randn(4, 8, dtype=torch.bfloat16), c), "CUDA"),
        (lambda c: pointwise.silu(torch.randn(8, 4, device=DEV, dtype=torch.bfloat16).t(), c), "contiguous"),
        (lambda c: rope.rope(torch.randn(4, 2, 7, device=DEV, dtype=torch.bfloat16), 1e6, c), "even"),
        (lambda c: pointwise.silu(torch.randn(5, 8, device=DEV, dtype=torch.bfloat16), c), "rows"),
    ],
    ids=["dtype", "device", "strides", "odd-head-dim", "rows"],
)
def test_bad_input_is_one_line(call, needle: str) -> None:
    with pytest.raises(KernelInputError) as info:
        call(_ctx((4,)))
    assert "\n" not in str(info.value) and needle in str(info.value), str(info.value)


def _gemm_ref(
    a: torch.Tensor, b: torch.Tensor, b_trans: bool, a_lo: torch.Tensor | None = None
) -> torch.Tensor:
    af = a.double() + (a_lo.double() if a_lo is not None else 0.0)
    return af @ (b.double().t() if b_trans else b.double())


def _close_to(out: torch.Tensor, ref: torch.Tensor) -> bool:
    scale = ref.abs().max().clamp(min=1.0)
    return bool(((out.double() - ref).abs() <= 2e-2 * scale).all())


@pytest.mark.parametrize("r", [4096, 72, 40, 23])
@pytest.mark.parametrize("b_trans", [True, False])
def test_gemm_rows_get_the_same_bits_in_either_tile_and_are_right(r: int, b_trans: bool) -> None:
    """The GEMM picks a 32 x 64 tile at M <= 64 and 128 x 128 above: a row must come out with the same bits either
    way (its chain of MMAs depends only on R), at reduced lengths with a ragged last step (40, 23: no vector loads)
    and columns that end mid-tile (200). The same rows must also be right, or a consistent indexing bug would pass."""
    g = torch.Generator(device=DEV).manual_seed(r)
    n = 200
    a = torch.randn(150, r, device=DEV, dtype=torch.bfloat16, generator=g)
    b = torch.randn(*((n, r) if b_trans else (r, n)), device=DEV, dtype=torch.bfloat16, generator=g)
    full = torch.ops.ws1.gemm(a, b, b_trans)
    assert _close_to(full, _gemm_ref(a, b, b_trans))
    for lo, hi in ((0, 1), (5, 9), (86, 150)):
        part = torch.ops.ws1.gemm(a[lo:hi].contiguous(), b, b_trans)
        assert torch.equal(_bits(part), _bits(full[lo:hi])), (lo, hi)
    f32 = torch.ops.ws1.gemm_f32_out(a, b.t().contiguous() if not b_trans else b)
    assert _close_to(f32, _gemm_ref(a, b, b_trans)) and f32.dtype == torch.float32


def test_gemm_with_a_low_half_adds_it() -> None:
    g = torch.Generator(device=DEV).manual_seed(3)
    a = torch.randn(70, 96, device=DEV, dtype=torch.bfloat16, generator=g)
    a_lo = (torch.randn(70, 96, device=DEV, generator=g) * 1e-3).to(torch.bfloat16)
    b = torch.randn(130, 96, device=DEV, dtype=torch.bfloat16, generator=g)
    out = torch.ops.ws1.gemm(a, b, True, a_lo)
    assert _close_to(out, _gemm_ref(a, b, True, a_lo))
    part = torch.ops.ws1.gemm(a[:3].contiguous(), b, True, a_lo[:3].contiguous())
    assert torch.equal(_bits(part), _bits(out[:3]))


def test_the_gemm_check_sees_a_wrong_product() -> None:
    """Negative control of the two tests above: the reference with B used untransposed is refused."""
    g = torch.Generator(device=DEV).manual_seed(5)
    a = torch.randn(100, 128, device=DEV, dtype=torch.bfloat16, generator=g)
    b = torch.randn(128, 128, device=DEV, dtype=torch.bfloat16, generator=g)
    assert not _close_to(torch.ops.ws1.gemm(a, b, True), _gemm_ref(a, b, False))


@pytest.mark.parametrize(("n", "k"), [(200, 72), (136, 23), (4096, 4096)])
def test_gemm_wgrad_adds_the_blocks_into_main_grad(n: int, k: int) -> None:
    """main_grad += dY^T X over the table's blocks (empty slots -1 add nothing), at edges that end mid-tile and a
    row length (23) that rules out vector loads; the starting main_grad is kept, not overwritten."""
    g = torch.Generator(device=DEV).manual_seed(n + k)
    t = 40
    dy = torch.randn(t, n, device=DEV, dtype=torch.bfloat16, generator=g)
    x = torch.randn(t, k, device=DEV, dtype=torch.bfloat16, generator=g)
    rows = list(range(16)) + list(range(16, 40)) + [-1] * 8  # three blocks, the last half empty
    table = torch.tensor(rows, dtype=torch.int32, device=DEV).reshape(3, 16)
    start = torch.randn(n, k, device=DEV, generator=g)
    mg = start.clone()
    torch.ops.ws1.gemm_wgrad(dy, x, table, 3, mg)
    ref = start.double() + dy.double().t() @ x.double()

    def close(got: torch.Tensor) -> bool:
        return bool(((got.double() - ref).abs() <= 1e-3 * ref.abs().max()).all())

    assert close(mg)
    # negative control: the same check refuses main_grad overwritten instead of accumulated
    assert not close(dy.double().t() @ x.double())
