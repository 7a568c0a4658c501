"""The Hopper profile (`cuda_bf16_sm90`) where no GPU is needed: it fails closed off capability 9.0, refuses
misaligned widths in one line, overrides exactly the GEMM operators and logp (the rest keep their generic kernel ids), and
its M buckets are the ones the CUDA header defines. Each property has the case that must be refused beside it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from ws1_kernels import KernelInputError, registry
from ws1_kernels.cuda import linear as generic
from ws1_kernels.cuda_sm90 import capability_reason
from ws1_kernels.cuda_sm90 import linear as sm90
from ws1_kernels.errors import CandidateUnavailable

HEADER = Path(__file__).resolve().parents[2] / "csrc" / "sm90" / "ws1_sm90.h"


def test_capability_9_0_is_accepted() -> None:
    assert capability_reason("NVIDIA H200", (9, 0)) is None


@pytest.mark.parametrize("capability", [(8, 6), (8, 9), (10, 0), (12, 0)])
def test_any_other_capability_is_refused_naming_the_device(capability: tuple[int, int]) -> None:
    why = capability_reason("Some GPU", capability)
    assert why is not None
    assert "Some GPU" in why and f"sm_{capability[0]}{capability[1]}" in why and "9.0" in why


def test_without_the_extensions_every_cell_says_what_is_not_built() -> None:
    with pytest.raises(CandidateUnavailable) as info:
        registry.resolve("cuda_bf16_sm90", "det_gemm", "cpu")
    assert "not built" in str(info.value) and "\n" not in str(info.value)


def _header_constant(text: str, name: str) -> int:
    m = re.search(rf"constexpr int64_t {name} = (\d+);", text)
    assert m is not None, f"{name} is not in the header"
    return int(m.group(1))


def test_the_buckets_are_the_headers() -> None:
    text = HEADER.read_text()
    assert (_header_constant(text, "kSmallM"), _header_constant(text, "kMidM")) == sm90.BUCKETS
    assert _header_constant(text, "kGemmAlign") == sm90.ALIGN


def test_the_fused_linear_logp_buckets_are_the_headers() -> None:
    from ws1_kernels.cuda_sm90.logprob import FUSED_BUCKETS

    text = HEADER.read_text()
    assert (_header_constant(text, "kFusedSmallM"), _header_constant(text, "kFusedMidM")) == FUSED_BUCKETS
    # the control: a changed header is seen
    changed = text.replace("kFusedMidM = 256;", "kFusedMidM = 512;")
    assert _header_constant(changed, "kFusedMidM") != FUSED_BUCKETS[1]


def test_the_bucket_reader_sees_a_changed_header() -> None:
    text = HEADER.read_text().replace("kMidM = 1024;", "kMidM = 2048;")
    assert _header_constant(text, "kMidM") != sm90.BUCKETS[1]


def test_aligned_widths_pass_the_check() -> None:
    sm90._check_align("w", torch.empty(3, 4096), torch.empty(6144, 4096))


@pytest.mark.parametrize(("k", "n", "which"), [(4100, 6144, "K"), (4096, 6146, "N")])
def test_a_misaligned_width_is_one_line(k: int, n: int, which: str) -> None:
    with pytest.raises(KernelInputError) as info:
        sm90._check_align("cuda_bf16_sm90.det_gemm", torch.empty(3, k), torch.empty(n, k))
    text = str(info.value)
    assert text.startswith("cuda_bf16_sm90.det_gemm: ") and which in text and "\n" not in text


def _at_byte_offset(offset: int, rows: int, cols: int) -> torch.Tensor:
    """A contiguous bf16 [rows, cols] view starting `offset` bytes into a fresh (64-byte aligned) buffer."""
    buf = torch.zeros(rows * cols + 64, dtype=torch.bfloat16)
    return buf[offset // 2 : offset // 2 + rows * cols].view(rows, cols)


@pytest.mark.parametrize("which", ["x", "weight"])
def test_an_operand_off_a_16_byte_boundary_is_one_line(which: str) -> None:
    """TMA cannot encode a descriptor at such an address (CUTLASS then launches on it anyway): refused first."""
    x, w = _at_byte_offset(0, 3, 64), _at_byte_offset(0, 16, 64)
    if which == "x":
        x = _at_byte_offset(2, 3, 64)
    else:
        w = _at_byte_offset(2, 16, 64)
    with pytest.raises(KernelInputError) as info:
        sm90._check_align("cuda_bf16_sm90.lm_head", x, w)
    text = str(info.value)
    assert text.startswith(f"cuda_bf16_sm90.lm_head: {which} starts 2 bytes past") and "\n" not in text


def test_the_control_a_view_at_a_16_byte_offset_passes() -> None:
    sm90._check_align("w", _at_byte_offset(16, 3, 64), _at_byte_offset(32, 16, 64))


def test_the_hopper_entries_run_their_own_op_and_name_both_weight_gradients() -> None:
    for op, generic_id in (("det_gemm", generic.DET_GEMM), ("lm_head", generic.LM_HEAD)):
        entry = sm90.OPS[op]
        # the weight gradient records the Hopper id or, for a weight off its tile, the generic one
        assert entry.kernel_id.startswith("ws1.cuda_sm90.") and entry.kernel_ids == {
            generic_id,
            sm90.WGRAD_KERNEL,
        }
        assert "ws1_sm90.gemm" in entry.declared_ops and "ws1.gemm" not in entry.declared_ops
    # the control: the generic entries dispatch ws1.gemm, which the Hopper entries must never do
    assert "ws1.gemm" in generic.OPS["det_gemm"].declared_ops
    assert set(sm90.OPS) == {"det_gemm", "lm_head"}


def test_the_hopper_logp_entries_run_their_own_ops() -> None:
    from ws1_kernels.cuda import logprob as generic_logp
    from ws1_kernels.cuda_sm90 import logprob as sm90_logp

    entry = sm90_logp.OPS["logp"]
    assert entry.kernel_id == "ws1.cuda_sm90.logp.onepass"
    assert {"ws1_sm90.logp_fwd", "ws1_sm90.logp_bwd"} <= entry.declared_ops
    assert not any(op.startswith("ws1.") for op in entry.declared_ops)
    # the control: the generic entry dispatches ws1.logp_fwd, which the Hopper entry must never do
    assert "ws1.logp_fwd" in generic_logp.OPS["logp"].declared_ops
    assert set(sm90_logp.OPS) == {"logp", "linear_logp"}


def test_the_hopper_linear_logp_has_its_own_forward_and_names_the_generic_backward_pieces() -> None:
    from ws1_kernels.cuda import logprob as generic_logp
    from ws1_kernels.cuda_sm90 import logprob as sm90_logp

    entry = sm90_logp.OPS["linear_logp"]
    assert entry.kernel_id == "ws1.cuda_sm90.linear_logp.wgmma"
    # the backward's generic pieces record the generic id; the weight gradient records the Hopper one (or, for a
    # weight off its tile, the generic one)
    assert entry.kernel_ids == {generic_logp.LINEAR_KERNEL, sm90.WGRAD_KERNEL}
    assert {
        "ws1_sm90.linear_logp_fwd",  # the fused forward
        "ws1_sm90.gemm_f32",  # the backward's recompute of the logits
        "ws1.logp_bwd_f32",
        "ws1.gemm_wgrad",
    } <= entry.declared_ops
    assert not {"ws1.gemm_f32_out", "ws1.logp_fwd_f32"} & entry.declared_ops
    assert sm90_logp.HOPPER_LINEAR.fused is not None and sm90_logp.HOPPER_LINEAR.logp is None
    # the control: the generic forward materialises its logits
    assert generic_logp.GENERIC_LINEAR.fused is None
    # dx is the Hopper GEMM's (ws1_sm90.gemm_f32 over each half): the generic dx GEMM is not declared
    assert sm90_logp.HOPPER_LINEAR.dx is not None and "ws1.gemm" not in entry.declared_ops
    assert (
        generic_logp.GENERIC_LINEAR.dx is None and "ws1.gemm" in generic_logp.OPS["linear_logp"].declared_ops
    )
    # the control: the generic forward is exactly what the Hopper entry leaves out
    assert {"ws1.gemm_f32_out", "ws1.logp_fwd_f32"} <= generic_logp.OPS["linear_logp"].declared_ops
    # one forward handed to the generic function: the checks and the backward are the generic module's, not a copy
    assert isinstance(sm90_logp.HOPPER_LINEAR, generic_logp.LinearLogpForward)
    assert sm90_logp.HOPPER_LINEAR.kernel == entry.kernel_id
    assert sm90_logp.HOPPER.kernel == sm90_logp.OPS["logp"].kernel_id != generic_logp.GENERIC.kernel


@pytest.mark.parametrize(
    ("shape", "hopper"), [((256, 128), True), ((151936, 4096), True), ((136, 128), False), ((128, 72), False)]
)
def test_the_hopper_weight_gradient_is_picked_by_the_weights_shape(
    shape: tuple[int, int], hopper: bool
) -> None:
    """Both dims multiples of 128: the Hopper kernel and its id; otherwise None, so the generic kernel runs."""
    picked = sm90.hopper_wgrad(torch.empty(shape))
    assert (picked is not None) == hopper
    if picked is not None:
        assert picked[0] == sm90.WGRAD_KERNEL


@pytest.mark.parametrize(("n", "k"), [(151936, 4096), (6144, 4096), (4096, 12288), (128, 384)])
@pytest.mark.parametrize("n_blocks", [1, 257])
def test_the_weight_gradient_launches_one_variant_whatever_the_shape_or_batch(
    monkeypatch: pytest.MonkeyPatch, n: int, k: int, n_blocks: int
) -> None:
    """Every weight and every table size get WGRAD_VARIANT, passed explicitly (the op's own default, one warpgroup
    on 64-row stages, is another variant, so a call leaving it out would fail here)."""
    calls: list[tuple[object, ...]] = []
    monkeypatch.setattr(sm90, "_wgrad_kernel", lambda *args: calls.append(args))
    mg = torch.zeros(n, k)
    sm90._wgrad_op(torch.empty(8, n), torch.empty(8, k), torch.empty(1, 16), n_blocks, mg, None)
    assert len(calls) == 1 and calls[0][4] is mg
    assert calls[0][-2:] == sm90.WGRAD_VARIANT == (1, 32)


def test_linear_logp_and_the_gemm_share_one_weight_gradient_picker() -> None:
    """linear_logp's backward picks through the same ``pick_wgrad`` as the GEMM: the Hopper kernel and its id for a
    tile-multiple weight, the generic op with no id of its own (linear_logp's id names it) for another; the GEMM
    gets its generic id there, the control that the id argument is what differs."""
    hopper = generic.pick_wgrad(sm90.hopper_wgrad, torch.empty(256, 128), None)
    other = generic.pick_wgrad(sm90.hopper_wgrad, torch.empty(136, 128), None)
    assert hopper[0] == sm90.WGRAD_KERNEL and hopper[1] is sm90._wgrad_op
    assert other == (None, generic._generic_wgrad)
    assert sm90._DET_GEMM.wgrad_for(torch.empty(136, 128)) == (generic.DET_GEMM, generic._generic_wgrad)


def test_a_gemm_falls_back_to_the_generic_weight_gradient() -> None:
    hopper = sm90._DET_GEMM.wgrad_for(torch.empty(256, 128))
    other = sm90._DET_GEMM.wgrad_for(torch.empty(136, 128))
    assert hopper[0] == sm90.WGRAD_KERNEL
    assert other[0] == generic.DET_GEMM and other[1] is generic._generic_wgrad
    # the control: the generic profile's GEMM never picks the Hopper kernel
    assert generic._DET_GEMM.wgrad_for(torch.empty(256, 128))[0] == generic.DET_GEMM


def test_the_weight_gradient_op_and_id_are_declared() -> None:
    from ws1_kernels.cuda_sm90 import logprob as sm90_logp

    for entry in (*sm90.OPS.values(), sm90_logp.OPS["linear_logp"]):
        assert "ws1_sm90.wgrad" in entry.declared_ops and sm90.WGRAD_KERNEL in entry.kernel_ids
    assert sm90_logp.HOPPER_LINEAR.wgrad is sm90.hopper_wgrad


def test_the_wgrad_tile_is_the_headers() -> None:
    assert _header_constant(HEADER.read_text(), "kWgradTile") == sm90.WGRAD_TILE


def test_the_hopper_attention_entry_runs_its_own_forward_and_backward() -> None:
    from ws1_kernels.cuda import attention as generic_att
    from ws1_kernels.cuda_sm90 import attention as sm90_att

    entry = sm90_att.OPS["attention"]
    assert entry.kernel_id == sm90_att.KERNEL == sm90_att.FORWARD.kernel
    assert sm90_att.FORWARD.backward is not None
    assert sm90_att.FORWARD.backward.kernel == sm90_att.BWD_KERNEL
    assert sm90_att.FORWARD.backward.call is sm90_att.hopper_backward
    # its backward, and the generic pair at widths the Hopper kernels do not serve
    assert entry.kernel_ids == {sm90_att.BWD_KERNEL, generic_att.KERNEL}
    assert {"ws1_sm90.attn_fwd", "ws1_sm90.attn_bwd", "ws1.attn_fwd", "ws1.attn_bwd"} <= entry.declared_ops
    assert set(sm90_att.OPS) == {"attention"}
    # the control: the generic profile's tiled forward has no backward of its own, and its forward id is one the
    # Hopper entry records nowhere
    assert generic_att.GENERIC.backward is None
    assert generic_att.GENERIC.kernel not in {entry.kernel_id, *entry.kernel_ids}
    assert "ws1_sm90.attn_bwd" not in generic_att.OPS["attention"].declared_ops


@pytest.mark.parametrize(
    ("hq", "hkv", "d", "rows", "served"),
    [
        (32, 8, 128, 128, True),  # Qwen3-8B: 32 tokens a block
        (32, 8, 128, 64, True),  # the step path's one-warpgroup CTA
        (40, 8, 128, 128, False),  # a group of 5 divides neither block
        (32, 8, 64, 128, False),  # another head dim
        (32, 0, 128, 128, False),
    ],
)
def test_the_hopper_attention_serves_the_widths_the_kernel_takes(
    hq: int, hkv: int, d: int, rows: int, served: bool
) -> None:
    from ws1_kernels.cuda_sm90 import attention as sm90_att

    assert sm90_att.supports(hq, hkv, d, rows) is served


def test_the_hopper_attention_block_sizes_are_the_kernels() -> None:
    """The Python block sizes and schedules are the launcher's: 128 rows take two warpgroups, 64 one, and the
    schedules are ws1_sm90.h's kSchedules (attention_sm90.cu)."""
    from ws1_kernels.cuda_sm90 import attention as sm90_att

    src = (HEADER.parent / "attention_sm90.cu").read_text()
    assert "(block_rows == 128 ? 1 : 0)" in src and "(block_rows == 64 || block_rows == 128)" in src
    assert sm90_att.BLOCK_ROWS in (64, 128) and sm90_att.STEP_BLOCK_ROWS == 64
    m = re.search(r"constexpr int kSchedules = (\d+);", HEADER.read_text())
    assert m is not None and tuple(range(int(m.group(1)))) == sm90_att.SCHEDULES
    assert sm90_att.SCHEDULE in sm90_att.schedules(sm90_att.BLOCK_ROWS)
    # Q in registers at two warpgroups is refused by the kernel's own check, and Python never asks for it
    assert "!(schedule == 3 && block_rows == 128)" in src
    assert "!((schedule == 4 || schedule == 6) && block_rows == 64)" in src
    assert 3 in sm90_att.schedules(64) and 3 not in sm90_att.schedules(128)
    for s in sm90_att.PING_PONG:
        assert s in sm90_att.schedules(128) and s not in sm90_att.schedules(64)


def test_the_wide_schedules_are_the_launchers_128_key_cases() -> None:
    """Schedules 5 and 6 launch the 128-key kernel (cases 2 s + (rows == 128): 10, 11 and 13) and nothing else
    does; the Python key block follows."""
    from ws1_kernels.cuda_sm90 import attention as sm90_att

    src = (HEADER.parent / "attention_sm90.cu").read_text()
    wide_cases = {int(c) for c in re.findall(r"case (\d+): return WS1_ATTN_WIDE", src)}
    assert wide_cases == {
        2 * s + (r == 128) for s in sm90_att.WIDE for r in (64, 128) if s in sm90_att.schedules(r)
    }
    assert {s for s in sm90_att.SCHEDULES if sm90_att.key_block(s) == 128} == set(sm90_att.WIDE)
    assert sm90_att.FORWARD.tokens(32, 8) == sm90_att.BLOCK_ROWS // 4


def test_the_backward_key_blocks_cover_every_samples_keys_from_its_first_row() -> None:
    from ws1_kernels import LayoutContext
    from ws1_kernels.cuda_sm90 import attention as sm90_att

    lengths = (70, 5, 64)
    ids = torch.cat([torch.full((n,), s, dtype=torch.int64) for s, n in enumerate(lengths)])
    pos = torch.cat([torch.arange(n) for n in lengths])
    got = sm90_att.key_blocks(LayoutContext(ids, pos), torch.device("cpu")).tolist()
    assert sorted(got) == [[0, 70, 0], [0, 70, 1], [70, 5, 0], [75, 64, 0]]
    # the control: a permuted packing moves each sample's entries with its rows, never splits a block differently
    perm = (5, 64, 70)
    ids2 = torch.cat([torch.full((n,), s, dtype=torch.int64) for s, n in enumerate(perm)])
    pos2 = torch.cat([torch.arange(n) for n in perm])
    got2 = sm90_att.key_blocks(LayoutContext(ids2, pos2), torch.device("cpu")).tolist()
    assert sorted((n, kb) for _, n, kb in got2) == sorted((n, kb) for _, n, kb in got) and got2 != got


def test_the_backward_key_blocks_put_the_longest_walks_first() -> None:
    """A key block walks its sample's rows from its own on: the longest walks start first, so the grid's tail holds
    short ones (the order is the grid's alone)."""
    from ws1_kernels import LayoutContext
    from ws1_kernels.cuda_sm90 import attention as sm90_att

    lengths = (70, 5, 200)
    ids = torch.cat([torch.full((n,), s, dtype=torch.int64) for s, n in enumerate(lengths)])
    pos = torch.cat([torch.arange(n) for n in lengths])
    got = sm90_att.key_blocks(LayoutContext(ids, pos), torch.device("cpu")).tolist()
    walks = [n - kb * sm90_att.KEY_BLOCK for _, n, kb in got]
    assert walks == sorted(walks, reverse=True) and walks[0] == 200 and walks[-1] == 5
    # the control: in sample order the walks are not sorted, so the sort is what orders them
    in_order = [n - kb * sm90_att.KEY_BLOCK for n in lengths for kb in range((n + 63) // 64)]
    assert in_order != sorted(in_order, reverse=True) and sorted(in_order) == sorted(walks)


def test_the_hopper_backward_refuses_a_kv_prefix() -> None:
    from ws1_kernels import LayoutContext
    from ws1_kernels.cuda_sm90 import attention as sm90_att

    x = torch.zeros(2, 32, 128, dtype=torch.bfloat16)
    kv = torch.zeros(2, 8, 128, dtype=torch.bfloat16)
    pre = torch.zeros(3, 8, 128, dtype=torch.bfloat16)
    ctx = LayoutContext(torch.tensor([0, 0]), torch.tensor([3, 4]), {0: (pre, pre)})
    with pytest.raises(KernelInputError, match="kv prefix"):
        sm90_att.hopper_backward(x, kv, kv, x, x, torch.zeros(2, 32), 0.1, ctx)
