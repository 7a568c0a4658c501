"""`ci/wgrad_tiles_sm90.py` (the Hopper weight gradient's variants against cuBLAS): each bad argument is refused with
exit 2 and one line, before any GPU work; the controls, good arguments, get past the check (and, with no Hopper
module here, stop at the module check with the module's reason, also exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.repo_scripts import load_repo_script

tiles = load_repo_script("ci/wgrad_tiles_sm90.py", "ws1_ci_wgrad_tiles_sm90")


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert tiles.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("wgrad_tiles_sm90: "), err
    return err[0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--shape", "qkv:6144"], "NAME:N:K"),
        (["--shape", "odd:136:128"], "multiples of 128"),
        (["--variant", "3"], "consumers must be 1 or 2"),
        (["--variant", "2:16"], "stage rows 32 or 64"),
        (["--variant", "two"], "C or C:S"),
        (["--m", "0"], "must be positive"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_a_bad_argument_is_refused_in_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if argv == ["--bogus"]:
        with pytest.raises(SystemExit) as e:
            tiles.main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0]
        return
    assert says in _refused(argv, capsys)


def test_an_existing_out_file_is_not_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiles.json"
    out.write_text("kept")
    assert "exists" in _refused(["--out", str(out)], capsys)
    assert out.read_text() == "kept"


def test_good_arguments_pass_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the control: the same kinds of argument, well formed, are not refused for themselves; the call runs (a Hopper
    # host with the module) or stops at the missing module or device, with that reason
    argv = ["--shape", "o:4096:4096", "--variant", "2:32", "--variant", "1", "--m", "64", "--rep-ms", "1"]
    rc = tiles.main([*argv, "--out", str(tmp_path / "new.json")])
    err = capsys.readouterr().err
    assert "expected" not in err and "must be" not in err and "exists" not in err
    assert rc == 0 or (rc == 2 and err.startswith("wgrad_tiles_sm90: "))


def test_the_tile_is_the_kernels() -> None:
    from ws1_kernels.cuda_sm90 import linear as sm90

    assert tiles.TILE == sm90.WGRAD_TILE


def test_the_default_shapes_are_the_operator_specs() -> None:
    """lm_head's and det_gemm's bench shapes at the 8B widths, as `ws1 bench` evaluates them; the control: the
    tiny model's widths give other shapes, so the figures follow the spec, not a copy of it."""
    shapes = {(s.name, s.n, s.k) for s in tiles.spec_shapes()}
    assert ("lm_head", 151936, 4096) in shapes and ("down", 4096, 12288) in shapes and len(shapes) == 5
    assert {(s.name, s.n, s.k) for s in tiles.spec_shapes("tiny")} != shapes


def test_the_variant_labels_say_what_ran() -> None:
    assert tiles.parse_variant("2").label == "2wg" and tiles.parse_variant("1:32").label == "1wg/32"


def test_the_default_variants_start_with_the_wired_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no --variant the wiring's own variant is timed first, once. The control: wired to another variant, the
    defaults follow it, so they are read from the wiring, not copied."""
    from ws1_kernels.cuda_sm90 import linear

    variants = tiles.default_variants()
    assert (variants[0].consumers, variants[0].stage_rows) == linear.WGRAD_VARIANT
    assert len(set(variants)) == len(variants) >= 2
    monkeypatch.setattr(linear, "WGRAD_VARIANT", (1, 64))
    assert [v.label for v in tiles.default_variants()] == ["1wg/64", "2wg/64"]
