"""ci/tune_linear_logp.py on the CPU under TRITON_INTERPRET=1 (--smoke): its bits check and its variant list.

The script may only ever propose a weight-gradient tile whose dx and main_grad have the bits of the current
table; a planted variant with one bit flipped must make it fail (exit 1).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from repo_scripts import load_repo_script

pytest.importorskip("triton")

from ws1_kernels.triton_ops import _launch  # noqa: E402

pytestmark = [
    pytest.mark.interp,
    pytest.mark.skipif(
        not _launch.interpreting(), reason="needs TRITON_INTERPRET=1 (the CPU nox session sets it)"
    ),
]


def _tune():
    return load_repo_script("ci/tune_linear_logp.py", "ws1_tune_linear_logp_under_test")


def test_variants_only_move_weight_gradient_knobs() -> None:
    """No variant touches the forward, dlogits or dx tiles (their bits are checked elsewhere)."""
    for _name, over in _tune().VARIANTS:
        assert all(key.startswith("wg_") for key in over), over


def test_smoke_run_keeps_the_bits(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    assert _tune().main(["--smoke", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) >= 2 and all(r["bits_same"] for r in rows)


def test_planted_bit_flip_fails_the_run(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    assert _tune().main(["--smoke", "--plant-perturbed", "--out", str(out)]) == 1
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows if not r["bits_same"]] == ["4_warps_4_stages"]
