"""`ci/drive_sm90_op.py` (the profiler's driver for one Hopper op): a bad shape is refused with exit 2 and one
line, before torch loads; a good one gets past the argument check (and, with no Hopper module here, stops at the
module check with the module's reason, also exit 2)."""

from __future__ import annotations

import pytest

from tests.repo_scripts import load_repo_script

drive = load_repo_script("ci/drive_sm90_op.py", "ws1_ci_drive_sm90_op")


def test_a_non_positive_m_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert drive.main(["--op", "gemm", "--m", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--m, --n, --k and --iters must be positive" in err[0]


def test_a_good_shape_passes_the_argument_check(capsys: pytest.CaptureFixture[str]) -> None:
    # control: the same call with M = 1 is not refused for its shape; it runs (a Hopper host with the module) or
    # stops later, at the missing module or device, with that reason
    rc = drive.main(["--op", "gemm", "--m", "1", "--iters", "1"])
    err = capsys.readouterr().err
    assert "must be positive" not in err
    assert rc == 0 or (rc == 2 and err.startswith("drive_sm90_op: "))


def test_the_weight_gradient_variant_defaults_to_the_wired_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """No --consumers or --stage-rows: the wiring's variant, read from it (wired to another variant, the default
    follows); the control: values given are kept."""
    from ws1_kernels.cuda_sm90 import linear

    assert drive.wgrad_variant(None, None) == linear.WGRAD_VARIANT
    assert drive.wgrad_variant(2, 64) == (2, 64)
    monkeypatch.setattr(linear, "WGRAD_VARIANT", (2, 64))
    assert drive.wgrad_variant(None, None) == (2, 64)
    assert drive.wgrad_variant(1, None) == (1, 64)


def test_an_unknown_op_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        drive.main(["--op", "bogus", "--m", "1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("drive_sm90_op: ") and "bogus" in err[0]
