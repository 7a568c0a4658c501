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
