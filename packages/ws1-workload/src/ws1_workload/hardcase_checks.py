"""Whether each hard case of the manifest is present in the fixtures: one check per case name.

Split from `hardcases` (which parses the cases and is imported by the manifest) because a check builds fixtures
and layouts, which import the manifest: keeping the checks here leaves the workload's import graph without a
cycle. The tests call `check_hard_cases` for every tier and model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .fixtures import Fixture, build_fixture
from .hardcases import HardCaseSpec
from .inputs import (
    LARGE_ROW_SCALE,
    ORDER_PROBE_LSE_PEAK,
    ORDER_PROBE_TINY,
    hard_row_kind,
    logical_tensor,
    order_probe_positions,
)
from .layouts import build_layout
from .manifest import Manifest
from .token_probes import PROBE_COLUMN, TOKEN_CASES, apply_edit, pv_probes, wgrad_probes_for

#: Width of the rows the presence check draws (the kind of a row does not depend on its width).
CHECK_ROW_WIDTH = 256


@dataclass(frozen=True)
class Finding:
    """Whether one case is present in one tier (`tier` is "all" for a check across tiers), and where."""

    case: str
    tier: str
    present: bool
    detail: str


def _completions(fx: Fixture) -> list[list[int]]:
    return [s.token_ids[s.prompt_len :].tolist() for s in fx.samples]


def _check_ids(case: str, fx: Fixture) -> Finding:
    comp = _completions(fx)
    if case == "repeated_id_within_sample":
        for sid, ids in enumerate(comp):
            seen = {i for i in ids if ids.count(i) > 1}
            if seen:
                return Finding(case, fx.tier, True, f"sample {sid}: id {min(seen)} repeats")
        return Finding(case, fx.tier, False, "no completion id repeats inside a sample")
    if case == "repeated_id_across_samples":
        for i, a in enumerate(comp):
            for j in range(i + 1, len(comp)):
                common = set(a) & set(comp[j])
                if common:
                    return Finding(case, fx.tier, True, f"samples {i} and {j} share id {min(common)}")
        return Finding(case, fx.tier, False, "no completion id occurs in two samples")
    target = 0 if case == "id_zero" else fx.vocab - 1
    for sid, ids in enumerate(comp):
        if target in ids:
            return Finding(case, fx.tier, True, f"sample {sid} has id {target} as a completion token")
    return Finding(case, fx.tier, False, f"no completion token has id {target}")


def _check_layouts(case: str, spec: HardCaseSpec, manifest: Manifest, fx: Fixture) -> Finding:
    if case == "single_row_call":
        for ls in manifest.layouts:
            for call in build_layout(fx, ls).calls:
                if call.num_rows == 1:
                    return Finding(case, fx.tier, True, f"layout {ls.name} call {call.index} has one row")
        return Finding(case, fx.tier, False, "no physical call of one row")
    if case == "padded_layouts_pad":
        padded = [ls for ls in manifest.layouts if ls.type == "padded"]
        if not padded:
            return Finding(case, fx.tier, False, "the manifest has no padded layout")
        for ls in padded:
            pads = sum(int(c.is_pad.sum()) for c in build_layout(fx, ls).calls)
            if pads == 0:
                return Finding(case, fx.tier, False, f"layout {ls.name} holds no pad row")
        return Finding(case, fx.tier, True, f"every padded layout ({len(padded)}) holds pad rows")
    # decode_crosses_key_block
    if not any(ls.type == "decode" for ls in manifest.layouts):
        return Finding(case, fx.tier, False, "the manifest has no decode layout")
    for b in spec.blocks:
        hits = [s.sample_id for s in fx.samples if s.prompt_len <= b - 1 and s.length >= b + 1]
        if not hits:
            return Finding(case, fx.tier, False, f"no sample decodes positions {b - 1} and {b}")
    return Finding(case, fx.tier, True, f"decode crosses blocks {list(spec.blocks)}")


def _check_rows(case: str, spec: HardCaseSpec, manifest: Manifest, fx: Fixture) -> Finding:
    keys = list(fx.logical_keys)
    active = fx.active.tolist()
    eps = min(manifest.model(m).rms_eps for m in manifest.models)
    for item in spec.inputs:
        kinds = fx.hard_rows.get(item, ())
        rows = logical_tensor(fx.case_id, item, keys, CHECK_ROW_WIDTH, torch.float32, hard_rows=kinds)
        found = False
        for r, key in enumerate(keys):
            if not active[r] or hard_row_kind(key, kinds) != case:
                continue
            row = rows[r]
            if case == "signed_zero_rows":
                negative = torch.signbit(row)
                found = bool((row == 0).all()) and bool(negative.any()) and not bool(negative.all())
            elif case == "tiny_norm_rows":
                ms = float(row.double().pow(2).mean())
                found = eps / 4 <= ms <= eps * 4
            elif case == "dot_order_rows":
                want = torch.zeros_like(row)
                tiny, plus, minus = order_probe_positions(row.shape[-1])
                want[tiny], want[plus], want[minus] = ORDER_PROBE_TINY, 1.0, -1.0
                found = torch.equal(row, want)
            elif case == "lse_order_rows":
                want = torch.zeros_like(row)
                want[0] = ORDER_PROBE_LSE_PEAK
                found = torch.equal(row, want)
            else:
                found = bool(torch.isfinite(row).all()) and float(row.abs().max()) >= LARGE_ROW_SCALE
            if found:
                break
        if not found:
            return Finding(case, fx.tier, False, f"input {item} holds no active {case} row")
    return Finding(case, fx.tier, True, f"inputs {list(spec.inputs)} hold active rows")


def _probe_tensor(fx: Fixture, item: str) -> torch.Tensor:
    """The input as the harness builds it: generated rows, then the token probes' edit."""
    keys = list(fx.logical_keys)
    kinds = fx.hard_rows.get(item, ())
    rows = logical_tensor(fx.case_id, item, keys, CHECK_ROW_WIDTH, torch.float32, hard_rows=kinds)
    return apply_edit(rows, keys, fx.token_edits.get(item))


def _check_tokens(case: str, spec: HardCaseSpec, fx: Fixture) -> Finding:
    """The probe tokens exist, are active and placed as `token_probes` says, and each input holds its edit."""
    active = dict(zip(fx.logical_keys, fx.active.tolist(), strict=True))
    row_of = {key: r for r, key in enumerate(fx.logical_keys)}
    if case == "wgrad_order_tokens":
        wprobes = wgrad_probes_for(fx.samples, spec.inputs, fx.hard_rows)
        if not wprobes:
            return Finding(
                case, fx.tier, False, "no sample after the first has active tokens in two 16-token blocks"
            )
        for probe in wprobes:
            tokens = (probe.tiny, probe.plus, probe.minus)
            earlier = probe.tiny[0] < probe.plus[0] if probe.tiny_first else probe.tiny[0] > probe.plus[0]
            placed = (
                all(active[t] for t in tokens)
                and earlier
                and probe.plus[0] == probe.minus[0]
                and probe.plus[1] // 16 < probe.minus[1] // 16
            )
            if not placed:
                return Finding(case, fx.tier, False, f"probe tokens {tokens} are misplaced")
            for item in spec.inputs:
                col = _probe_tensor(fx, item)[:, probe.column]
                got = tuple(float(col[row_of[t]]) for t in tokens)
                if item.endswith(".upstream"):
                    ok = got == (ORDER_PROBE_TINY, 1.0, -1.0)
                else:
                    ok = got == (1.0, 1.0, 1.0) and int((col != 0).sum()) == 3
                if not ok:
                    return Finding(case, fx.tier, False, f"input {item} does not hold the probe at {tokens}")
        where = [(p.tiny, p.plus, p.minus) for p in wprobes]
        return Finding(case, fx.tier, True, f"tokens {where} probe dW in {list(spec.inputs)}")
    probes = pv_probes(fx.samples)
    if not probes:
        return Finding(case, fx.tier, False, "no sample is long enough for a probe query")
    q = _probe_tensor(fx, next(i for i in spec.inputs if i.endswith(".q")))
    v = _probe_tensor(fx, next(i for i in spec.inputs if i.endswith(".v")))
    for p in probes:
        qrows = [row_of[(p.sample_id, i)] for i in p.queries]
        if not all(active[(p.sample_id, i)] for i in p.queries) or bool(q[qrows].any()):
            return Finding(case, fx.tier, False, f"sample {p.sample_id}: the probe queries are not zero rows")
        col = v[[row_of[(p.sample_id, j)] for j in range(fx.samples[p.sample_id].length)], PROBE_COLUMN]
        nonzero = {int(j): float(col[j]) for j in torch.nonzero(col).flatten()}
        if nonzero != {1: ORDER_PROBE_TINY, 768: 1.0, 896: -1.0}:
            return Finding(case, fx.tier, False, f"sample {p.sample_id}: value column 0 is {nonzero}")
    return Finding(case, fx.tier, True, f"samples {[p.sample_id for p in probes]} hold zero queries")


def check_case(spec: HardCaseSpec, manifest: Manifest, fx: Fixture) -> Finding:
    """Whether `spec` is present in the fixture `fx` (one tier)."""
    case = spec.name
    if case in ("repeated_id_within_sample", "repeated_id_across_samples", "id_zero", "id_last"):
        return _check_ids(case, fx)
    if case == "block_edge_lengths":
        edges = {b + d for b in spec.blocks for d in (-1, 0, 1)}
        near = sorted({s.length for s in fx.samples} & edges)
        detail = f"lengths {near} sit at block edges" if near else "no sample length at a block edge"
        return Finding(case, fx.tier, bool(near), detail)
    if case in ("single_row_call", "padded_layouts_pad", "decode_crosses_key_block"):
        return _check_layouts(case, spec, manifest, fx)
    if case in TOKEN_CASES:
        return _check_tokens(case, spec, fx)
    return _check_rows(case, spec, manifest, fx)


def check_block_edge_coverage(spec: HardCaseSpec, manifest: Manifest) -> Finding:
    """Across the tiers the case lists, every b-1, b and b+1 of every block is a sample length."""
    lengths = {s.length for tier in spec.tiers for s in manifest.samples(tier)}
    missing = sorted({b + d for b in spec.blocks for d in (-1, 0, 1)} - lengths)
    detail = f"missing lengths {missing}" if missing else "every block edge is a sample length"
    return Finding(spec.name, "all", not missing, detail)


def check_hard_cases(manifest: Manifest, model: str | None = None) -> list[Finding]:
    """Every hard case of the manifest in every tier it lists (fixtures built for `model`)."""
    fixtures = {t: build_fixture(manifest, t, model) for t in manifest.tiers}
    findings = []
    for spec in manifest.hard_cases.values():
        for tier in spec.tiers:
            findings.append(check_case(spec, manifest, fixtures[tier]))
        if spec.name == "block_edge_lengths":
            findings.append(check_block_edge_coverage(spec, manifest))
    return findings
