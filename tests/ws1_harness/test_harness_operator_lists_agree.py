"""The kernels package may not import the workload (dependencies point one way), so it keeps its own list of
chain nodes; the manifest is the source of truth and this test keeps the two equal."""

from __future__ import annotations

from ws1_kernels import registry
from ws1_workload import CHAIN_NODES, load_manifest


def test_kernel_operator_list_matches_the_manifest() -> None:
    manifest = load_manifest()
    assert tuple(registry.OPERATORS) == tuple(CHAIN_NODES)
    assert set(manifest.operators) == set(registry.OPERATORS)
    layout_only = {name for name, spec in manifest.operators.items() if spec.layout_only}
    assert layout_only == set(registry.LAYOUT_ONLY)
