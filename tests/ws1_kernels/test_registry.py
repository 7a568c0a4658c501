"""Registry (fail-closed resolve, plug-ins), launch log and declared aten ops."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from kernels_support import INFERENCE, OP_CLASS, TRAINING, Batch, layout, make_case, run
from profiles_support import (
    CANDIDATE_OPS,
    CANDIDATE_PROFILES,
    DECLARED_ONLY,
    PROFILES,
    resolve_or_skip,
    unrunnable,
)
from torch.utils._python_dispatch import TorchDispatchMode

from ws1_kernels import Candidate, CandidateUnavailable, RegistryError, launches, registry

DIMS = dict(hidden=64, vocab=300, inter=48, heads=4, kv_heads=2, head_dim=32)
BATCH = Batch((5, 9, 3), (2, 4, 1))


@pytest.mark.parametrize("profile", CANDIDATE_PROFILES)
def test_every_profile_registers_well_formed_candidates(profile: str) -> None:
    """One candidate per operator, named ``<profile>.<operator>``, aten ops declared, a weight rule iff a weight."""
    cands = registry.candidates(profile)
    assert set(cands) <= set(CANDIDATE_OPS) and cands
    for op, c in cands.items():
        assert c.candidate_id == f"{profile}.{op}"
        assert c.declared_ops and all(o.startswith("aten.") for o in c.declared_ops)
        assert (c.param_grad_rule is not None) == (op in registry.PARAM_OPERATORS)


def test_builtin_kernel_ids_and_rules() -> None:
    """The two CPU profiles' ids name their backend and their weight-gradient rules differ."""
    for profile, prefix in (("portable_cpu", "ws1.cpu."), ("native_torch", "ws1.native.")):
        for op in CANDIDATE_OPS:
            assert registry.resolve(profile, op, "cpu").kernel_id.startswith(prefix)
    assert registry.resolve("portable_cpu", "lm_head").param_grad_rule == "sample_blocks_main_grad"
    assert registry.resolve("native_torch", "lm_head").param_grad_rule == "autograd_accumulate"
    assert registry.resolve("portable_cpu", "silu").param_grad_rule is None


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_runs_here_or_is_refused_for_hardware(profile: str) -> None:
    """A kernel test skips a candidate only where the registry says hardware_only; every other profile must run.
    Profiles declared without any candidate fail closed by design (checked below with their reasons)."""
    if profile in DECLARED_ONLY:
        with pytest.raises(CandidateUnavailable, match="no candidate registered yet|needs CUDA"):
            registry.resolve(profile, "det_gemm", "cpu")
        return
    assert unrunnable(profile) == []


def test_a_profile_with_a_missing_candidate_is_neither_runnable_nor_hardware_only() -> None:
    """Negative control: a profile with only a silu candidate (and one with a GPU-only silu) is caught."""
    registry.register_profile("plug_partial", _plugin_candidates("plug_partial"), replace=True)
    assert "plug_partial.rms_norm: " in "\n".join(unrunnable("plug_partial"))
    assert not any(line.startswith("plug_partial.silu") for line in unrunnable("plug_partial"))
    registry.register_profile(
        "plug_partial_gpu", _plugin_candidates("plug_partial_gpu", device="cuda"), replace=True
    )
    missing = unrunnable("plug_partial_gpu")
    assert len(missing) == len(CANDIDATE_OPS) - 1 and not any("silu" in m for m in missing)


def test_resolve_or_skip_skips_only_what_the_registry_calls_hardware() -> None:
    """A GPU-only candidate on this CPU call is skipped; a missing candidate raises (fails the test)."""
    registry.register_profile(
        "plug_skip_gpu", _plugin_candidates("plug_skip_gpu", device="cuda"), replace=True
    )
    with pytest.raises(pytest.skip.Exception, match="hardware_only"):
        resolve_or_skip("plug_skip_gpu", "silu", "cpu")
    with pytest.raises(CandidateUnavailable, match="no candidate registered for this operator"):
        resolve_or_skip("plug_skip_gpu", "rms_norm", "cpu")


@pytest.mark.parametrize(
    ("profile", "reason"),
    [
        ("triton_cuda_bf16", "runs on cuda, asked for cpu"),
        ("cuda_bf16", "no candidate registered yet"),
        ("cuda_bf16_sm90", "no candidate registered yet"),
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


@pytest.mark.parametrize("profile", CANDIDATE_PROFILES)
@pytest.mark.parametrize("op", sorted(OP_CLASS))
def test_launch_log_and_declared_ops(profile: str, op: str) -> None:
    """Kernel ids are recorded at the launch site (fwd and bwd); every dispatched aten op is declared."""
    cand = resolve_or_skip(profile, op)
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
