"""The CUDA extension's ops on the GPU (`cuda_bf16`): what only a built extension on a device can show.

The build records its arch list and the runtime reports which code each kernel runs (binary and PTX versions);
the ops are real torch ops (fake implementations: `torch.compile(fullgraph=True)` traces them with no break and
gives eager's bits; a CUDA graph replays them with eager's bits); bad input is one-line `KernelInputError`.
Accuracy and layout invariance are the matrix's judgment (`ws1 matrix --profile cuda_bf16`). In a GPU session
(`WS1_REQUIRE_GPU=1`) a missing extension is an error, never a skip.
"""

from __future__ import annotations

import os

import pytest
import torch

from ws1_kernels import KernelInputError, LayoutContext, cuda

pytestmark = pytest.mark.gpu

if cuda.extension() is None:
    if os.environ.get("WS1_REQUIRE_GPU") == "1":
        raise RuntimeError(f"WS1_REQUIRE_GPU=1: {cuda.missing_reason()}")
    pytest.skip(str(cuda.missing_reason()), allow_module_level=True)

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
