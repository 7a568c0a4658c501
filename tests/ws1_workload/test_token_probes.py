"""The token order probes change bits under every change of order along the token axis, by construction.

Two reductions run over tokens: the weight gradient's sum over a call's tokens (`dW = dy^T x`) and attention's
sum over keys (`P V`). Each test computes them in explicit orders (one correctly rounded fp32 add at a time, as
`summation_orders` does: no BLAS decides anything) on the manifest's own fixtures, through the physical layouts
the gate runs, and checks that the probe makes every faulty order visible as a difference between layouts (the
invariance judgment's red), while the correct order gives one value in every layout. The negative controls run
the same orders on the fixtures' ordinary random tokens and find elements that no order change moves: a verdict
resting on them rests on chance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest
import torch
from summation_orders import ALTERNATIVES, bits, blocked, pairwise, sequential, split

from ws1_workload import WorkloadError, build_fixture, build_layout, load_manifest, logical_tensor
from ws1_workload.fixtures import Fixture
from ws1_workload.inputs import ORDER_PROBE_TINY
from ws1_workload.layouts import Layout, PhysicalCall
from ws1_workload.token_probes import (
    PROBE_COLUMN,
    PV_MAX_KEY_BLOCK,
    PV_MINUS_KEY,
    PV_PLUS_KEY,
    PV_TINY_KEY,
    WGRAD_BLOCK,
    apply_edit,
    pv_probes,
    wgrad_probes_for,
)

MANIFEST = load_manifest()
TIERS = tuple(MANIFEST.tiers)
#: The tiers the CPU gate runs in CI (noxfile CPU_TIERS): every fault must be red in one of them.
CI_TIERS = ("short", "primary")
TRAINING = [ls for ls in MANIFEST.layouts if ls.kind == "training"]
#: det_gemm at the tiny widths: x [T, 512] (intermediate), upstream [T, 256] (hidden).
K_TINY, N_TINY = 512, 256

# --- the weight gradient ----------------------------------------------------------------------------------

Blocks = list[list[int]]  # one call's 16-position blocks, each a list of logical row indices
WgradKernel = Callable[[np.ndarray, Sequence[Blocks]], np.ndarray]


def _call_blocks(fx: Fixture, call: PhysicalCall, *, physical: bool = False) -> Blocks:
    """A call's weight-gradient blocks: samples by id (or in the order they first appear, `physical`), each
    sample's positions in 16-position blocks aligned to position 0; pads skipped."""
    sids = [int(s) for s in call.sample_ids.tolist() if s >= 0]
    order = list(dict.fromkeys(sids)) if physical else sorted(set(sids))
    blocks: Blocks = []
    for sid in order:
        pos = sorted(
            int(p) for s, p in zip(call.sample_ids.tolist(), call.positions.tolist(), strict=True) if s == sid
        )
        for b in sorted({p // WGRAD_BLOCK for p in pos}):
            blocks.append([fx.offsets[sid] + p for p in pos if p // WGRAD_BLOCK == b])
    return blocks


def _block_sums(terms: np.ndarray, blocks: Blocks) -> list[np.ndarray]:
    return [sequential(terms[:, rows]) for rows in blocks]


def correct(terms: np.ndarray, calls: Sequence[Blocks]) -> np.ndarray:
    """`sample_blocks_main_grad`: every block, in order, added into main_grad (the chain runs across calls)."""
    main = np.zeros(terms.shape[0], dtype=np.float32)
    for blocks in calls:
        for s in _block_sums(terms, blocks):
            main = main + s
    return main


def partial_per_call(terms: np.ndarray, calls: Sequence[Blocks]) -> np.ndarray:
    """The fault of a kernel whose accumulator starts at zero: each call's sum added to main_grad at the end."""
    main = np.zeros(terms.shape[0], dtype=np.float32)
    for blocks in calls:
        acc = np.zeros_like(main)
        for s in _block_sums(terms, blocks):
            acc = acc + s
        main = main + acc
    return main


def per_call(order: Callable[[np.ndarray], np.ndarray], name: str) -> WgradKernel:
    """A fault that reduces each call's block sums from zero in `order` (a split, backwards, a tree) and adds
    the call's sum to main_grad."""

    def kernel(terms: np.ndarray, calls: Sequence[Blocks]) -> np.ndarray:
        main = np.zeros(terms.shape[0], dtype=np.float32)
        for blocks in calls:
            sums = _block_sums(terms, blocks)
            main = main + order(np.stack(sums, axis=1)) if sums else main
        return main

    kernel.__name__ = name
    return kernel


def reversed_in_chain(terms: np.ndarray, calls: Sequence[Blocks]) -> np.ndarray:
    """The fault of a kernel that keeps main_grad in its chain but walks a call's blocks backwards."""
    main = np.zeros(terms.shape[0], dtype=np.float32)
    for blocks in calls:
        for s in reversed(_block_sums(terms, blocks)):
            main = main + s
    return main


#: Faulty token orders, each run on the blocks `_call_blocks` gives (the physical-order fault differs there).
WGRAD_FAULTS: tuple[WgradKernel, ...] = (
    partial_per_call,
    per_call(split(2), "split2"),
    per_call(split(3), "split3"),
    per_call(split(4), "split4"),
    per_call(blocked(1, reverse=True), "blocks_reversed"),
    per_call(pairwise, "tree"),
    reversed_in_chain,
)


def _layouts(fx: Fixture) -> list[Layout]:
    return [build_layout(fx, ls) for ls in TRAINING]


def _wgrad_per_layout(
    fx: Fixture, terms: np.ndarray, kernel: WgradKernel, *, physical: bool = False
) -> list[np.ndarray]:
    return [
        kernel(terms, [_call_blocks(fx, c, physical=physical) for c in lay.calls]) for lay in _layouts(fx)
    ]


def _probe_terms(fx: Fixture) -> np.ndarray:
    """`[probes, T]`: each probe element's terms per logical token, upstream times input in its column, as the
    harness builds both (every other token adds an exact zero)."""
    keys = list(fx.logical_keys)
    cols = {}
    for item in ("det_gemm.x", "det_gemm.upstream"):
        kinds = fx.hard_rows.get(item, ())
        rows = logical_tensor(fx.case_id, item, keys, 256, torch.float32, hard_rows=kinds)
        cols[item] = apply_edit(rows, keys, fx.token_edits.get(item)).numpy()
    active = fx.active.numpy().astype(np.float32)
    probes = _probes(fx)
    assert probes
    out = [cols["det_gemm.upstream"][:, p.column] * active * cols["det_gemm.x"][:, p.column] for p in probes]
    return np.stack(out).astype(np.float32)


def _probes(fx: Fixture) -> tuple:
    return wgrad_probes_for(fx.samples, MANIFEST.token_cases["wgrad_order_tokens"], fx.hard_rows)


def _red(values: Sequence[np.ndarray]) -> np.ndarray:
    """Per element: does some layout's value differ in bits from the first (packed) layout's?"""
    first = bits(values[0])
    return np.any([bits(v) != first for v in values[1:]], axis=0)


@pytest.mark.parametrize("tier", TIERS)
def test_the_wgrad_probe_is_what_the_docs_say(tier: str) -> None:
    fx = build_fixture(MANIFEST, tier)
    probes = _probes(fx)
    assert probes and probes[0].tiny_first
    for p in probes:
        assert (p.tiny[0] < p.plus[0]) == p.tiny_first and p.plus[0] == p.minus[0]
        assert p.plus[1] // WGRAD_BLOCK < p.minus[1] // WGRAD_BLOCK  # never one MMA instruction
    for row in _probe_terms(fx):
        assert sorted(row[row != 0].tolist()) == [-1.0, ORDER_PROBE_TINY, 1.0]


@pytest.mark.parametrize("tier", TIERS)
def test_the_correct_wgrad_order_gives_one_value_in_every_layout(tier: str) -> None:
    fx = build_fixture(MANIFEST, tier)
    values = _wgrad_per_layout(fx, _probe_terms(fx), correct)
    assert not _red(values).any()
    want = [0.0 if p.tiny_first else ORDER_PROBE_TINY for p in _probes(fx)]
    assert values[0].tolist() == want, "the survivor is lost exactly when it meets +1 alone"


@pytest.mark.parametrize("kernel", WGRAD_FAULTS, ids=lambda k: k.__name__)
def test_every_faulty_wgrad_order_is_red_in_a_ci_tier(kernel: WgradKernel) -> None:
    reds = {}
    for tier in CI_TIERS:
        fx = build_fixture(MANIFEST, tier)
        reds[tier] = bool(_red(_wgrad_per_layout(fx, _probe_terms(fx), kernel)).any())
    assert any(reds.values()), (kernel.__name__, reds)


def test_a_call_summed_from_zero_is_red_in_every_tier() -> None:
    """The commonest fault (the accumulator starts at zero, not at main_grad) is red wherever the gate runs."""
    for tier in TIERS:
        fx = build_fixture(MANIFEST, tier)
        assert _red(_wgrad_per_layout(fx, _probe_terms(fx), partial_per_call))[0], tier


def test_samples_in_physical_order_are_red_on_the_probe() -> None:
    """A kernel that walks a call's samples in the order they sit, not by id (the permuted layout moves them)."""
    reds = []
    for tier in TIERS:
        fx = build_fixture(MANIFEST, tier)
        reds.append(bool(_red(_wgrad_per_layout(fx, _probe_terms(fx), correct, physical=True)).any()))
    assert any(reds[: len(CI_TIERS)]), reds


def test_ordinary_tokens_leave_some_elements_order_blind() -> None:
    """Negative control: on the old fixture's random tokens, a call-partial kernel leaves many dW elements with
    the correct bits in every layout; which elements change is the luck of the draws, so the probe element
    decides by construction instead."""
    fx = build_fixture(MANIFEST, "short")
    keys = list(fx.logical_keys)
    x = logical_tensor(fx.case_id, "det_gemm.x", keys, 64, torch.float32).numpy()
    up = logical_tensor(fx.case_id, "det_gemm.upstream", keys, 64, torch.float32).numpy()
    up = up * fx.active.numpy()[:, None].astype(np.float32)
    terms = (up[:, :, None] * x[:, None, :]).reshape(len(keys), -1).T.astype(np.float32)  # [n*k, T]
    blind = ~_red(_wgrad_per_layout(fx, terms, partial_per_call))
    assert blind.sum() > 0, "every element changed: the control shows nothing"
    assert _red(_wgrad_per_layout(fx, _probe_terms(fx), partial_per_call))[0]


def test_the_wgrad_probe_survivor_stays_far_below_every_accuracy_threshold() -> None:
    fx = build_fixture(MANIFEST, "primary")
    terms = _probe_terms(fx)
    exact = terms.astype(np.float64).sum(axis=1)
    for kernel in (correct, *WGRAD_FAULTS):
        for value in _wgrad_per_layout(fx, terms, kernel):
            assert (np.abs(value.astype(np.float64) - exact) <= ORDER_PROBE_TINY).all()


# --- attention's sum over values --------------------------------------------------------------------------

#: The orders a correct attention kernel uses: ascending key blocks of its size (chunks chained inside).
PV_CORRECT = tuple(blocked(b) for b in (16, 32, 64, PV_MAX_KEY_BLOCK)) + (sequential,)
#: Faults: split-KV into parts (at any key, or at key-block edges), blocks walked backwards, trees.
PV_FAULTS = (
    *ALTERNATIVES,
    blocked(PV_MAX_KEY_BLOCK, reverse=True),
)


def _pv_fixture() -> Fixture:
    return build_fixture(MANIFEST, "long")


def _value_column(fx: Fixture, sid: int) -> np.ndarray:
    keys = list(fx.logical_keys)
    kinds = fx.hard_rows.get("attention.v", ())
    v = logical_tensor(fx.case_id, "attention.v", keys, (2, 128), torch.float32, hard_rows=kinds)
    v = apply_edit(v, keys, fx.token_edits.get("attention.v"))
    rows = [r for r, k in enumerate(keys) if k[0] == sid]
    return v[rows, :, PROBE_COLUMN].numpy()  # [length, heads]


def _out_bits(num: np.ndarray, n: int) -> np.ndarray:
    """bf16 bits of the attention output `num / n` (p = 1 on every key, so the denominator is n)."""
    out = torch.from_numpy((num / np.float32(n)).astype(np.float32)).to(torch.bfloat16)
    return out.view(torch.int16).numpy()


def test_the_pv_probe_is_what_the_docs_say() -> None:
    fx = _pv_fixture()
    probes = pv_probes(fx.samples)
    assert probes, "the long tier holds a sample long enough"
    keys = list(fx.logical_keys)
    q = logical_tensor(fx.case_id, "attention.q", keys, (4, 128), torch.float32)
    q = apply_edit(q, keys, fx.token_edits.get("attention.q"))
    for p in probes:
        col = _value_column(fx, p.sample_id)
        nz = {int(j) for j in np.nonzero(col[:, 0])[0]}
        assert nz == {PV_TINY_KEY, PV_PLUS_KEY, PV_MINUS_KEY}
        assert PV_PLUS_KEY // PV_MAX_KEY_BLOCK < PV_MINUS_KEY // PV_MAX_KEY_BLOCK
        for i in p.queries:
            assert not bool(q[fx.offsets[p.sample_id] + i].any()), "a probe query is a zero row: p = 1"


def _probe_windows() -> list[tuple[int, np.ndarray]]:
    """(query position i, value column 0 over its window of keys 0..i as a [heads, i + 1] array), every probe
    query of the long tier."""
    fx = _pv_fixture()
    out = []
    for p in pv_probes(fx.samples):
        col = _value_column(fx, p.sample_id)
        out += [(i, np.ascontiguousarray(col[: i + 1].T)) for i in p.queries]
    assert out
    return out


@pytest.mark.parametrize("order", PV_CORRECT, ids=lambda o: o.__name__)
def test_every_correct_key_order_gives_zero_on_the_probe(order: Callable[[np.ndarray], np.ndarray]) -> None:
    for i, terms in _probe_windows():
        assert not order(terms).any(), (order.__name__, i)


@pytest.mark.parametrize("order", PV_FAULTS, ids=lambda o: o.__name__)
def test_every_faulty_key_order_changes_the_probe_output(order: Callable[[np.ndarray], np.ndarray]) -> None:
    for i, terms in _probe_windows():
        alt, seq = _out_bits(order(terms), i + 1), _out_bits(sequential(terms), i + 1)
        assert (alt != seq).all(), (order.__name__, i)


def test_ordinary_queries_let_a_key_split_through() -> None:
    """Negative control: for ordinary rows (random probabilities and values) a split of the keys in two often
    leaves the bf16 output unchanged: such rows decide only by chance."""
    gen = torch.Generator().manual_seed(5)
    n = 200
    p = torch.softmax(torch.randn(64, n, generator=gen), dim=-1).numpy().astype(np.float32)
    v = logical_tensor("probe", "v", [(0, j) for j in range(n)], (), torch.float32).numpy()
    same = 0
    for row in p:
        terms = (row * v).astype(np.float32)[None, :]
        same += int((_out_bits(split(2)(terms), 1) == _out_bits(sequential(terms), 1)).all())
    assert same > 0


def test_a_token_probe_with_a_missing_partner_is_refused(write_manifest) -> None:
    """dW's probe edits an input and its upstream together; one without the other is refused at load."""

    def edit(doc: dict) -> None:
        doc["fixtures"]["hard_cases"]["wgrad_order_tokens"]["inputs"].remove("det_gemm.upstream")

    with pytest.raises(WorkloadError, match="needs one input and its upstream"):
        load_manifest(write_manifest(edit))
    load_manifest(write_manifest(lambda doc: None))  # negative control: the shipped cases load


def test_a_tier_without_a_probe_place_is_reported_absent() -> None:
    """Negative control of the presence check: one sample cannot hold the wgrad probe; the check says so."""
    from ws1_workload.fixtures import make_fixture
    from ws1_workload.hardcase_checks import check_case

    fx = make_fixture(
        "probe",
        [40],
        [10],
        pad_id=0,
        token_id_limit=100,
        hard_rows=MANIFEST.hard_rows,
        token_cases=MANIFEST.token_cases,
    )
    finding = check_case(MANIFEST.hard_cases["wgrad_order_tokens"], MANIFEST, fx)
    assert not finding.present and "no sample after the first" in finding.detail
    pv = check_case(MANIFEST.hard_cases["pv_order_rows"], MANIFEST, fx)
    assert not pv.present
