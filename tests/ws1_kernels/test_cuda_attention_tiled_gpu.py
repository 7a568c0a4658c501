"""The tensor-core attention forward (`cuda_bf16`, csrc/kernels/attention_tiled.cu) on the GPU, Qwen3-8B widths.

What only the device shows: a row's bits do not depend on the row block it lands in (the candidate's blocks of 16
tokens, the step path's one block per row, a decode call after a prefix), the values are right against the fp32
reference at the contract's tolerance, and every reused CTA walks its keys the same way 100 times over. The whole
operator's accuracy and layout invariance stay the matrix's judgment (`ws1 matrix --profile cuda_bf16`).
"""

from __future__ import annotations

import pytest
import torch
from cuda_only import skip_module_without_extension

from ws1_kernels import LayoutContext, cuda, reference

pytestmark = [pytest.mark.gpu, pytest.mark.needs_build]

skip_module_without_extension()

from kernels_support import assert_bitwise, assert_close, assert_decode_after_prefix  # noqa: E402

from ws1_kernels.cuda import attention as att  # noqa: E402

DEV = "cuda"
HQ, HKV, D = 32, 8, 128
SCALE = D**-0.5
LENGTHS = (1, 63, 64, 65, 300)  # straddle the 64-key blocks and the 16-token row blocks


def _packed() -> tuple[LayoutContext, dict[str, torch.Tensor]]:
    ids = torch.cat([torch.full((n,), s, dtype=torch.int64) for s, n in enumerate(LENGTHS)])
    pos = torch.cat([torch.arange(n, dtype=torch.int64) for n in LENGTHS])
    g = torch.Generator().manual_seed(0)
    n = len(ids)
    rows = {
        "q": torch.randn((n, HQ, D), generator=g),
        "k": torch.randn((n, HKV, D), generator=g),
        "v": torch.randn((n, HKV, D), generator=g),
    }
    return LayoutContext(ids, pos), {k: t.to(torch.bfloat16).to(DEV) for k, t in rows.items()}


def _tiled(rows: dict[str, torch.Tensor], ctx: LayoutContext, per_row: bool) -> torch.Tensor:
    t = att._tables(ctx, rows["q"].shape[0], rows["q"].device, att.TILED_ROWS // (HQ // HKV))
    blocks = None if per_row else t.blocks
    return torch.ops.ws1.attn_fwd_tiled(rows["q"], rows["k"], rows["v"], t.key_base, t.n_keys, blocks, SCALE)[
        0
    ]


def test_the_candidate_runs_the_tiled_forward() -> None:
    assert att.tiled(HQ, HKV, D)
    names = {r["name"] for r in cuda.kernel_attributes()}
    assert "ws1_attn_fwd_tiled" in names


def test_a_row_gets_the_same_bits_in_a_block_of_16_tokens_and_alone() -> None:
    """The candidate's blocks against the step path's one block per row: rows of a block whose later rows need
    more keys walk those extra blocks fully masked, which must leave them unchanged bit for bit."""
    ctx, rows = _packed()
    assert_bitwise("per-row blocks", _tiled(rows, ctx, per_row=True), _tiled(rows, ctx, per_row=False))


def test_a_short_key_count_changes_the_bits() -> None:
    """Negative control of the bit comparison: a block table that cuts the last sample's keys short is seen."""
    ctx, rows = _packed()
    t = att._tables(ctx, rows["q"].shape[0], rows["q"].device, att.TILED_ROWS // (HQ // HKV))
    cut = t.blocks.clone()
    cut[-1, 2] -= 1  # the last block's key count one short: its last row loses its own key
    got = torch.ops.ws1.attn_fwd_tiled(rows["q"], rows["k"], rows["v"], t.key_base, t.n_keys, cut, SCALE)[0]
    with pytest.raises(AssertionError):
        assert_bitwise("cut", got, _tiled(rows, ctx, per_row=False))


def test_decode_after_a_prefix_gives_the_packed_bits() -> None:
    """Each sample's last token decoded alone, its earlier keys as the kv prefix, through the candidate."""
    _, rows = _packed()
    assert_decode_after_prefix(att.attention, rows, LENGTHS, SCALE)


def test_the_forward_is_right_against_the_fp32_reference() -> None:
    ctx, rows = _packed()
    got = att.attention(rows["q"], rows["k"], rows["v"], SCALE, ctx)
    want = reference.attention(*(rows[k].float() for k in ("q", "k", "v")), SCALE, ctx)
    assert_close("out", got, want, "forward_accuracy", "attention")


def test_the_forward_is_identical_run_to_run() -> None:
    ctx, rows = _packed()
    first = _tiled(rows, ctx, per_row=False)
    for _ in range(100):
        assert_bitwise("rerun", _tiled(rows, ctx, per_row=False), first)
