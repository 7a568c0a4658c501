"""The linear_logp row's peer (bench/cases.py): Liger-Kernel's fused linear cross-entropy where it imports on a
GPU, the materialised chain elsewhere, and the row's `peer` names the one that ran. Checked with a stand-in
Liger module (its function's per-token loss is minus the logprob), and without it (the control)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from ws1_harness.run.bench import cases as C


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(4, 8, generator=g),
        "weight": torch.randn(16, 8, generator=g),
        "targets": torch.tensor([0, 3, 15, 7]),
    }


def _fake_liger(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def flce(x, w, t, reduction="mean"):  # type: ignore[no-untyped-def]
        calls.append(reduction)
        return -torch.log_softmax(x @ w.t(), -1).gather(1, t[:, None])[:, 0]

    mod = types.ModuleType("liger_kernel.transformers.functional")
    mod.liger_fused_linear_cross_entropy = flce  # type: ignore[attr-defined]
    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.functional", mod)
    return calls


def test_liger_is_the_gpu_peer_and_gives_the_logprob(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_liger(monkeypatch)
    name, fn = C.linear_logp_peer("cuda")
    t = _inputs()
    assert name == C.LIGER
    assert torch.allclose(fn(t, None), C._linear_logp_materialised(t, None), atol=1e-5)  # type: ignore[arg-type]
    assert calls == ["none"]  # per token, never a mean


def test_without_liger_the_materialised_chain_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # import fails
    assert C.linear_logp_peer("cuda")[0] == C.MATERIALISED
    _fake_liger(monkeypatch)
    assert C.linear_logp_peer("cpu")[0] == C.MATERIALISED  # Liger's kernels need a GPU
