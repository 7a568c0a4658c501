"""`ws1-workload` command line: describe, verify-weights; bad input exits 2 with exactly one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from safetensors.torch import save_file

from ws1_workload.cli import main


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ws1_workload", *args], capture_output=True, text=True)


def test_describe_text_and_json(capsys, manifest):
    assert main(["describe"]) == 0
    text = capsys.readouterr().out
    assert manifest.fingerprint in text and "layout decode" in text
    assert main(["describe", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["revision"] == manifest.revision and set(d["tiers"]) == set(manifest.tiers)
    for tier in d["tiers"].values():
        assert set(tier["layouts"]) == {s.name for s in manifest.layouts}
        assert all(v["digest"].startswith("sha256:") for v in tier["layouts"].values())


def test_describe_is_identical_across_processes(source_manifest):
    a = _run("describe", "--json", "--manifest", str(source_manifest))
    b = _run("describe", "--json", "--manifest", str(source_manifest))
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda d: d.update(revision=3), "embeds revision 1"),
        (lambda d: d["layouts"][0].update(kind="sometimes"), "kind"),
    ],
    ids=["revision-mismatch", "schema-violation"],
)
def test_bad_manifest_exits_2_with_one_line(write_manifest, edit, needle):
    res = _run("describe", "--manifest", str(write_manifest(edit)))
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("ws1-workload: error: ")


def test_verify_weights(tiny_weights, tmp_path, capsys):
    good = tmp_path / "tiny.safetensors"
    save_file(dict(tiny_weights), str(good))
    assert main(["verify-weights", str(good), "--model", "tiny"]) == 0
    assert "matches the synthetic pin" in capsys.readouterr().out
    bad = tmp_path / "bad.safetensors"
    data = bytearray(good.read_bytes())
    data[-1] ^= 0x80
    bad.write_bytes(bytes(data))
    res = _run("verify-weights", str(bad), "--model", "tiny")
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1 and "matches no pin" in res.stderr
    res = _run("verify-weights", str(good))  # default model is the full one: wrong tensors
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1


def test_hash_synthetic_prints_the_pin(manifest, capsys):
    assert main(["hash-synthetic", "--model", "tiny"]) == 0
    assert manifest.weights("tiny").content_sha256 in capsys.readouterr().out
