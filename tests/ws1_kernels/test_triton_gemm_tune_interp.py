"""ci/tune_kernels.py on the CPU: its H200 case list, and its bits check under TRITON_INTERPRET=1 (--smoke).

The script times alternative tiles on the H200 and may only ever propose one whose output has the bits of the
current table entry; these tests check that machinery without a GPU.  The smoke run swaps in a sequential
``tl.dot`` (the model of one accumulator walked in ascending k that the kernels rely on, see
test_triton_gemm_interp.py) so that the tile alternatives really do keep the bits here, and plants one
configuration per case whose output has one bit flipped: it must be reported and never chosen.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from repo_scripts import load_repo_script

pytest.importorskip("triton")


from ws1_kernels.triton_ops import _launch  # noqa: E402
from ws1_kernels.triton_ops import gemm as g  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _tune():
    return load_repo_script("ci/tune_kernels.py", "ws1_tune_kernels_under_test")


def test_h200_case_list_covers_every_shape_and_keeps_block_k() -> None:
    """Forward at every Qwen3-8B shape and M = 1..4096, dx and wgrad at 512 and 4096, logp once; at most six
    alternatives per case, none the current entry, and a GEMM alternative never moves BLOCK_K (the k order)."""
    tune = _tune()
    cases = tune.build_cases(smoke=False)
    got = {(c.kind, c.shape, c.m) for c in cases}
    for shape in g.bench_shapes():
        assert {("fwd", shape, m) for m in tune.FWD_MS} <= got
        assert {(k, shape, m) for k in ("dx", "wgrad") for m in tune.BWD_MS} <= got
    assert ("logp", "lm_head", tune.LOGP_SHAPE[0]) in got
    for c in cases:
        assert 1 <= len(c.alternatives) <= 6, c.name
        assert all(a.config != c.current for a in c.alternatives), c.name
        if c.kind in ("fwd", "dx"):
            assert {a.config.block_k for a in c.alternatives} == {c.current.block_k}, c.name


@pytest.mark.interp
@pytest.mark.skipif(not _launch.interpreting(), reason="--smoke runs the kernels under TRITON_INTERPRET=1")
def test_smoke_bits_check_flags_and_excludes_a_perturbed_config(seq_dot: None, tmp_path: Path) -> None:
    """Negative control: the planted config (one bit flipped) is reported as different and never chosen, the
    run exits 1, and it is the only alternative the check reports (the real tile alternatives keep the bits
    under the sequential dot)."""
    tune = _tune()
    out = tmp_path / "tune.json"
    assert tune.main(["--smoke", "--plant-perturbed", "--out", str(out)]) == 1
    doc = json.loads(out.read_text())
    assert {r["kind"] for r in doc["cases"]} == {"fwd", "dx", "wgrad", "logp"}
    for r in doc["cases"]:
        planted = [a for a in r["alternatives"] if a["params"].get("planted_perturbed")]
        assert len(planted) == 1 and planted[0]["bits_equal"] is False and planted[0]["diff_elements"] == 1
        assert not r["best"]["params"].get("planted_perturbed"), r
        if r["kind"] != "logp":  # logp's knobs are part of its order: allowed to differ, never chosen then
            real = [a for a in r["alternatives"] if a is not planted[0]]
            assert real and all(a["bits_equal"] for a in real), r
    assert len(doc["bits_differ"]) == len(doc["cases"])
    assert all("PLANTED" in d for d in doc["bits_differ"])
