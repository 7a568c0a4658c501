"""The Hopper GEMM (`cuda_bf16_sm90`, `torch.ops.ws1_sm90.gemm`) on an sm_90 device.

What only the built extension on the chip can show: its kernels are sm_90a machine code with wgmma (HGMMA) in the
SASS; a row's bits are the same in every M bucket (the tile follows M, each element's accumulator chain does
not), right against a float64 product, and the same from run to run; a CUDA graph and torch.compile replay the
eager bits. Accuracy and layout invariance of whole operators are the matrix's judgment (`ws1 matrix --profile
cuda_bf16_sm90`). In a GPU session (`WS1_REQUIRE_GPU=1`) a missing extension or disassembler is an error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ws1_kernels import cuda, cuda_sm90
from ws1_kernels.cuda_sm90 import linear as sm90

pytestmark = [pytest.mark.gpu, pytest.mark.needs_build, pytest.mark.sm90]
REQUIRED = os.environ.get("WS1_REQUIRE_GPU") == "1"

if cuda_sm90.missing_reason() is not None or not torch.cuda.is_available():
    why = cuda_sm90.missing_reason() or "no CUDA device"
    if REQUIRED and "9.0a" in cuda.built_targets():  # a 9.0a build (gpu_sm90) must hold the Hopper module
        raise RuntimeError(f"WS1_REQUIRE_GPU=1 with a 9.0a build: {why}")
    pytest.skip(str(why), allow_module_level=True)
if torch.cuda.get_device_capability() != cuda_sm90.CAPABILITY:
    pytest.skip("the Hopper kernels run on capability 9.0 only", allow_module_level=True)

DEV = "cuda"


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def _sass(module_file: str) -> str:
    tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if not Path(tool).is_file():
        if REQUIRED:
            raise RuntimeError("WS1_REQUIRE_GPU=1: cuobjdump is missing, the SASS cannot be read")
        pytest.skip("cuobjdump is missing")
    return subprocess.run(
        [tool, "--dump-sass", module_file], capture_output=True, text=True, timeout=600
    ).stdout


def test_the_kernels_are_sm90a_machine_code() -> None:
    rows = cuda_sm90.kernel_attributes()
    names = [str(r["name"]) for r in rows]
    logp = [n for n in names if n.startswith("ws1_sm90_logp_")]
    linear_logp = [n for n in names if "linear_logp" in n or "lse_finalize" in n]
    f32out = [n for n in names if "f32out" in n]
    wgrad = [n for n in names if "wgrad" in n]
    attn_fwd = [n for n in names if n.startswith("ws1_sm90_attn_fwd_")]
    attn_bwd = [n for n in names if n.startswith("ws1_sm90_attn_bwd_")]
    # logp: forward and backward, 16-byte and scalar loads each; linear_logp: the GEMM with the log-sum-exp
    # epilogue on each bucket's tile, and the fold of its partials; the fp32-output GEMM (the backward's logits and
    # dx); the weight gradient (its gather and its wgmma kernel with one and two warpgroups, each with 64- and 32-row
    # stages); the attention forward (64- and 128-row CTAs on the plain and both overlapped loops, Q in registers at
    # 64, ping-pong at 128, and the wide schedules: 64 and 128 rows, ping-pong at 128) and backward (dQ, dV, dK, and
    # dK with dV in one walk); the bf16 GEMM: forward and dx in each of three buckets and on the mid bucket's wide tile
    counts = tuple(len(x) for x in (logp, linear_logp, f32out, wgrad, attn_fwd, attn_bwd))
    assert counts == (4, 4, 2, 5, 11, 4), names
    assert len(names) - sum(counts) == 8, names
    for r in rows:
        assert r["error"] == "" and int(r["binary_version"]) == 90, r


def test_the_sass_holds_wgmma_and_the_generic_build_does_not() -> None:
    ext, generic = cuda_sm90.extension(), cuda.extension()
    assert ext is not None and generic is not None
    assert _sass(ext.__file__).count("HGMMA") > 0
    # the control: the generic build's tensor-core GEMM is mma.sync (HMMA), so the count has teeth
    assert _sass(generic.__file__).count("HGMMA") == 0


@pytest.mark.parametrize("m", [1, 64, 65, 1024, 1025])
def test_the_bucket_boundaries_are_the_extensions(m: int) -> None:
    expected = 0 if m <= sm90.BUCKETS[0] else (1 if m <= sm90.BUCKETS[1] else 2)
    assert cuda_sm90.gemm_bucket(m) == expected


def _ref(a: torch.Tensor, b: torch.Tensor, b_trans: bool) -> torch.Tensor:
    return a.double() @ (b.double().t() if b_trans else b.double())


def _close_to(out: torch.Tensor, ref: torch.Tensor) -> bool:
    """Within a few bf16 roundings of the float64 product, scaled by the row's dot magnitude."""
    return bool(((out.double() - ref).abs() <= 2e-2 * ref.abs().max().clamp(min=1.0)).all())


@pytest.mark.parametrize("b_trans", [True, False], ids=["forward", "dx"])
def test_rows_get_the_same_bits_in_every_bucket_and_are_right(b_trans: bool) -> None:
    g = torch.Generator(device=DEV).manual_seed(90)
    r, n = 4096, 1536
    a = torch.randn(1100, r, device=DEV, dtype=torch.bfloat16, generator=g)
    b = torch.randn(*((n, r) if b_trans else (r, n)), device=DEV, dtype=torch.bfloat16, generator=g)
    full = torch.ops.ws1_sm90.gemm(a, b, b_trans)  # the large bucket
    assert _close_to(full, _ref(a, b, b_trans))
    for rows in (1, 63, 64, 65, 1024, 1025):  # small, small, small, mid, mid, large
        part = torch.ops.ws1_sm90.gemm(a[:rows].contiguous(), b, b_trans)
        assert torch.equal(_bits(part), _bits(full[:rows])), rows


def test_the_check_sees_a_wrong_product() -> None:
    """Negative control of the accuracy check above: b used untransposed is refused."""
    g = torch.Generator(device=DEV).manual_seed(5)
    a = torch.randn(100, 256, device=DEV, dtype=torch.bfloat16, generator=g)
    b = torch.randn(256, 256, device=DEV, dtype=torch.bfloat16, generator=g)
    assert not _close_to(torch.ops.ws1_sm90.gemm(a, b, True), _ref(a, b, False))


def test_the_bits_repeat_over_100_runs() -> None:
    g = torch.Generator(device=DEV).manual_seed(7)
    a = torch.randn(512, 4096, device=DEV, dtype=torch.bfloat16, generator=g)
    b = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16, generator=g)
    first = _bits(torch.ops.ws1_sm90.gemm(a, b, True)).clone()
    for _ in range(100):
        assert torch.equal(_bits(torch.ops.ws1_sm90.gemm(a, b, True)), first)
    # the control: another input gives other bits, so equality is not vacuous
    assert not torch.equal(_bits(torch.ops.ws1_sm90.gemm(a * 2 + 1, b, True)), first)


def test_a_cuda_graph_and_torch_compile_give_the_eager_bits() -> None:
    g = torch.Generator(device=DEV).manual_seed(11)
    a = torch.randn(8, 4096, device=DEV, dtype=torch.bfloat16, generator=g)
    b = torch.randn(6144, 4096, device=DEV, dtype=torch.bfloat16, generator=g)
    eager = torch.ops.ws1_sm90.gemm(a, b, True)
    compiled = torch.compile(lambda x, w: torch.ops.ws1_sm90.gemm(x, w, True), fullgraph=True)(a, b)
    assert torch.equal(_bits(compiled), _bits(eager))
    static_a = a.clone()
    torch.ops.ws1_sm90.gemm(static_a, b, True)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.ws1_sm90.gemm(static_a, b, True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(_bits(out), _bits(eager))
    static_a.copy_(a * 2)  # the control: new input, new bits
    graph.replay()
    torch.cuda.synchronize()
    assert not torch.equal(_bits(out), _bits(eager))


def _child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a child Python with this environment: a crash there fails one test, not the whole run."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ.copy(),
    )


# each Hopper op on an x that starts `shift` bf16 elements into its allocation (torch's allocations start on a
# 512-byte boundary): one line per op, "accepted" or "refused: <the error's first line>"
_OFFSET_START = """
import sys, torch, ws1_kernels.cuda_sm90
shift = int(sys.argv[1])
buf = torch.randn(4 * 4096 + 64, device="cuda").to(torch.bfloat16)
x = buf[shift : shift + 4 * 4096].view(4, 4096)
w = torch.randn(256, 4096, device="cuda").to(torch.bfloat16)
t = torch.zeros(4, dtype=torch.int64, device="cuda")
calls = {
    "gemm": lambda: torch.ops.ws1_sm90.gemm(x, w, True),
    "gemm_f32": lambda: torch.ops.ws1_sm90.gemm_f32(x, w, True),
    "linear_logp_fwd": lambda: torch.ops.ws1_sm90.linear_logp_fwd(x, w, t),
}
for name, call in calls.items():
    try:
        call()
        torch.cuda.synchronize()
        print(name, "accepted")
    except RuntimeError as exc:
        print(name, "refused:", str(exc).splitlines()[0])
"""


@pytest.mark.parametrize("shift", [1, 4])
def test_an_operand_off_a_16_byte_boundary_is_refused_by_each_op(shift: int) -> None:
    """TMA reads from 16-byte boundaries, and CUTLASS launches on a descriptor it could not encode: each Hopper op
    refuses such a start in one line (2 and 8 bytes in), in a child process so that a crash fails only this test.
    The control, 16 bytes in, is accepted by every op."""
    proc = _child(_OFFSET_START, str(shift))
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and len(lines) == 3, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    for line in lines:
        assert "refused:" in line and f"starts {2 * shift} bytes past a 16-byte boundary" in line, line
    control = _child(_OFFSET_START, "8")
    assert control.returncode == 0 and control.stdout.split().count("accepted") == 3, control.stdout


_MISALIGNED = """
import torch, ws1_kernels.cuda_sm90
a = torch.randn(4, 4100, device="cuda", dtype=torch.bfloat16)
b = torch.randn(64, 4100, device="cuda", dtype=torch.bfloat16)
try:
    torch.ops.ws1_sm90.gemm(a, b, True)
except RuntimeError as exc:
    print("refused:", str(exc).splitlines()[0])
    raise SystemExit(1)
print("accepted")
"""


def test_a_misaligned_width_is_refused_by_the_op() -> None:
    """Called directly (not through the candidate, which checks first), the op refuses a width TMA cannot take
    with an error, never a crash; in a child process, so that a crash is a failure here rather than the end of
    the whole test run. (It once crashed: the GPU machine's compiler linked a static copy of the C++ runtime into
    the module; csrc/setup.py now links it shared and refuses a module that carries one.)"""
    proc = _child(_MISALIGNED)
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    assert "refused:" in proc.stdout and "multiples of 8" in proc.stdout, proc.stdout


def test_a_short_call_is_padded_to_the_same_bits() -> None:
    """Fewer than 64 rows run on A zero-padded to 64 (the binding): the result has the caller's rows, is
    contiguous, and each row has the bits that row gets inside a 64-row call."""
    g = torch.Generator(device=DEV).manual_seed(3)
    a = torch.randn(64, 4096, device=DEV, dtype=torch.bfloat16, generator=g)
    b = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16, generator=g)
    full = torch.ops.ws1_sm90.gemm(a, b, True)
    for rows in (1, 5, 63):
        part = torch.ops.ws1_sm90.gemm(a[:rows].contiguous(), b, True)
        assert part.shape == (rows, 4096) and part.is_contiguous()
        assert torch.equal(_bits(part), _bits(full[:rows])), rows


def test_the_built_modules_link_the_cpp_runtime_shared() -> None:
    """Neither module carries its own copy of libstdc++ (csrc/setup.py refuses one at build time; this checks the
    modules that really loaded). The negative control, a module linked with -static-libstdc++, is in
    tests/ws1_kernels/test_csrc_setup_link.py."""
    import ws1_cuda_ext  # type: ignore[import-not-found]
    import ws1_cuda_sm90_ext  # type: ignore[import-not-found]
    from repo_scripts import load_repo_script

    setup = load_repo_script("csrc/setup.py", "ws1_csrc_setup_gpu")
    for module in (ws1_cuda_ext, ws1_cuda_sm90_ext):
        assert setup.static_runtime_symbols(module.__file__) == [], module.__file__


# A thread whose first CUDA work is a Hopper op: torch hands it tensors from its cache without a runtime call, so
# no context is current there when CUTLASS encodes its TMA descriptors through the driver API. Autograd's backward
# worker is such a thread (the bench's first linear_logp backward hit it: CUDA_ERROR_INVALID_CONTEXT, then an
# illegal instruction). The main thread computes the reference and leaves blocks of the outputs' sizes in the cache.
_FIRST_WORK_IN_A_THREAD = """
import threading, torch, ws1_kernels.cuda_sm90
a = torch.randn(64, 256, device="cuda").to(torch.bfloat16)
b = torch.randn(512, 256, device="cuda").to(torch.bfloat16)
targets = torch.arange(64, device="cuda") * 7 % 512
dy = torch.randn(64, 512, device="cuda").to(torch.bfloat16)
table = torch.arange(64, device="cuda", dtype=torch.int32).reshape(4, 16)
def wgrad():
    mg = torch.zeros(512, 256, device="cuda")
    torch.ops.ws1_sm90.wgrad(dy, a, table, 4, mg, None)
    return mg
want = [torch.ops.ws1_sm90.gemm_f32(a, b, True), torch.ops.ws1_sm90.gemm(a, b, True),
        *torch.ops.ws1_sm90.linear_logp_fwd(a, b, targets), wgrad()]
cached = [torch.empty_like(w) for w in want] + [torch.empty(64 * (2 * 4 + 1), device="cuda")]
cached += [torch.empty(64, 512, device="cuda", dtype=torch.bfloat16), torch.empty(64, 256, device="cuda", dtype=torch.bfloat16)]
torch.cuda.synchronize()
del cached
got = {}
def work():
    try:
        got["out"] = [torch.ops.ws1_sm90.gemm_f32(a, b, True), torch.ops.ws1_sm90.gemm(a, b, True),
                      *torch.ops.ws1_sm90.linear_logp_fwd(a, b, targets), wgrad()]
        torch.cuda.synchronize()
    except Exception as exc:
        got["error"] = str(exc).splitlines()[0]
t = threading.Thread(target=work)
t.start()
t.join()
if "error" in got:
    print("error:", got["error"])
    raise SystemExit(1)
same = [torch.equal(g.view(torch.int16 if g.dtype == torch.bfloat16 else torch.int32),
                    w.view(torch.int16 if w.dtype == torch.bfloat16 else torch.int32)) for g, w in zip(got["out"], want)]
print("same bits:", same)
raise SystemExit(0 if all(same) else 1)
"""


def test_a_thread_whose_first_cuda_work_is_a_hopper_op_gets_the_main_threads_bits() -> None:
    """In a child process, so that an illegal instruction fails this test rather than the whole run."""
    proc = _child(_FIRST_WORK_IN_A_THREAD)
    assert proc.returncode == 0, (proc.stdout[-1000:], proc.stderr[-2000:])
    assert "same bits: [True, True, True, True, True]" in proc.stdout, proc.stdout
    assert "Failed to initialize the TMA descriptor" not in proc.stderr, proc.stderr[-2000:]
