"""Each GPU profile's harness in its own environment (`nox -s gpu_sm90`, noxfile `make_profile_venv`,
`profile_pythonpath`, `split_modules`): the environment sees torch and the checkout's packages, works offline,
and sees only its own profile's built modules. Each property has the case that must be refused beside it.

The environment test builds a real virtualenv from this interpreter (seconds, no registry: `--no-index`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from repo_scripts import load_noxfile


@pytest.fixture(scope="module")
def noxfile() -> ModuleType:
    return load_noxfile("ws1_noxfile_profile_envs")


def _fake_build(tmp_path: Path) -> Path:
    out = tmp_path / "build"
    out.mkdir()
    (out / "ws1_cuda_ext.cpython-312-x86_64-linux-gnu.so").write_text("generic")
    (out / "ws1_cuda_sm90_ext.cpython-312-x86_64-linux-gnu.so").write_text("hopper v2")
    return out


def test_the_hopper_module_moves_into_its_own_folder(noxfile: ModuleType, tmp_path: Path) -> None:
    out = _fake_build(tmp_path)
    (out / "hopper").mkdir()
    (out / "hopper" / "ws1_cuda_sm90_ext.cpython-312-x86_64-linux-gnu.so").write_text("hopper v1")
    modules = noxfile.split_modules(out)
    assert modules == {"generic": out, "hopper": out / "hopper"}
    assert not list(out.glob("ws1_cuda_sm90_ext*.so")), "the Hopper module is still beside the generic one"
    assert (out / "hopper" / "ws1_cuda_sm90_ext.cpython-312-x86_64-linux-gnu.so").read_text() == "hopper v2"
    assert (out / "ws1_cuda_ext.cpython-312-x86_64-linux-gnu.so").exists()


def test_a_build_without_9_0a_has_no_hopper_folder(noxfile: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "build"
    out.mkdir()
    (out / "ws1_cuda_ext.so").write_text("generic")
    assert noxfile.split_modules(out) == {"generic": out}


def test_each_profile_sees_only_its_own_modules(noxfile: ModuleType, tmp_path: Path) -> None:
    modules = {"generic": tmp_path / "g", "hopper": tmp_path / "h"}
    sep = os.pathsep
    assert noxfile.profile_pythonpath("cuda_bf16", modules, "/carried") == sep.join(
        [str(tmp_path / "g"), "/carried"]
    )
    assert noxfile.profile_pythonpath("cuda_bf16_sm90", modules, "") == sep.join(
        [str(tmp_path / "g"), str(tmp_path / "h")]
    )
    for profile in ("triton_cuda_bf16", "native_torch"):
        assert noxfile.profile_pythonpath(profile, modules, "/carried") == "/carried"
    # the control: the generic profile never gets the Hopper folder, even when it exists
    assert str(tmp_path / "h") not in noxfile.profile_pythonpath("cuda_bf16", modules, "")
    # an sm86 build has no Hopper folder: the Hopper profile gets only what exists
    assert noxfile.profile_pythonpath("cuda_bf16_sm90", {"generic": tmp_path / "g"}) == str(tmp_path / "g")


@pytest.mark.parametrize(
    ("posargs", "argv", "expected"),
    [
        ([], ["nox", "-s", "gpu_sm90"], False),
        (["--profile", "cuda_bf16"], ["nox", "-s", "gpu_sm90"], False),
        (["--one-env"], ["nox", "-s", "gpu_sm90"], True),
        ([], ["nox", "--no-venv", "-s", "gpu_sm90"], True),
    ],
)
def test_one_env_is_the_fallback_only_when_asked(
    noxfile: ModuleType, posargs: list[str], argv: list[str], expected: bool
) -> None:
    assert noxfile.one_env_requested(posargs, argv) is expected


@pytest.mark.heavy(seconds=15)
def test_a_profile_venv_sees_torch_the_checkout_and_only_the_path_it_is_given(
    noxfile: ModuleType, tmp_path: Path
) -> None:
    pytest.importorskip("torch")

    def run(*cmd: str) -> None:
        subprocess.run(list(cmd), check=True, capture_output=True, text=True, timeout=600)

    bin_dir = noxfile.make_profile_venv(tmp_path / "venv", run)
    python = bin_dir / "python"
    assert Path(python).exists() and (bin_dir / "ws1").exists(), "no interpreter or ws1 command in the venv"
    assert Path(os.path.realpath(sys.prefix)) != (tmp_path / "venv").resolve()
    hopper = tmp_path / "hopper"
    hopper.mkdir()
    (hopper / "ws1_fake_hopper_module.py").write_text("ORIGIN = 'hopper'\n")
    probe = (
        "import torch, ws1_contract, ws1_harness; print(ws1_contract.__file__); "
        "import importlib.util; print(importlib.util.find_spec('ws1_fake_hopper_module') is not None)"
    )

    def ask(pythonpath: str) -> list[str]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        out = subprocess.run([str(python), "-c", probe], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.split()

    modules = {"generic": tmp_path / "generic", "hopper": hopper}
    contract_file, sees_hopper = ask(noxfile.profile_pythonpath("cuda_bf16_sm90", modules))
    assert Path(contract_file).resolve().is_relative_to(noxfile.ROOT), "ws1_contract not from the checkout"
    assert sees_hopper == "True"
    # the control: the Triton profile's environment does not see the Hopper module
    assert ask(noxfile.profile_pythonpath("triton_cuda_bf16", modules))[1] == "False"


class _Args:
    def __init__(self, posargs: list[str]) -> None:
        self.posargs = posargs

    def error(self, message: str) -> None:
        raise ValueError(message)


def test_the_session_flags_are_read_once_into_one_record(noxfile: ModuleType) -> None:
    args = noxfile._gpu_args(_Args(["--profile", "cuda_bf16", "--no-build", "--one-env", "--no-tests"]))
    assert (args.profiles, args.run_tests, args.one_env, args.build) == (["cuda_bf16"], False, True, False)
    # the control: no flags, every default
    plain = noxfile._gpu_args(_Args([]))
    assert (plain.run_tests, plain.build) == (True, True) and plain.profiles == list(noxfile.GPU_PROFILES)
    with pytest.raises(ValueError, match="unknown argument '--rebuild'"):
        noxfile._gpu_args(_Args(["--rebuild"]))


def test_without_nox_the_noxfile_tests_fail_in_ci_and_skip_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nox", None)  # `import nox` now raises ImportError
    monkeypatch.setenv("CI", "true")
    with pytest.raises(RuntimeError, match="CI=true: nox is not importable"):
        load_noxfile("ws1_noxfile_without_nox")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        load_noxfile("ws1_noxfile_without_nox")
