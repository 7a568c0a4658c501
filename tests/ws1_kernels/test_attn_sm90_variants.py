"""`ci/attn_sm90_variants.py`'s arguments, on the CPU: a bad one is one line and exit 2, before any GPU work, and
nothing is overwritten. The timing itself needs the Hopper module and an sm_90 device (the `attn90` device step)."""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_scripts import load_repo_script

SCRIPT = load_repo_script("ci/attn_sm90_variants.py", "ws1_attn_sm90_variants")


@pytest.mark.parametrize(
    "argv",
    [
        ["--variant", "65:1"],  # no such block size
        ["--variant", "64:9"],  # no such schedule
        ["--variant", "64:6"],  # the wide ping-pong needs two warpgroups
        ["--variant", "x"],
        ["--tokens", "100", "--seq", "64"],  # not a multiple of the sample
        ["--reps", "0"],
        ["--decode", "0"],  # no cache
        ["--decode", "64", "--decode-batch", "0"],
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert SCRIPT.main([*argv, "--out", str(tmp_path / "v.json")]) == 2
    out = capsys.readouterr().out
    assert out.startswith("attn_sm90_variants: ") and out.count("\n") == 1


def test_an_existing_output_is_never_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "v.json"
    out.write_text("kept")
    assert SCRIPT.main(["--out", str(out)]) == 2
    assert out.read_text() == "kept" and "exists" in capsys.readouterr().out


def test_the_control_good_arguments_parse() -> None:
    ns = SCRIPT.parse(
        ["--variant", "64:3", "--variant", "128:0", "--tokens", "8192", "--out", "/nonexistent/v.json"]
    )
    assert ns.variants == [(64, 3), (128, 0)] and ns.tokens == [8192]
    assert SCRIPT.parse(["--out", "/nonexistent/v.json"]).variants == SCRIPT.VARIANTS


def test_the_variants_are_the_kernels_schedules() -> None:
    """Every (rows, schedule) the extension takes, and the wide schedules' key block, as cuda_sm90.attention says."""
    from ws1_kernels.cuda_sm90 import attention as att

    want = {(r, s) for s in att.SCHEDULES for r in (64, 128) if s in att.schedules(r)}
    assert set(SCRIPT.VARIANTS) == want and len(SCRIPT.VARIANTS) == len(want)
    assert tuple(SCRIPT.WIDE) == tuple(att.WIDE)


def test_the_control_decode_arguments_parse() -> None:
    ns = SCRIPT.parse(
        ["--decode", "4096", "--decode-batch", "1", "--decode-batch", "64", "--out", "/nonexistent/v.json"]
    )
    assert ns.decode == 4096 and ns.decode_batch == [1, 64]
    assert SCRIPT.parse(["--out", "/nonexistent/v.json"]).decode is None
