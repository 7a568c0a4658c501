"""`ci/sanitize_cuda.py`, the body compute-sanitizer watches: it must call every candidate forward and backward
and fail loudly when a candidate cannot run (a sanitizer run over nothing would be a clean log that proves
nothing)."""

from __future__ import annotations

import pytest
from repo_scripts import load_repo_script

sanitize = load_repo_script("ci/sanitize_cuda.py", "sanitize_cuda")


def test_every_portable_candidate_runs_forward_and_backward(capsys: pytest.CaptureFixture) -> None:
    assert sanitize.main(["--profile", "portable_cpu", "--device", "cpu", "--m", "3"]) == 0
    out = capsys.readouterr().out
    assert "linear_logp vocab M=3: ok" in out and "attention gqa M=3: ok" in out
    assert "0 failed" in out


def test_a_profile_that_cannot_run_here_fails(capsys: pytest.CaptureFixture) -> None:
    assert sanitize.main(["--profile", "triton_cuda_bf16", "--device", "cpu", "--m", "3"]) == 1
    assert "unavailable" in capsys.readouterr().out


def test_bad_arguments_are_one_line_and_exit_2(capsys: pytest.CaptureFixture) -> None:
    """An attention M that the bench refuses once gave a traceback under compute-sanitizer."""
    code = sanitize.main(["--profile", "portable_cpu", "--device", "cpu", "--m", "130", "--attn-seq", "33"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "M=130" in err
