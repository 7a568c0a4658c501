"""logical_tensor: a pure function of (case_id, name, key), exactly representable in bf16, never zero outside the
hard rows a tensor asks for."""

from __future__ import annotations

import pytest
import torch

from ws1_workload import WorkloadError, logical_tensor
from ws1_workload.inputs import LARGE_ROW_SCALE, hard_row_kind


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


def test_hard_rows_are_a_pure_function_of_the_key():
    kinds = ("signed_zero_rows", "tiny_norm_rows")
    keys = [(s, p) for s in range(3) for p in range(13)]
    full = logical_tensor("case", "x", keys, 64, hard_rows=kinds)
    alone = logical_tensor("case", "x", keys[20:26], 64, hard_rows=kinds)
    assert torch.equal(_bits(full[20:26]), _bits(alone))
    for r, key in enumerate(keys):
        kind = hard_row_kind(key, kinds)
        row = full[r].float()
        if kind == "signed_zero_rows":
            assert bool((row == 0).all())
            assert torch.equal(torch.signbit(row), torch.arange(64) % 2 == 1)  # +0 and -0 alternate
        elif kind == "tiny_norm_rows":
            assert 1e-7 < float(row.pow(2).mean()) < 1e-5  # comparable to an RMSNorm eps of 1e-6
        else:
            assert not bool((row == 0).any()) and 0.3 < float(row.pow(2).mean()) < 3


def test_large_rows_and_no_hard_rows_unless_asked():
    keys = [(0, p) for p in range(12)]
    large = logical_tensor("case", "logits", keys, 256, hard_rows=("large_logit_rows",))
    plain = logical_tensor("case", "logits", keys, 256)
    rows = [r for r, k in enumerate(keys) if hard_row_kind(k, ("large_logit_rows",))]
    assert rows and all(float(large[r].float().abs().max()) >= LARGE_ROW_SCALE for r in rows)
    assert torch.isfinite(large.float()).all()
    assert not bool((plain == 0).any()) and float(plain.float().abs().max()) < 10  # negative control


def test_unknown_hard_row_kind_raises():
    with pytest.raises(WorkloadError, match="unknown hard row"):
        logical_tensor("c", "t", [(0, 1)], 3, hard_rows=("nan_rows",))
