"""The Triton step ops (``triton_ops.step_ops``) under TRITON_INTERPRET=1: the slab attention's arithmetic, the
custom ops' registration, the step path's rows against the judged path's, bit for bit, and the rollout engine
on the step path (its records, its op watch, its refusals). In fp32: see the ``model`` fixture.

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

from kernels_support import interp_only  # noqa: E402
from step_support import mismatched, packed_logits, raw_bits, run_steps, sequences  # noqa: E402

from ws1_kernels import LayoutContext  # noqa: E402
from ws1_kernels.integrations import qwen3  # noqa: E402
from ws1_kernels.integrations.step import StepPlan, step_ops  # noqa: E402
from ws1_kernels.triton_ops import attention as att  # noqa: E402

pytestmark = [
    *interp_only(),
    pytest.mark.heavy(seconds=80),  # one block: its module-scoped engines are built once
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
        "rope_angles": (torch.tensor([0, 5, 9]), 1e6, 16),
        "rope_rotate": (torch.randn((3, 2, 16), generator=g), torch.randn((3, 2, 8), generator=g)),
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
def small(triton_fp32_small):  # type: ignore[no-untyped-def]
    """(config, weights) of ``model`` (conftest)."""
    return triton_fp32_small


@pytest.fixture(scope="module")
def model(triton_fp32_model):  # type: ignore[no-untyped-def]
    """The judged path of these tests: the drop-in on the Triton kernels' fp32 twins (conftest)."""
    return triton_fp32_model


@pytest.fixture(scope="module")
def packed_ref(model):  # type: ignore[no-untyped-def]
    """The judged rows, from one packed ``forward_call`` (computed once for the module, under ``seq_dot``)."""
    from kernels_support import sequential_dot
    from triton.runtime import interpreter as interp

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(interp.InterpreterBuilder, "create_dot", sequential_dot)
        seqs = sequences(model.lm_head.weight.shape[0], "cpu")
        return seqs, packed_logits(model, seqs)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_steps_give_the_packed_forward_bits(model, packed_ref, seq_dot, mode: str) -> None:  # type: ignore[no-untyped-def]
    """Chunked prefill, decode, a slot handed over: every step row's logits are the packed call's, bit for bit.
    ``compiled``: ``torch.compile(fullgraph=True)`` of the step (aot_eager here: the ops are opaque nodes, and
    a graph break would raise)."""
    seqs, ref = packed_ref
    assert len({raw_bits(v).sum().item() for v in ref.values()}) == len(ref)  # every row its own logits
    got = run_steps(model, step_ops("triton_cuda_bf16"), seqs, mode=mode, compile_backend="aot_eager")
    assert mismatched(got, ref) == []


def test_a_step_plan_one_key_short_changes_the_bits(model, packed_ref, seq_dot) -> None:  # type: ignore[no-untyped-def]
    seqs, ref = packed_ref

    def short(plan: StepPlan) -> StepPlan:
        return dataclasses.replace(plan, n_keys=(plan.n_keys - 1).clamp(min=1))

    got = run_steps(model, step_ops("triton_cuda_bf16"), seqs, tamper=short)
    bad = mismatched(got, ref)
    assert len(bad) > len(ref) // 2  # every row past position 0 sees one key fewer


def _engine_logprobs(model, path: str) -> dict[int, tuple[list[int], torch.Tensor]]:  # type: ignore[no-untyped-def]
    """Three requests with chunked prompts, joining one step apart through two slots: mixed prefill/decode
    steps, decode steps, a slot handed over."""
    from ws1_kernels.integrations import rollout
    from ws1_kernels.integrations.device_sampler import DeviceGumbelSampler

    g = torch.Generator().manual_seed(11)
    vocab = model.lm_head.weight.shape[0]
    reqs = [
        rollout.Request(r, torch.randint(0, vocab, (n,), generator=g), new, r)
        for r, (n, new) in enumerate(((5, 3), (2, 4), (4, 2)))
    ]
    eng = rollout.Engine(model, DeviceGumbelSampler(7), chunk_size=3, max_running=2, path=path)
    done = eng.run(reqs)
    if path == "step":
        assert eng.runner is not None and eng.runner.eager_steps == len(eng.trace)
    return {rid: (c.tokens, c.logprob_tensor) for rid, c in done.items()}


@pytest.fixture(scope="module")
def call_engine(model):  # type: ignore[no-untyped-def]
    """The engine's tokens and logprobs on the call path (computed once for the module, under ``seq_dot``)."""
    from kernels_support import sequential_dot
    from triton.runtime import interpreter as interp

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(interp.InterpreterBuilder, "create_dot", sequential_dot)
        return _engine_logprobs(model, "call")


def test_the_engine_on_the_step_path_records_the_call_paths_bits(model, call_engine, seq_dot) -> None:  # type: ignore[no-untyped-def]
    call = call_engine
    step = _engine_logprobs(model, "step")
    assert sorted(step) == sorted(call) == [0, 1, 2]
    lps = torch.cat([call[r][1] for r in call])
    assert bool(torch.isfinite(lps).all()) and float(lps.abs().min()) > 0  # real logprobs, not saturated
    for rid in call:
        assert step[rid][0] == call[rid][0]
        assert torch.equal(raw_bits(step[rid][1]), raw_bits(call[rid][1]))


def test_an_engine_step_one_key_short_changes_the_logprobs(model, call_engine, seq_dot, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from ws1_kernels.integrations import step_runner

    call = call_engine
    real = step_runner.StepPlan.from_device

    def short(slots, positions, max_len):  # type: ignore[no-untyped-def]
        plan = real(slots, positions, max_len)
        return dataclasses.replace(plan, n_keys=(plan.n_keys - 1).clamp(min=1))

    monkeypatch.setattr(step_runner.StepPlan, "from_device", staticmethod(short))
    step = _engine_logprobs(model, "step")
    assert any(not torch.equal(raw_bits(step[r][1]), raw_bits(call[r][1])) for r in call)


def test_the_step_rollouts_op_watch_is_clean(model, seq_dot) -> None:  # type: ignore[no-untyped-def]
    """Every op and kernel of a step-path rollout is one the step watch allows (its glue list is complete)."""
    pytest.importorskip("ws1_harness")
    from ws1_harness.run.chain_rollout import step_watch
    from ws1_kernels.integrations import rollout
    from ws1_kernels.integrations.device_sampler import DeviceGumbelSampler

    w = step_watch(qwen3.runtime_of(model))
    eng = rollout.Engine(
        model, DeviceGumbelSampler(1), chunk_size=3, max_running=2, path="step", watch=w.watching
    )
    g = torch.Generator().manual_seed(2)
    eng.run(
        [rollout.Request(r, torch.randint(0, 640, (n,), generator=g), 2, r) for r, n in enumerate((4, 2))]
    )
    assert w.problems() == []
    assert "triton:_attn_slab_fwd" in w.kernels and "triton:ws1_gemm_fixed_k" in w.kernels


def test_the_step_rollouts_op_watch_sees_a_stock_op(model, seq_dot, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The control: a step whose SwiGLU is stock torch must be named by the watch."""
    pytest.importorskip("ws1_harness")
    from ws1_harness.run.chain_rollout import step_watch
    from ws1_kernels.integrations import rollout, step_runner
    from ws1_kernels.integrations.device_sampler import DeviceGumbelSampler

    real = step_runner.step_ops("triton_cuda_bf16")
    stock = dataclasses.replace(real, swiglu=lambda g, u: torch.nn.functional.silu(g) * u)
    monkeypatch.setattr(step_runner, "step_ops", lambda profile: stock)
    w = step_watch(qwen3.runtime_of(model))
    eng = rollout.Engine(
        model, DeviceGumbelSampler(1), chunk_size=3, max_running=2, path="step", watch=w.watching
    )
    eng.run([rollout.Request(0, torch.tensor([1, 2, 3]), 1, 0)])
    (p,) = w.problems()
    assert "aten.silu" in p.items


def test_the_step_path_refuses_replaced_candidates_and_graphs_off_cuda(model) -> None:  # type: ignore[no-untyped-def]
    from ws1_kernels import KernelInputError
    from ws1_kernels.integrations.step_runner import StepRunner

    with pytest.raises(KernelInputError, match="need positive sizes and a CUDA model"):
        StepRunner(model, slots=1, max_len=4, graph_buckets=(2,))
    rt = qwen3.runtime_of(model)
    rt.overrides["swiglu"] = "planted"
    try:
        with pytest.raises(KernelInputError, match="only the call path runs replaced candidates"):
            StepRunner(model, slots=1, max_len=4)
    finally:
        del rt.overrides["swiglu"]


def _bench_pair(model, small, kv_shift: int = 0):  # type: ignore[no-untyped-def]
    """`ws1 bench --op decode_step`'s two sides (without graphs) on the same weights, ids and cached keys."""
    pytest.importorskip("ws1_harness")
    from ws1_harness.run.bench import decode_graph as dg

    cfg, weights = small
    stock = dg.stock_model(qwen3.qwen3_config(cfg), {k: v.float() for k, v in weights.items()}, "cpu")
    b, c, hkv, d = 2, 9, int(cfg.num_kv_heads), int(cfg.head_dim)
    g = torch.Generator().manual_seed(4)
    kv = [(torch.randn(b, c, hkv, d, generator=g), torch.randn(b, c, hkv, d, generator=g))]
    ids = torch.randint(0, int(cfg.vocab), (b,), generator=g)
    targets = torch.randint(0, int(cfg.vocab), (b,), generator=g)
    mine = dg.ws1_side(model, b, c, targets, graphs=False, ids=ids, kv=lambda i: kv[i]).call()
    shifted = [(k.roll(kv_shift, 0), v.roll(kv_shift, 0)) for k, v in kv]  # another request's keys
    theirs = dg.stock_side(stock, b, c, targets, graphs=False, ids=ids, kv=lambda i: shifted[i]).call()
    return mine, theirs


def test_the_bench_decode_sides_compute_one_function(model, small, seq_dot) -> None:  # type: ignore[no-untyped-def]
    """The ws1 step path and the stock static-cache decode give one logprob on one cache (fp32, 1e-4): the two
    sides of the decode rows time the same work."""
    mine, theirs = _bench_pair(model, small)
    assert float((mine - theirs).abs().max()) < 1e-4


def test_bench_decode_sides_on_different_caches_differ(model, small, seq_dot) -> None:  # type: ignore[no-untyped-def]
    mine, theirs = _bench_pair(model, small, kv_shift=1)
    assert float((mine - theirs).abs().max()) > 1e-3


def _graph_row(model, small):  # type: ignore[no-untyped-def]
    """One `decode_step` row of the graph pair, measured on the CPU (no graphs) with a timer that calls once."""
    pytest.importorskip("ws1_harness")
    from ws1_harness.run.bench import steps as ST

    class OnceTimer:
        name = "once"

        def __call__(self, fn, *, grad_to_none=(), label=""):  # type: ignore[no-untyped-def]
            fn()
            return 1.0

    cfg, weights = small
    models = ST.Models(
        cfg, model, model, {k: v.float() for k, v in weights.items()}, qwen3.qwen3_config(cfg), "cpu"
    )
    p = ST.StepPoint("decode_step", 2, 1, cache=5)
    return ST.measure_graph_decode("triton_cuda_bf16", "cpu", OnceTimer(), models, p, ST.stock_kernel_ids())


def test_a_graph_decode_row_records_what_ran_and_refuses_an_eager_peer(model, small, seq_dot) -> None:  # type: ignore[no-untyped-def]
    """The ws1 side's path is clean (its step ops, its kernels); on the CPU the stock side cannot be a CUDA
    graph, and a peer that is not one is an error row (never a ratio against a weakened stock)."""
    row = _graph_row(model, small)
    assert "candidate_path" not in row.errors and "candidate" not in row.errors
    assert "triton:_attn_slab_fwd" in row.kernels_observed
    assert "not a CUDA graph" in row.errors["peer_path"] and row.status == "error"
    assert row.step["graph_decode"]["peer"]["cache"] == "StaticCache"


def test_a_graph_decode_row_names_a_stock_op_on_the_ws1_side(model, small, seq_dot, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from ws1_kernels.integrations import step as step_mod

    real = step_mod.step_ops("triton_cuda_bf16")
    stock = dataclasses.replace(real, swiglu=lambda g, u: torch.nn.functional.silu(g) * u)
    monkeypatch.setattr(step_mod, "step_ops", lambda profile: stock)
    row = _graph_row(model, small)
    assert "aten.silu" in row.errors["candidate_path"]


class _EagerGraphStep:
    """``GraphStep``'s interface with no CUDA graph: static buffers, inputs copied in, the padded bucket run
    eagerly. The bucket and pad bookkeeping of ``StepRunner`` is what the test below exercises on the CPU."""

    def __init__(self, ops, w, cache, rows):  # type: ignore[no-untyped-def]
        from ws1_kernels.integrations.step import StepPlan, step_forward

        self.rows, self.calls = rows, 0
        self.token_ids = torch.zeros(rows, dtype=torch.int64)
        self.slots = torch.full((rows,), cache.scratch, dtype=torch.int64)
        self.positions = torch.zeros(rows, dtype=torch.int64)

        def run() -> torch.Tensor:
            plan = StepPlan.from_device(self.slots, self.positions, cache.max_len)
            return step_forward(ops, w, self.token_ids, plan, cache.k, cache.v)

        self.run = run

    def __call__(self, token_ids, slots, positions):  # type: ignore[no-untyped-def]
        assert token_ids.shape[0] == self.rows  # the runner pads every step to its bucket
        self.token_ids.copy_(token_ids)
        self.slots.copy_(slots)
        self.positions.copy_(positions)
        self.calls += 1
        with torch.no_grad():
            return self.run()


def _bucketed_engine(model, monkeypatch):  # type: ignore[no-untyped-def]
    """The engine on the step path with buckets of 4 on the CPU (graphs replaced by ``_EagerGraphStep``)."""
    from ws1_kernels.integrations import rollout, step_runner
    from ws1_kernels.integrations.device_sampler import DeviceGumbelSampler

    monkeypatch.setattr(step_runner, "GraphStep", _EagerGraphStep)
    real_init = step_runner.StepRunner.__init__

    def cpu_buckets(self, model, *, slots, max_len, graph_buckets=()):  # type: ignore[no-untyped-def]
        real_init(self, model, slots=slots, max_len=max_len)  # the CUDA check passed over
        self.buckets = sorted(graph_buckets)

    monkeypatch.setattr(step_runner.StepRunner, "__init__", cpu_buckets)
    g = torch.Generator().manual_seed(11)
    vocab = model.lm_head.weight.shape[0]
    reqs = [
        rollout.Request(r, torch.randint(0, vocab, (n,), generator=g), new, r)
        for r, (n, new) in enumerate(((5, 3), (2, 4), (4, 2)))
    ]
    eng = rollout.Engine(
        model, DeviceGumbelSampler(7), chunk_size=3, max_running=2, path="step", graph_buckets=(4,)
    )
    done = eng.run(reqs)
    assert eng.runner is not None and eng.runner.replays > 0 and eng.runner.eager_steps > 0
    return {rid: (c.tokens, c.logprob_tensor) for rid, c in done.items()}


def test_bucketed_steps_with_pad_rows_record_the_call_paths_bits(
    model, call_engine, seq_dot, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """The runner's buckets on the CPU (graphs replaced by an eager stand-in with the same interface): decode
    steps padded into buckets of 4 with scratch-slot rows give the call path's tokens and logprobs bit for bit:
    a pad row touches no real row."""
    got = _bucketed_engine(model, monkeypatch)
    for rid, (tokens, lps) in call_engine.items():
        assert got[rid][0] == tokens
        assert torch.equal(raw_bits(got[rid][1]), raw_bits(lps))


def test_pad_rows_in_a_real_slot_are_seen(model, call_engine, seq_dot, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The control: pad rows written into slot 0 (a request's keys at position 0) instead of the scratch slot
    must change what the engine records."""
    from ws1_kernels.integrations import step_runner

    real = step_runner.plan_rows

    def pads_in_slot_0(cache, request_ids, counts, *, pad_to=None):  # type: ignore[no-untyped-def]
        slots, positions = real(cache, request_ids, counts, pad_to=pad_to)
        return torch.where(slots == cache.scratch, 0, slots), positions

    monkeypatch.setattr(step_runner, "plan_rows", pads_in_slot_0)
    got = _bucketed_engine(model, monkeypatch)
    assert any(
        got[r][0] != call_engine[r][0] or not torch.equal(raw_bits(got[r][1]), raw_bits(call_engine[r][1]))
        for r in call_engine
    )
