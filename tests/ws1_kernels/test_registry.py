"""Registry (fail-closed resolve, plug-ins), launch log and declared aten ops."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from kernels_support import INFERENCE, OP_CLASS, TRAINING, Batch, layout, make_case, run
from torch.utils._python_dispatch import TorchDispatchMode

from ws1_kernels import Candidate, CandidateUnavailable, RegistryError, launches, registry

DIMS = dict(hidden=64, vocab=300, inter=48, heads=4, kv_heads=2, head_dim=32)
BATCH = Batch((5, 9, 3), (2, 4, 1))


def test_builtin_profiles_resolve_with_ids() -> None:
    for profile in ("portable_cpu", "native_torch"):
        for op in OP_CLASS:
            c = registry.resolve(profile, op, "cpu")
            assert c.candidate_id == f"{profile}.{op}" and c.min_arch is None
            assert c.kernel_id.startswith("ws1.cpu." if profile == "portable_cpu" else "ws1.native.")
            assert all(o.startswith("aten.") for o in c.declared_ops)
    assert registry.resolve("portable_cpu", "lm_head").param_grad_rule == "sample_blocks_main_grad"
    assert registry.resolve("native_torch", "lm_head").param_grad_rule == "autograd_accumulate"
    assert registry.resolve("portable_cpu", "silu").param_grad_rule is None


@pytest.mark.parametrize(
    ("profile", "reason"),
    [
        ("triton_cuda_bf16", "runs on cuda, asked for cpu"),
        ("cuda_bf16", "no candidate registered yet"),
        ("cuda_bf16_sm90", "needs CUDA sm90"),
    ],
)
def test_declared_gpu_profiles_fail_closed(profile: str, reason: str) -> None:
    with pytest.raises(CandidateUnavailable) as info:
        registry.resolve(profile, "det_gemm", "cpu")
    assert reason in str(info.value) and info.value.rejections[0][0] == f"{profile}.det_gemm"
    assert "\n" not in str(info.value)
    # a candidate that exists for another device is pending hardware (pending_arch), never a red gap
    assert info.value.hardware_only == (profile == "triton_cuda_bf16")


def test_unknown_names_and_layout_only() -> None:
    with pytest.raises(RegistryError, match="unknown profile"):
        registry.resolve("nope", "det_gemm")
    with pytest.raises(RegistryError, match="unknown operator"):
        registry.resolve("portable_cpu", "conv2d")
    with pytest.raises(CandidateUnavailable, match="layout_only"):
        registry.resolve("portable_cpu", "pack")
    with pytest.raises(CandidateUnavailable, match="runs on cpu"):
        registry.resolve("portable_cpu", "det_gemm", "cuda")


def _plugin_candidates(name: str, *, arch: str | None = None, device: str = "cpu", why: str | None = None):
    base = registry.resolve("portable_cpu", "silu")
    return [
        Candidate(
            profile=name,
            operator="silu",
            kernel_id=f"ws1.test.{name}.silu",
            device=device,
            min_arch=arch,
            param_grad_rule=None,
            declared_ops=base.declared_ops,
            fn=base.fn,
            available=lambda dev: why,
        )
    ]


def test_unavailable_candidate_lists_reasons() -> None:
    registry.register_profile(
        "plug_gpu", _plugin_candidates("plug_gpu", arch="sm90", device="cuda"), replace=True
    )
    with pytest.raises(CandidateUnavailable) as info:
        registry.resolve("plug_gpu", "silu", "cpu")
    assert info.value.rejections == (("plug_gpu.silu", "runs on cuda, asked for cpu"),)
    registry.register_profile(
        "plug_off", _plugin_candidates("plug_off", why="library libfoo missing"), replace=True
    )
    with pytest.raises(CandidateUnavailable, match="libfoo missing"):
        registry.resolve("plug_off", "silu", "cpu")
    with pytest.raises(CandidateUnavailable, match="no candidate registered for this operator"):
        registry.resolve("plug_off", "rms_norm", "cpu")


def test_plugin_profile_via_register_spec_and_entry_point(monkeypatch) -> None:
    mod = types.ModuleType("ws1_test_plugin")
    mod.PROFILE = ("plug_spec", _plugin_candidates("plug_spec"))
    mod.make = lambda: {"name": "plug_ep", "candidates": _plugin_candidates("plug_ep")}
    monkeypatch.setitem(sys.modules, "ws1_test_plugin", mod)
    assert registry.load_spec("ws1_test_plugin:PROFILE") == "plug_spec"
    cand = registry.resolve("plug_spec", "silu")
    assert cand.kernel_id == "ws1.test.plug_spec.silu" and "plug_spec" in registry.profiles()

    class EP:
        name, value = "plug_ep", "ws1_test_plugin:make"

        def load(self):
            return mod.make

    monkeypatch.setattr(
        registry.metadata, "entry_points", lambda group: [EP()] if group == "ws1.candidates" else []
    )
    assert registry.load_entry_points() == ("plug_ep",)
    assert registry.resolve("plug_ep", "silu").candidate_id == "plug_ep.silu"
    with pytest.raises(RegistryError, match="module:attr"):
        registry.load_spec("no_colon")
    with pytest.raises(RegistryError, match="cannot load"):
        registry.load_spec("ws1_test_plugin:missing")
    with pytest.raises(RegistryError, match="already registered"):
        registry.register_profile("portable_cpu", _plugin_candidates("portable_cpu"))


def test_candidate_fields_are_validated() -> None:
    with pytest.raises(RegistryError, match="param_grad_rule"):
        Candidate(
            profile="x",
            operator="det_gemm",
            kernel_id="k",
            device="cpu",
            min_arch=None,
            param_grad_rule=None,
            declared_ops=frozenset({"aten.mm"}),
            fn=lambda: None,
        )
    with pytest.raises(RegistryError, match="device"):
        Candidate(
            profile="x",
            operator="silu",
            kernel_id="k",
            device="tpu",
            min_arch=None,
            param_grad_rule=None,
            declared_ops=frozenset({"aten.mm"}),
            fn=lambda: None,
        )


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("profile", ["portable_cpu", "native_torch"])
@pytest.mark.parametrize("op", sorted(OP_CLASS))
def test_launch_log_and_declared_ops(profile: str, op: str) -> None:
    """Kernel ids are recorded at the launch site (fwd and bwd); every dispatched aten op is declared."""
    cand = registry.resolve(profile, op)
    case = make_case(op, BATCH, DIMS)
    for lay in ("packed", "padded_left", "decode"):
        mode = _Ops()
        with launches.observe() as log:
            run(
                cand.fn,
                case,
                BATCH,
                layout(BATCH, lay),
                rule=cand.param_grad_rule,
                backward=lay in TRAINING,
                around=lambda m=mode: m,
            )
        phases = {phase for _, phase in log.events}
        assert log.kernel_ids() == {cand.kernel_id}
        assert phases == ({"fwd", "bwd"} if lay in TRAINING else {"fwd"})
        assert mode.ops <= cand.declared_ops, f"undeclared: {sorted(mode.ops - cand.declared_ops)}"
    assert "decode" in INFERENCE


def test_observe_nests_and_stops() -> None:
    x = torch.randn(3, 8).bfloat16()
    from kernels_support import context

    ctx = context(layout(Batch((3,), (1,)), "packed")[0])
    fn = registry.resolve("portable_cpu", "silu").fn
    with launches.observe() as outer:
        fn(x, ctx)
        with launches.observe() as inner:
            fn(x, ctx)
    fn(x, ctx)
    assert len(outer.kernels) == 2 and len(inner.kernels) == 1
