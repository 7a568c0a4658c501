"""The Triton step ops (``triton_ops.step_ops``) under TRITON_INTERPRET=1: the slab attention's arithmetic, the
custom ops' registration, and the step path's rows against the judged path's, bit for bit.

Every bitwise test here runs with ``seq_dot`` (each ``tl.dot`` as one accumulator walked in ascending k): the
interpreter's numpy matmul may give a row other bits in another tile slot, which no GPU MMA does, and the step
path puts rows in other slots than a packed call by design (a decode tile per row, another GEMM M bucket).
Whether the H200 keeps the bits across those tiles is ``test_step_gpu.py``'s job; here the tables, the key
source, the block order and the masking are what is tested.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")
pytest.importorskip("transformers")

from step_support import mismatched, packed_logits, raw_bits, run_steps, sequences  # noqa: E402

from ws1_kernels import LayoutContext  # noqa: E402
from ws1_kernels.integrations import qwen3  # noqa: E402
from ws1_kernels.integrations.step import StepPlan, step_ops  # noqa: E402
from ws1_kernels.triton_ops import _launch  # noqa: E402
from ws1_kernels.triton_ops import attention as att  # noqa: E402

pytestmark = [
    pytest.mark.interp,
    pytest.mark.skipif(
        not _launch.interpreting(),
        reason="Triton kernels run on the CPU only under TRITON_INTERPRET=1 (the CPU nox session sets it)",
    ),
]

HQ, HKV, D = 4, 2, 16
SCALE = D**-0.5
TILES = att.Tiles(block_m=32, block_n=8, dq_m=16, dq_n=8, dkv_m=8, dkv_n=16, dec_m=16)
# one decode row per sample, at positions on both sides of the key blocks of 8 (0: no prefix at all)
POSITIONS = (0, 6, 7, 8, 9, 16, 23)
MAX_LEN = 32


def _decode_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q of each sample's decode row, and each sample's keys and values at positions 0..MAX_LEN-1."""
    g = torch.Generator().manual_seed(3)
    n = len(POSITIONS)
    q = torch.randn((n, HQ, D), generator=g) * 2.0  # peaky softmax: the block order shows in the bits
    keys = torch.randn((n, MAX_LEN, HKV, D), generator=g)
    vals = torch.randn((n, MAX_LEN, HKV, D), generator=g)
    return q, keys, vals


def _judged_decode(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
    """The candidate's decode call: one row per sample, its earlier keys as ``kv_prefix``."""
    k_rows = torch.stack([keys[s, p] for s, p in enumerate(POSITIONS)]).contiguous()
    v_rows = torch.stack([vals[s, p] for s, p in enumerate(POSITIONS)]).contiguous()
    prefix = {
        s: (keys[s, :p].contiguous(), vals[s, :p].contiguous()) for s, p in enumerate(POSITIONS) if p > 0
    }
    ctx = LayoutContext(torch.arange(len(POSITIONS)), torch.tensor(POSITIONS), prefix)
    return att._attention(q, k_rows, v_rows, SCALE, ctx, tiles=TILES, allow_fp32=True)


def _slab_decode(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, short_by: int = 0) -> torch.Tensor:
    """The step op: every sample's keys in one slab, sample s at rows ``s * MAX_LEN`` on."""
    k_slab = keys.reshape(-1, HKV, D).contiguous()
    v_slab = vals.reshape(-1, HKV, D).contiguous()
    base = (torch.arange(len(POSITIONS)) * MAX_LEN).to(torch.int32)
    n_keys = (torch.tensor(POSITIONS) + 1 - short_by).clamp(min=1).to(torch.int32)
    return att.slab_forward(q, k_slab, v_slab, base, n_keys, SCALE, tiles=TILES)


def test_the_slab_attention_gives_the_decode_calls_bits(seq_dot) -> None:  # type: ignore[no-untyped-def]
    q, keys, vals = _decode_case()
    assert torch.equal(raw_bits(_slab_decode(q, keys, vals)), raw_bits(_judged_decode(q, keys, vals)))


def test_a_slab_one_key_short_is_seen(seq_dot) -> None:  # type: ignore[no-untyped-def]
    q, keys, vals = _decode_case()
    got, ref = raw_bits(_slab_decode(q, keys, vals, short_by=1)), raw_bits(_judged_decode(q, keys, vals))
    differs = [i for i, p in enumerate(POSITIONS) if not torch.equal(got[i], ref[i])]
    assert differs == [i for i, p in enumerate(POSITIONS) if p > 0]  # position 0 has only its own key


def _op_samples() -> dict[str, tuple]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn((3, 32), generator=g)
    return {
        "embedding": (torch.tensor([0, 7, 7]), torch.randn((9, 32), generator=g)),
        "norm": (torch.randn((3, 2, 16), generator=g), torch.randn((16,), generator=g), 1e-6),
        "linear": (x, torch.randn((24, 32), generator=g)),
        "rope": (torch.randn((3, 2, 16), generator=g), torch.tensor([0, 5, 9]), 1e6),
        "attention": (
            torch.randn((2, HQ, D), generator=g),
            torch.randn((2 * MAX_LEN, HKV, D), generator=g),
            torch.randn((2 * MAX_LEN, HKV, D), generator=g),
            torch.tensor([0, MAX_LEN], dtype=torch.int32),
            torch.tensor([3, 11], dtype=torch.int32),
            SCALE,
        ),
        "swiglu": (torch.randn((3, 8), generator=g), torch.randn((3, 8), generator=g)),
        "logp": (torch.randn((3, 40), generator=g), torch.tensor([0, 39, 5])),
    }


@pytest.mark.parametrize("name", sorted(_op_samples()))
def test_each_step_op_passes_torch_opcheck(name: str) -> None:
    """The schema, the fake implementation (shape, dtype, device, strides) and the dispatch of each op, as
    torch.compile and CUDA graphs rely on them."""
    from ws1_kernels.triton_ops import step_ops as so  # noqa: F401  (registers the ops)

    torch.library.opcheck(getattr(torch.ops.ws1_triton, name).default, _op_samples()[name])


def test_opcheck_sees_a_fake_of_the_wrong_shape() -> None:
    """The control: a custom op whose fake drops a dimension must fail the same check."""

    @torch.library.custom_op("ws1_test::bad_fake", mutates_args=())
    def bad(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @bad.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[1:])

    with pytest.raises(Exception, match="(?i)shape|size"):
        torch.library.opcheck(torch.ops.ws1_test.bad_fake.default, (torch.ones(3, 4),))


@pytest.fixture(scope="module")
def bf16_model(tiny_one_layer):  # type: ignore[no-untyped-def]
    """The drop-in on ``triton_cuda_bf16`` with CPU tensors. The registry refuses a CUDA profile on the CPU
    (fail-closed); the interpreter runs its kernels on CPU tensors, so the refusal is lifted while the
    candidates are resolved, and only then."""
    from ws1_kernels import registry

    _m, cfg, weights, _fx = tiny_one_layer
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "_device_reason", lambda cand, device: None)
        return qwen3.build_model(qwen3.qwen3_config(cfg), weights, "triton_cuda_bf16")


@pytest.fixture(scope="module")
def packed_ref(bf16_model):  # type: ignore[no-untyped-def]
    """The judged rows, from one packed ``forward_call`` (computed once for the module, under ``seq_dot``)."""
    from kernels_support import sequential_dot
    from triton.runtime import interpreter as interp

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(interp.InterpreterBuilder, "create_dot", sequential_dot)
        seqs = sequences(bf16_model.lm_head.weight.shape[0], "cpu")
        return seqs, packed_logits(bf16_model, seqs)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_steps_give_the_packed_forward_bits(bf16_model, packed_ref, seq_dot, mode: str) -> None:  # type: ignore[no-untyped-def]
    """Chunked prefill, decode, a slot handed over: every step row's logits are the packed call's, bit for bit.
    ``compiled``: ``torch.compile(fullgraph=True)`` of the step (aot_eager here: the ops are opaque nodes, and
    a graph break would raise)."""
    seqs, ref = packed_ref
    got = run_steps(bf16_model, step_ops("triton_cuda_bf16"), seqs, mode=mode, compile_backend="aot_eager")
    assert mismatched(got, ref) == []


def test_a_step_plan_one_key_short_changes_the_bits(bf16_model, packed_ref, seq_dot) -> None:  # type: ignore[no-untyped-def]
    seqs, ref = packed_ref

    def short(plan: StepPlan) -> StepPlan:
        return dataclasses.replace(plan, n_keys=(plan.n_keys - 1).clamp(min=1))

    got = run_steps(bf16_model, step_ops("triton_cuda_bf16"), seqs, tamper=short)
    bad = mismatched(got, ref)
    assert len(bad) > len(ref) // 2  # every row past position 0 sees one key fewer
