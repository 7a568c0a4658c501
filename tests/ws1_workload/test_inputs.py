"""logical_tensor: a pure function of (case_id, name, key), never zero, exactly representable in bf16."""

from __future__ import annotations

import pytest
import torch

from ws1_workload import WorkloadError, logical_tensor


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


def test_rows_depend_only_on_their_own_key():
    keys = [(s, p) for s in range(3) for p in range(7)]
    full = logical_tensor("case", "x", keys, (5, 4))
    alone = logical_tensor("case", "x", keys[9:12], (5, 4))
    reordered = logical_tensor("case", "x", list(reversed(keys)), (5, 4))
    assert torch.equal(_bits(full[9:12]), _bits(alone))
    assert torch.equal(_bits(full.flip(0)), _bits(reordered))


def test_case_name_and_key_all_matter():
    base = logical_tensor("case", "x", [(0, 1)], 64)
    for other in (
        logical_tensor("case2", "x", [(0, 1)], 64),
        logical_tensor("case", "y", [(0, 1)], 64),
        logical_tensor("case", "x", [(1, 0)], 64),
    ):
        assert not torch.equal(base, other)


def test_never_zero_and_bf16_exact_in_every_dtype():
    keys = list(range(50))
    b = logical_tensor("c", "w", keys, 300, torch.bfloat16)
    f = logical_tensor("c", "w", keys, 300, torch.float32)
    assert b.dtype == torch.bfloat16 and f.dtype == torch.float32
    assert not bool((b == 0).any())
    assert torch.equal(f.to(torch.bfloat16).float(), f)  # exactly representable in bf16
    assert torch.equal(_bits(f.to(torch.bfloat16)), _bits(b))
    assert f.std().item() == pytest.approx(1.0, abs=0.05)  # standard normal draws


def test_scalar_rows_and_empty_keys():
    assert logical_tensor("c", "t", [(0, 0), (0, 1)], ()).shape == (2,)
    assert logical_tensor("c", "t", [], (3,)).shape == (0, 3)


def test_bad_keys_and_dtypes_raise():
    with pytest.raises(WorkloadError):
        logical_tensor("c", "t", [1.5], 3)
    with pytest.raises(WorkloadError):
        logical_tensor("c", "t", [True], 3)
    with pytest.raises(WorkloadError):
        logical_tensor("c", "t", range(20), 500, torch.int32)
