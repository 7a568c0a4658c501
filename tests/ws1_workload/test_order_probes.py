"""The order probes change bits under every change of summation order, by construction, on every host.

Each test computes the reduction of a probe row in explicit orders (`summation_orders`: one correctly rounded
fp32 add at a time, so no BLAS and no vectoriser decides anything) and checks that every alternative order
gives other bits than the sequential walk, at the tiny widths and at the full Qwen3-8B widths. The negative
controls run the same orders on the fixture's ordinary random rows and find rows on which an order change
leaves every bf16 output unchanged: those rows could not make a split-K candidate red, which is why the
probes exist.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from summation_orders import ALTERNATIVES, bits, sequential

from ws1_workload.inputs import (
    HARD_ROW_PERIOD,
    HARD_ROW_SLOT,
    ORDER_PROBE_LSE_PEAK,
    ORDER_PROBE_TINY,
    logical_tensor,
    order_probe_positions,
)

#: Axis lengths the dot probes meet: K of det_gemm (intermediate) and lm_head (hidden), N of their dx
#: (hidden, vocab), at the tiny widths and at full widths.
DOT_WIDTHS = (256, 512, 5000, 4096, 12288, 151936)
#: Vocab sizes the logsumexp probe meets (tiny, full).
LSE_WIDTHS = (5000, 151936)
#: The logp adapter's logit scale (ws1_harness.run.adapters).
LOGIT_SCALE = 4.0


def _probe_key(kind: str) -> tuple[int, int]:
    """A logical key whose row is of the probe's slot."""
    return (0, HARD_ROW_SLOT[kind] % HARD_ROW_PERIOD)


def _dot_probe_row(width: int) -> np.ndarray:
    row = logical_tensor(
        "probe", "x", [_probe_key("dot_order_rows")], width, torch.float32, ("dot_order_rows",)
    )
    return row[0].numpy()


def _weights(n: int) -> np.ndarray:
    """bf16 weight values as the adapters draw them (scaled normals), plus the edge magnitudes."""
    gen = torch.Generator().manual_seed(7)
    w = (torch.randn(n, generator=gen) * 2.0**-6).to(torch.bfloat16).float()
    edge = torch.tensor([1.0, -1.0, 2.0**-20, -(2.0**20), 3.0]).to(torch.bfloat16).float()
    return torch.cat([w, edge]).numpy()


def _dot_terms(row: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Products of the probe row with weight columns equal at the probe positions (exact in fp32)."""
    tiny, plus, minus = order_probe_positions(row.shape[0])
    terms = np.zeros((c.shape[0], row.shape[0]), dtype=np.float32)
    for k in (tiny, plus, minus):
        terms[:, k] = row[k] * c
    return terms


def test_dot_probe_row_is_what_the_docs_say() -> None:
    row = _dot_probe_row(256)
    tiny, plus, minus = order_probe_positions(256)
    assert (row[tiny], row[plus], row[minus]) == (ORDER_PROBE_TINY, 1.0, -1.0)
    assert np.count_nonzero(row) == 3
    assert plus // 16 != minus // 16  # never one MMA instruction's K chunk


@pytest.mark.parametrize("width", DOT_WIDTHS)
def test_every_alternative_order_changes_the_dot_probe_bits(width: int) -> None:
    c = _weights(48)
    terms = _dot_terms(_dot_probe_row(width), c)
    seq = sequential(terms)
    assert not seq.any(), "the sequential walk adds the survivor to +c first and loses it"
    for order in ALTERNATIVES:
        alt = order(terms)
        assert (bits(alt) != bits(seq)).all(), order.__name__
        # and the bf16 outputs differ too (the survivor is a normal bf16 number)
        alt16 = torch.from_numpy(alt).to(torch.bfloat16).view(torch.int16)
        seq16 = torch.from_numpy(seq).to(torch.bfloat16).view(torch.int16)
        assert (alt16 != seq16).all(), order.__name__


def test_dot_probe_survivor_stays_far_below_every_accuracy_threshold() -> None:
    """Whatever the order, a probe output is within 2^-30 |c| of the exact value: the accuracy judgment is
    unchanged on these rows."""
    c = _weights(48)
    terms = _dot_terms(_dot_probe_row(4096), c)
    exact = terms.astype(np.float64).sum(axis=1)
    for order in (sequential, *ALTERNATIVES):
        err = np.abs(order(terms).astype(np.float64) - exact)
        assert (err <= ORDER_PROBE_TINY * np.abs(c) * 1.0001).all(), order.__name__
    drawn = c[:48]  # the adapters' weights: normals scaled by 2^-4 or less, far below 1 in magnitude
    assert float(np.abs(drawn).max()) * ORDER_PROBE_TINY < 1e-9


def test_ordinary_rows_let_an_order_change_through() -> None:
    """Negative control: on the random rows of the old fixture an order change often leaves the bf16 output of
    a whole row unchanged, so nothing made a split-K candidate red there."""
    k, n = 512, 256  # det_gemm at the tiny widths
    keys = [(0, p) for p in range(12)]
    x = logical_tensor("probe", "x", keys, k, torch.float32).numpy()
    gen = torch.Generator().manual_seed(11)
    w = (torch.randn(n, k, generator=gen) * 2.0**-4).to(torch.bfloat16).float().numpy()
    unchanged = []
    for order in ALTERNATIVES:
        for r in range(x.shape[0]):
            terms = (x[r][None, :] * w).astype(np.float32)
            a = torch.from_numpy(order(terms)).to(torch.bfloat16).view(torch.int16)
            s = torch.from_numpy(sequential(terms)).to(torch.bfloat16).view(torch.int16)
            unchanged.append(bool((a == s).all()))
    assert sum(unchanged) > len(unchanged) // 2, "random rows caught most order changes: the control is moot"


def _lse_probe_row(width: int) -> np.ndarray:
    key = _probe_key("lse_order_rows")
    row = logical_tensor("probe", "logits", [key], width, torch.float32, ("lse_order_rows",))
    return row[0].numpy() * np.float32(LOGIT_SCALE)


def _exp_terms(logits: np.ndarray) -> np.ndarray:
    m = logits.max()
    return np.exp((logits - m).astype(np.float32)).astype(np.float32)[None, :]


def _lse(logits: np.ndarray, s: np.ndarray) -> np.ndarray:
    return (np.float32(logits.max()) + np.log(s).astype(np.float32)).astype(np.float32)


def test_lse_probe_row_is_what_the_docs_say() -> None:
    row = _lse_probe_row(5000)
    assert row[0] == ORDER_PROBE_LSE_PEAK * LOGIT_SCALE and np.count_nonzero(row) == 1
    tail = np.exp(np.float32(-ORDER_PROBE_LSE_PEAK * LOGIT_SCALE))
    assert tail < np.spacing(np.float32(1.0)) / 2, "every exp(x - m) below half an ulp of 1"


@pytest.mark.parametrize("width", LSE_WIDTHS)
def test_every_alternative_order_changes_the_logsumexp_bits(width: int) -> None:
    row = _lse_probe_row(width)
    terms = _exp_terms(row)
    seq = sequential(terms)
    assert seq[0] == 1.0, "the sequential walk from the maximum loses every tail term"
    for order in ALTERNATIVES:
        s = order(terms)
        assert (bits(s) != bits(seq)).all(), order.__name__
        assert (bits(_lse(row, s)) != bits(_lse(row, seq))).all(), order.__name__


def test_ordinary_logit_rows_let_an_order_change_through() -> None:
    """Negative control: on random logit rows some order changes leave the fp32 logsumexp unchanged."""
    keys = [(0, p) for p in range(8)]
    rows = logical_tensor("probe", "logits", keys, 5000, torch.float32).numpy() * np.float32(LOGIT_SCALE)
    same = 0
    for r in rows:
        terms = _exp_terms(r)
        seq = _lse(r, sequential(terms))
        same += sum(int((bits(_lse(r, order(terms))) == bits(seq)).all()) for order in ALTERNATIVES)
    assert same > 0


def test_two_probe_kinds_on_one_input_are_refused(write_manifest) -> None:
    """Both probe kinds take slot 4 of a row: the second would never be generated, so the manifest is refused."""
    from ws1_workload import WorkloadError, load_manifest

    def edit(doc: dict) -> None:
        doc["fixtures"]["hard_cases"]["lse_order_rows"]["inputs"].append("det_gemm.x")

    with pytest.raises(WorkloadError, match="already holds dot_order_rows"):
        load_manifest(write_manifest(edit))
    load_manifest(write_manifest(lambda doc: None))  # negative control: the shipped cases load
