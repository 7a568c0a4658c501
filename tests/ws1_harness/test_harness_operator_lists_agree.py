"""Operator names are written down in one table, the manifest's ``operators``; every other list either derives
from it or is checked against it here.

The kernels package may not import the workload (dependencies point one way: kernels depend on torch alone), so
``registry.OPERATORS`` is a copy of the manifest's chain nodes, checked here. The lists that cannot derive from
the registry without breaking that direction or the harness's torch-free verdict side are checked against
``registry.OPERATORS`` (minus the layout-only ``pack``):

- ``registry._PORTABLE_FNS`` (each operator's portable function and kernel id), ``reference.__all__`` (a static
  export list), ``_declared.PORTABLE_OPS`` / ``NATIVE_OPS`` (recorded aten ops), ``triton_ops.MODULES`` (the
  module of each Triton operator): one entry per operator;
- ``registry.PARAM_OPERATORS``: exactly the operators whose harness adapter has a parameter;
- ``integrations.qwen3.CHAIN_OPERATORS``: the drop-in's call order, a subset by design;
- ``ws1_harness.run.adapters.build_adapters``: one adapter per operator;
- ``bench.shapes.BENCH_OPS``, ``bench.shapes.op_shapes`` and ``bench.cases.CASES`` (report order, plus modes such as ``attention_decode``;
  the bench report side imports no torch), ``bench.targets.GEMM_OPS`` / ``MEMORY_BOUND``: subsets by design.

``registry``'s native profile derives its operators from ``registry.OPERATORS`` and needs no check.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from ws1_harness.run.adapters import build_adapters
from ws1_harness.run.bench import cases as bench_cases
from ws1_harness.run.bench import shapes as bench_shapes
from ws1_harness.run.bench import targets as bench_targets
from ws1_kernels import _declared, reference, registry, triton_ops
from ws1_kernels.integrations import qwen3
from ws1_workload import CHAIN_NODES, load_manifest

CANDIDATE_OPS = frozenset(registry.OPERATORS) - registry.LAYOUT_ONLY


def _differs(name: str, listed: Iterable[str], expected: Iterable[str], *, subset: bool = False) -> list[str]:
    """One line per disagreement of a list with the operator table: names missing from it, names it invents."""
    got, want = set(listed), set(expected)
    out = [f"{name}: unknown operator {op!r}" for op in sorted(got - want)]
    if not subset:
        out += [f"{name}: missing operator {op!r}" for op in sorted(want - got)]
    return out


def test_kernel_operator_list_matches_the_manifest() -> None:
    manifest = load_manifest()
    assert tuple(registry.OPERATORS) == tuple(CHAIN_NODES)
    assert set(manifest.operators) == set(registry.OPERATORS)
    layout_only = {name for name, spec in manifest.operators.items() if spec.layout_only}
    assert layout_only == set(registry.LAYOUT_ONLY)


def _every_operator_list() -> list[str]:
    """Every disagreement of a derived operator list with ``registry.OPERATORS``."""
    model = load_manifest().model("tiny")
    adapters = build_adapters(model)
    with_params = {op for op, adapter in adapters.items() if adapter.params}
    bench_ops = {bench_shapes.operator_of(op) for op in bench_shapes.BENCH_OPS}
    return [
        *_differs("registry._PORTABLE_FNS", registry._PORTABLE_FNS, CANDIDATE_OPS),
        *_differs("reference.__all__", set(reference.__all__) - {"fp32_math"}, CANDIDATE_OPS),
        *_differs("_declared.PORTABLE_OPS", _declared.PORTABLE_OPS, CANDIDATE_OPS),
        *_differs("_declared.NATIVE_OPS", _declared.NATIVE_OPS, CANDIDATE_OPS),
        *_differs("triton_ops.MODULES", triton_ops.MODULES, CANDIDATE_OPS),
        *_differs("registry.PARAM_OPERATORS", registry.PARAM_OPERATORS, with_params),
        *_differs("qwen3.CHAIN_OPERATORS", qwen3.CHAIN_OPERATORS, CANDIDATE_OPS, subset=True),
        *_differs("adapters.build_adapters", adapters, CANDIDATE_OPS),
        *_differs("bench.shapes.BENCH_OPS", bench_ops, CANDIDATE_OPS),
        *_differs("bench.cases.CASES", bench_cases.CASES, bench_shapes.BENCH_OPS),
        *_differs("bench.shapes.op_shapes", bench_shapes.op_shapes(model), bench_shapes.BENCH_OPS),
        *_differs("bench.targets.GEMM_OPS", bench_targets.GEMM_OPS, bench_shapes.BENCH_OPS, subset=True),
        *_differs(
            "bench.targets.MEMORY_BOUND", bench_targets.MEMORY_BOUND, bench_shapes.BENCH_OPS, subset=True
        ),
    ]


def test_every_operator_list_agrees_with_the_operator_table() -> None:
    assert _every_operator_list() == []


def test_every_reference_export_is_callable() -> None:
    """``reference.__all__`` names functions that exist (a stale name would pass the set check above)."""
    assert all(callable(getattr(reference, name)) for name in reference.__all__)


@pytest.mark.parametrize(
    ("listed", "subset", "expected"),
    [
        (CANDIDATE_OPS - {"rope"}, False, ["adapters: missing operator 'rope'"]),
        (CANDIDATE_OPS | {"conv2d"}, False, ["adapters: unknown operator 'conv2d'"]),
        ({"det_gemm", "conv2d"}, True, ["adapters: unknown operator 'conv2d'"]),
    ],
)
def test_a_list_that_drifts_from_the_operator_table_is_caught(
    listed: set[str], subset: bool, expected: list[str]
) -> None:
    assert _differs("adapters", listed, CANDIDATE_OPS, subset=subset) == expected


def test_a_real_list_that_drifts_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole check, not just the helper: drop one operator from the bench list and see it reported."""
    monkeypatch.setattr(bench_shapes, "BENCH_OPS", tuple(op for op in bench_shapes.BENCH_OPS if op != "silu"))
    assert "bench.shapes.BENCH_OPS: missing operator 'silu'" in _every_operator_list()


def _disagreements(manifest_profiles, profiles) -> list[str]:
    """(profile, operator) pairs whose manifest node names another candidate or kernel id than the registry's."""
    out = []
    for name in profiles:
        spec = manifest_profiles.get(name)
        if spec is None:
            continue
        for op, cand in registry.candidates(name).items():
            node = spec.nodes.get(op)
            if node is None or (node.candidate_id, node.kernel_id) != (cand.candidate_id, cand.kernel_id):
                out.append(f"{name}.{op}")
    return out


def test_manifest_profile_tables_name_the_registry_kernel_ids() -> None:
    """The registry's candidate is what runs; the manifest's profile table must name the same kernel id."""
    manifest = load_manifest()
    assert _disagreements(manifest.profiles, registry.profiles()) == []
    assert registry.candidates("triton_cuda_bf16"), "the Triton profile registers its candidates"


def test_a_drifted_manifest_kernel_id_is_caught() -> None:
    from dataclasses import replace

    manifest = load_manifest()
    spec = manifest.profiles["portable_cpu"]
    drifted = {
        **spec.nodes,
        "det_gemm": replace(spec.nodes["det_gemm"], kernel_id="ws1.cpu.det_gemm.rowblock16"),
    }
    profiles = {**manifest.profiles, "portable_cpu": replace(spec, nodes=drifted)}
    assert _disagreements(profiles, ["portable_cpu"]) == ["portable_cpu.det_gemm"]
