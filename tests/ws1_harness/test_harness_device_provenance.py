"""The gate refuses evidence whose cells ran somewhere other than where the shard's provenance says.

A GPU session once reported "NVIDIA H200" while every cell had run on the host. Each cell now records the device
its tensors lived on (read from the candidate's outputs) and a GPU cell carries its arch in the profile label;
the gate checks both against the shard's provenance. One property per test, each with the edit that breaks it.
"""

from __future__ import annotations

import json
from pathlib import Path

from ws1_harness.verdict.evidence import cells_digest
from ws1_harness.verdict.gate import EXIT_BAD_INPUT, EXIT_PASS, device_contradictions, gate

CUDA_SM90 = {"type": "cuda", "name": "NVIDIA H200", "capability": "sm_90"}


def _doc(factory) -> tuple[dict, Path]:
    writer, _expected = factory.write("run")
    return json.loads(writer.path.read_text()), writer.path


def _relabel(doc: dict, label: str) -> None:
    """Rename the profile everywhere it appears (axes, cells, inventory): a consistent arch-labelled run."""
    old = doc["axes"]["profiles"][0]
    doc["axes"]["profiles"] = [label]
    for c in doc["cells"]:
        c["profile"] = label
    for i in doc.get("inventory", []):
        if i["profile"] == old:
            i["profile"] = label


def test_host_cells_under_host_provenance_pass(factory) -> None:
    doc, path = _doc(factory)
    assert doc["provenance"]["device"] == "cpu"
    assert device_contradictions(doc) == []
    assert gate(path).exit_code == EXIT_PASS


def test_host_cells_under_gpu_provenance_are_refused(factory) -> None:
    doc, _ = _doc(factory)
    doc["provenance"].update(device="cuda", device_name="NVIDIA H200", capability="sm_90")
    result = gate(doc, source="edited")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "ran on cpu but the shard's provenance names cuda" in result.lines[0]


def test_gpu_cells_under_host_provenance_are_refused(factory) -> None:
    doc, _ = _doc(factory)
    _relabel(doc, doc["axes"]["profiles"][0] + "@sm90")
    for c in doc["cells"]:
        c["device"] = dict(CUDA_SM90)
    doc["cells_digest"] = cells_digest(doc["cells"])  # as a consistent writer would record it
    result = gate(doc, source="edited")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "ran on cuda but the shard's provenance names cpu" in result.lines[0]


def test_consistent_gpu_run_passes_the_device_check(factory) -> None:
    doc, _ = _doc(factory)
    _relabel(doc, doc["axes"]["profiles"][0] + "@sm90")
    doc["provenance"].update(device="cuda", device_name="NVIDIA H200", capability="sm_90")
    for c in doc["cells"]:
        c["device"] = dict(CUDA_SM90)
    assert device_contradictions(doc) == []


def test_gpu_cell_without_arch_label_is_refused(factory) -> None:
    doc, _ = _doc(factory)
    doc["provenance"].update(device="cuda", capability="sm_90")
    for c in doc["cells"]:
        c["device"] = dict(CUDA_SM90)
    assert any("carries no arch label" in p for p in device_contradictions(doc))


def test_wrong_arch_label_is_refused(factory) -> None:
    doc, _ = _doc(factory)
    _relabel(doc, doc["axes"]["profiles"][0] + "@sm86")
    doc["provenance"].update(device="cuda", capability="sm_90")
    for c in doc["cells"]:
        c["device"] = dict(CUDA_SM90)
    assert any("labelled 'sm86' but ran on sm_90" in p for p in device_contradictions(doc))


def test_proxy_label_needs_a_declared_proxy(factory) -> None:
    doc, _ = _doc(factory)
    _relabel(doc, doc["axes"]["profiles"][0] + "@sm86-proxy")
    doc["provenance"].update(device="cuda", capability="sm_90", arch_proxy=None)
    for c in doc["cells"]:
        c["device"] = dict(CUDA_SM90)
    assert any("declares no arch proxy" in p for p in device_contradictions(doc))
    doc["provenance"]["arch_proxy"] = "sm86 code through the PTX JIT on an sm_90 device"
    doc["provenance"]["code_objects"] = [{"name": "ws1_silu_fwd", "binary_version": 90, "ptx_version": 86}]
    for c in doc["cells"]:
        c["observed_kernels"] = [k for k in c.get("observed_kernels") or [] if k.startswith("ws1.cuda.")]
    assert device_contradictions(doc) == []


def _proxy_doc(factory, code_objects):
    doc, _ = _doc(factory)
    _relabel(doc, doc["axes"]["profiles"][0] + "@sm86-proxy")
    doc["provenance"].update(
        device="cuda",
        capability="sm_90",
        arch_proxy="sm86 code through the PTX JIT on an sm_90 device",
        code_objects=code_objects,
    )
    for c in doc["cells"]:
        c["device"] = dict(CUDA_SM90)
        c["observed_kernels"] = ["ws1.cuda.silu.pointwise"]
    return doc


def test_a_proxy_shard_must_show_sm86_code_ran(factory) -> None:
    """The label and the declared proxy are words; the runtime's PTX versions are the proof."""
    doc = _proxy_doc(factory, [])
    assert any("records no code object" in p for p in device_contradictions(doc))
    doc["provenance"]["code_objects"] = [{"name": "ws1_silu_fwd", "binary_version": 90, "ptx_version": 90}]
    assert any("PTX 90, not sm86 code" in p for p in device_contradictions(doc))
    doc["provenance"]["code_objects"] = [{"name": "ws1_silu_fwd", "binary_version": 90, "ptx_version": 86}]
    assert device_contradictions(doc) == []


def test_a_proxy_cell_that_ran_triton_is_refused(factory) -> None:
    """Triton compiles for the device's own arch: a Triton shard labelled sm86-proxy would be untrue."""
    doc = _proxy_doc(factory, [{"name": "ws1_silu_fwd", "binary_version": 90, "ptx_version": 86}])
    doc["cells"][0]["observed_kernels"] = ["triton:ws1_silu_fwd"]
    assert any("ran Triton kernels" in p for p in device_contradictions(doc))


def test_a_proxy_cell_that_ran_stock_kernels_is_refused(factory) -> None:
    """torch's own kernels are built for the device's arch too: a native cell is no sm86 proxy either."""
    doc = _proxy_doc(factory, [{"name": "ws1_silu_fwd", "binary_version": 90, "ptx_version": 86}])
    doc["cells"][0]["observed_kernels"] = ["ws1.native.silu"]
    assert any(
        "other than the ws1 CUDA extension's (ws1.native.silu)" in p for p in device_contradictions(doc)
    )


def test_green_cell_without_device_is_refused(factory) -> None:
    doc, _ = _doc(factory)
    green = next(c for c in doc["cells"] if c["status"] == "green")
    green["device"] = None
    assert any("green but records no device" in p for p in device_contradictions(doc))


def _own_arch_doc(factory, code_objects, arch_proxy=None):
    doc, _ = _doc(factory)
    _relabel(doc, doc["axes"]["profiles"][0] + "@sm90")
    doc["provenance"].update(
        device="cuda", capability="sm_90", arch_proxy=arch_proxy, code_objects=code_objects
    )
    for c in doc["cells"]:
        c["device"] = dict(CUDA_SM90)
        c["observed_kernels"] = ["ws1.cuda.silu.pointwise"]
    return doc


def test_a_cell_of_the_devices_own_arch_that_ran_its_own_code_passes(factory) -> None:
    doc = _own_arch_doc(factory, [{"name": "ws1_silu_fwd", "binary_version": 90, "ptx_version": 90}])
    assert device_contradictions(doc) == []


def test_an_unlabelled_proxy_is_refused(factory) -> None:
    """sm86 PTX through the JIT, labelled sm90: the code objects give it away."""
    doc = _own_arch_doc(factory, [{"name": "ws1_silu_fwd", "binary_version": 90, "ptx_version": 86}])
    assert any("an unlabelled proxy run" in p for p in device_contradictions(doc))


def test_a_declared_proxy_under_the_devices_own_label_is_refused(factory) -> None:
    doc = _own_arch_doc(
        factory,
        [{"name": "ws1_silu_fwd", "binary_version": 90, "ptx_version": 90}],
        arch_proxy="sm86 code through the PTX JIT on an sm_90 device",
    )
    assert any("declares an arch proxy" in p for p in device_contradictions(doc))


def test_foreign_ptx_does_not_matter_when_the_cell_ran_no_extension_kernel(factory) -> None:
    """A Triton cell in a process that also loaded an sm86 build ran the device's own code."""
    doc = _own_arch_doc(factory, [{"name": "ws1_silu_fwd", "binary_version": 90, "ptx_version": 86}])
    for c in doc["cells"]:
        c["observed_kernels"] = ["triton:ws1_silu_fwd"]
    assert device_contradictions(doc) == []
