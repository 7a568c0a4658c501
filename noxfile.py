"""ws1 task runner.

Sessions:
  lint           ruff check, ruff format --check, mypy on the typed packages.
  cpu_contract   everything that runs without a GPU: the four packages' tests (pytest-xdist), the C8 matrix for
                 `portable_cpu` (gated: must pass) and `native_torch` (recorded, not gated).  CI runs it.
  matrix         the README's main job: the full CPU matrix for `portable_cpu`, gated, with report and heatmap.
  gate           merge the shards given as arguments and gate them.

Evidence is written outside the checkout (trap 23): `$WS1_OUT` if set, else a folder under the system temp dir.
On a machine without a package registry run `nox --no-venv -s ...` on the system's torch.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import nox

nox.options.default_venv_backend = "virtualenv"  # uv would not see the local CPU torch wheel
nox.options.download_python = "never"
nox.options.sessions = ["lint", "cpu_contract"]
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).resolve().parent
PACKAGES = ROOT / "packages"
CPU_TORCH = "torch==2.13.0"  # the CPU wheel served locally; an unpinned torch pulls a multi-GB CUDA build
TEST_DEPS = ["pytest", "pytest-xdist", "hypothesis", "numpy<2.4"]  # triton 3.6 breaks with numpy 2.4
HF_DEPS = ["transformers", "safetensors"]
TYPED_PACKAGES = ["ws1_contract"]


def _local_dependencies(dist: str, seen: set[str] | None = None) -> list[str]:
    """Return `dist` and every ws1-* package it depends on, dependencies first.

    Sibling packages are not on any index, so pip must see all their paths in one command.
    """
    seen = set() if seen is None else seen
    if dist in seen:
        return []
    seen.add(dist)
    pyproject = (PACKAGES / dist / "pyproject.toml").read_text()
    order: list[str] = []
    for dep in re.findall(r'"(ws1-[a-z]+)', pyproject.split("[project]", 1)[1].split("\n[", 1)[0]):
        if dep != dist:
            order += _local_dependencies(dep, seen)
    return order + [dist]


def _existing_packages() -> list[str]:
    return sorted(p.name for p in PACKAGES.iterdir() if (p / "pyproject.toml").exists())


def _install_packages(session: nox.Session, dists: list[str]) -> None:
    """Install the given ws1 packages and their local siblings in one pip call."""
    ordered: list[str] = []
    for dist in dists:
        for dep in _local_dependencies(dist):
            if dep not in ordered:
                ordered.append(dep)
    args: list[str] = []
    for dep in ordered:
        args += ["-e", str(PACKAGES / dep)]
    if session.venv_backend == "none":
        session.run(
            "python", "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", *args
        )
    else:
        session.install(*args)


def _evidence_dir(session: nox.Session, name: str) -> Path:
    base = Path(os.environ.get("WS1_OUT") or Path(tempfile.gettempdir()) / "ws1-evidence")
    out = base / name
    out.mkdir(parents=True, exist_ok=True)
    session.log(f"evidence -> {out}")
    return out


def _cpu_env(session: nox.Session) -> None:
    if session.venv_backend != "none":
        session.install(CPU_TORCH)
        session.install(*TEST_DEPS, *HF_DEPS, "triton", "matplotlib")
    _install_packages(session, _existing_packages())


@nox.session(tags=["ci"])
def lint(session: nox.Session) -> None:
    """Static checks: ruff lint and format, mypy on the typed packages."""
    session.install("ruff", "mypy", "types-PyYAML", "jsonschema", "pyyaml")
    session.run("ruff", "check", "packages", "tests", "ci", "noxfile.py")
    session.run("ruff", "format", "--check", "packages", "tests", "ci", "noxfile.py")
    _install_packages(session, ["ws1-contract"])
    for pkg in TYPED_PACKAGES:
        session.run("mypy", "-p", pkg)


@nox.session(tags=["ci"])
def cpu_contract(session: nox.Session) -> None:
    """Every CPU test (parallel), the portable_cpu matrix at full widths (gated), the native baseline at tiny widths.

    The native_torch baseline runs here at the `tiny` widths only: it is recorded, never gated, and at full widths
    its stock bf16 lm_head backward takes hours on CPUs without native bf16 GEMM support (docs/matrix.md, "CPU
    cost of the native baseline"). `nox -s matrix -- native_torch` runs it at full widths.
    """
    _cpu_env(session)
    workers = os.environ.get("WS1_PYTEST_WORKERS", "2")
    pytest_args = session.posargs or ["-m", "not gpu", "-n", workers, "--dist", "worksteal"]
    # pytest exit 5 (no tests collected) is a failure here: nox fails on any non-zero exit.
    with _step(session, "pytest"):
        session.run("python", "-m", "pytest", *pytest_args, env={"TRITON_INTERPRET": "1"})
    if session.posargs:
        return
    out = _evidence_dir(session, "cpu_contract")
    with _step(session, "matrix portable_cpu (full widths, gated)"):
        _run_matrix(session, "portable_cpu", out, gate=True, cell_timeout=CI_CELL_TIMEOUT_S)
    with _step(session, "matrix native_torch (tiny widths, recorded)"):
        _run_matrix(session, "native_torch", out, gate=False, model="tiny", cell_timeout=CI_CELL_TIMEOUT_S)


CPU_TIERS = ("short", "primary")
# One unit of the full-width portable matrix takes at most about 90 s on the 2-core CI machine (lm_head/primary);
# 300 s keeps one slow or hung unit from eating the CI budget and leaves a 3x margin.
CI_CELL_TIMEOUT_S = 300


@contextlib.contextmanager
def _step(session: nox.Session, label: str) -> Iterator[None]:
    """Log how long a step took, also when it fails (CI prints its time per step)."""
    start = time.monotonic()
    try:
        yield
    finally:
        session.log(f"step time: {label}: {time.monotonic() - start:.0f} s")


def _run_matrix(
    session: nox.Session,
    profile: str,
    out: Path,
    gate: bool,
    model: str = "qwen3-8b",
    cell_timeout: float | None = None,
    tiers: tuple[str, ...] = CPU_TIERS,
    env: dict[str, str] | None = None,
) -> None:
    """Run the matrix of one profile, report it, and gate it (or only record it)."""
    evidence = out / f"{profile}.json"
    args = [arg for tier in tiers for arg in ("--tier", tier)]
    if model != "qwen3-8b":
        args += ["--model", model]
    if cell_timeout is not None:
        args += ["--cell-timeout", str(cell_timeout)]
    # `ws1 matrix` exits 1 when any cell is red: expected for the native baseline, which is recorded only.
    codes = [0] if gate else [0, 1]
    env = env or {}
    session.run(
        "ws1",
        "matrix",
        "--profile",
        profile,
        *args,
        "--out",
        str(out),
        success_codes=codes,
        env=env,
        external=True,
    )
    session.run("ws1", "report", str(evidence), "--out", str(out), external=True)
    if gate:
        session.run("ws1", "gate", str(evidence), external=True)
    else:
        # The baseline is expected red where stock kernels are batch-variant: record, do not gate.
        session.run("ws1", "gate", str(evidence), success_codes=[0, 1], external=True)


@nox.session(default=False)
def matrix(session: nox.Session) -> None:
    """Main job: the CPU C8 matrix for portable_cpu on the CPU tiers, with report and heatmap, gated."""
    _cpu_env(session)
    out = _evidence_dir(session, "matrix")
    profile = session.posargs[0] if session.posargs else "portable_cpu"
    _run_matrix(session, profile, out, gate=True)


GPU_PROFILES = ("native_torch", "triton_cuda_bf16", "cuda_bf16", "cuda_bf16_sm90")
GPU_ARCH = {"gpu_sm86": "8.6", "gpu_sm90": "9.0"}


def _gpu_session(session: nox.Session, name: str) -> None:
    """Assert the GPU arch first (trap 25), then run the GPU tests and one matrix shard per GPU profile.

    The sm86 session runs on an sm_90 card through the PTX JIT where no sm_86 card exists: its evidence says so
    (WS1_ARCH_PROXY) and must never be read as an sm86 run. The CUDA extension build joins here when csrc/
    holds kernels (a later step); until then the GPU profiles have no candidates and their cells are red.
    """
    import subprocess

    want = GPU_ARCH[name]
    probe = "import torch; p = torch.cuda.get_device_capability(); print(f'{p[0]}.{p[1]}')"
    try:
        have = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        ).stdout.strip()
    except subprocess.CalledProcessError:
        session.error(
            f"{name}: no CUDA device visible: refusing to run (a GPU session never passes without one)"
        )
    env = {"WS1_REQUIRE_GPU": "1"}
    if have != want:
        if name == "gpu_sm86" and have == "9.0":
            env["WS1_ARCH_PROXY"] = "sm86 code through the PTX JIT on an sm_90 device"
            session.warn(f"{name}: device is sm_90: this is a PTX proxy run, not an sm86 run")
        else:
            session.error(f"{name}: expected compute capability {want}, found {have}")
    _install_packages(session, _existing_packages())
    session.run("python", "-m", "pytest", "-m", "gpu", *session.posargs, env=env, success_codes=[0, 5])
    out = _evidence_dir(session, name)
    for profile in GPU_PROFILES:
        session.run(
            "ws1",
            "matrix",
            "--profile",
            profile,
            "--tier",
            "short",
            "--tier",
            "primary",
            "--tier",
            "long",
            "--out",
            str(out),
            success_codes=[0, 1],
            env=env,
            external=True,
        )


@nox.session(default=False, venv_backend="none")
def gpu_sm86(session: nox.Session) -> None:
    """GPU shard for sm_86 (8.6+PTX; on an H200 a PTX-JIT proxy, labelled as such)."""
    _gpu_session(session, "gpu_sm86")


@nox.session(default=False, venv_backend="none")
def gpu_sm90(session: nox.Session) -> None:
    """GPU shard for sm_90: GPU tests and the matrix of every GPU profile; gate the shards with `nox -s gate`."""
    _gpu_session(session, "gpu_sm90")


@nox.session(default=False)
def gate(session: nox.Session) -> None:
    """Merge the shards named in the arguments and gate the result (`nox -s gate -- a.json b.json`)."""
    if not session.posargs:
        session.error("gate: name the shard files: nox -s gate -- SHARD.json ...")
    if session.venv_backend != "none":
        session.install("jsonschema", "pyyaml", CPU_TORCH, "matplotlib")
    _install_packages(session, ["ws1-harness"])
    out = _evidence_dir(session, "gate")
    merged = out / "merged.json"
    session.run("ws1", "merge", *session.posargs, "--out", str(merged), external=True)
    session.run("ws1", "report", str(merged), "--out", str(out), external=True)
    session.run("ws1", "gate", str(merged), external=True)


if __name__ == "__main__":  # pragma: no cover - nox is the entry point
    sys.exit("run with: nox -s <session>")
