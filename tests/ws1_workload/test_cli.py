"""`ws1-workload` command line: describe, verify-weights; bad input exits 2 with exactly one line.

The bad-input cases call `main(argv)` in this process; one real subprocess (describe, twice) proves the entry
point and that the digests do not depend on the process.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import save_file

from ws1_workload.cli import main


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ws1_workload", *args], capture_output=True, text=True)


def _main(capsys, *args: str) -> subprocess.CompletedProcess:
    """`ws1-workload ARGS` in this process, reported like a subprocess."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["ws1-workload", *args], code, out, err)


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
        (lambda d: d.update(revision=d["revision"] + 1), "embeds revision"),
        (lambda d: d["layouts"][0].update(kind="sometimes"), "kind"),
    ],
    ids=["revision-mismatch", "schema-violation"],
)
def test_bad_manifest_exits_2_with_one_line(write_manifest, edit, needle, capsys):
    res = _main(capsys, "describe", "--manifest", str(write_manifest(edit)))
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
    res = _main(capsys, "verify-weights", str(bad), "--model", "tiny")
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1 and "matches no pin" in res.stderr
    res = _main(capsys, "verify-weights", str(good))  # default model is the full one: wrong tensors
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1


def test_hash_synthetic_prints_the_pin(manifest, capsys):
    assert main(["hash-synthetic", "--model", "tiny"]) == 0
    assert manifest.weights("tiny").content_sha256 in capsys.readouterr().out


@pytest.mark.parametrize("command", ["describe", "hash-synthetic"])
def test_a_width_of_1e23_is_one_line_naming_file_and_field(write_manifest, command, capsys):
    """`hidden: 1e23` once passed `describe` and crashed `hash-synthetic` with a traceback."""
    path = write_manifest(lambda d: d["models"]["tiny"].update(hidden=1e23))
    res = _main(capsys, command, "--manifest", str(path))
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [
        f"ws1-workload: error: {path}: $.models.tiny.hidden: must be an integer, found 1e+23"
    ]


# Python modules whose distribution has another name on the package index.
_DIST_OF = {"yaml": "pyyaml"}
_OPTIONAL = {"transformers"}  # the `hf` extra, imported only inside the functions that need it


def _imported_distributions(source: Path) -> set[str]:
    """Third-party distributions the package's code needs: its imports, plus numpy where it calls
    `Tensor.numpy()` (torch's CPU wheel does not install numpy)."""
    modules: set[str] = set()
    for path in source.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if ".numpy()" in text:
            modules.add("numpy")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    third_party = modules - set(sys.stdlib_module_names) - {source.name} - _OPTIONAL
    return {_DIST_OF.get(m, m).replace("_", "-") for m in third_party}


def _declared_dependencies(pyproject: str) -> set[str]:
    block = pyproject.split("dependencies = [", 1)[1].split("]", 1)[0]
    return {re.split(r"[<>=!~ ;\[]", spec)[0].lower() for spec in re.findall(r'"([^"]+)"', block)}


def test_every_third_party_import_is_a_declared_dependency(repo_root):
    """The README's single-package install gave a venv without numpy, and `hash-synthetic` crashed."""
    package = repo_root / "packages" / "ws1-workload"
    needed = _imported_distributions(package / "src" / "ws1_workload")
    declared = _declared_dependencies((package / "pyproject.toml").read_text(encoding="utf-8"))
    assert "numpy" in needed and "torch" in needed  # the scan sees what the code uses
    assert sorted(needed - declared) == [], f"imported but not declared in {package}/pyproject.toml"
    # negative control: the pyproject as it was (no numpy) fails the check
    assert needed - (declared - {"numpy"}) == {"numpy"}
