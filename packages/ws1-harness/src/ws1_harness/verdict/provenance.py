"""Mandatory provenance for every evidence file.

An earlier gate checked provenance only when a caller chose to pass it, and its debugging tool never did.
Here the evidence writer and the merge collect it themselves; there is no way to write evidence without it.
A missing or failing `git` never reads as a clean tree: the commit becomes "unknown" and dirty=True.
CI and evidence environments once differed (torch, CUDA) unnoticed: the software and hardware environment is
recorded so that they can be compared. No hostname is recorded.

A checkout copied without its `.git` (a remote GPU machine) may state its commit through the environment
variables WS1_SOURCE_COMMIT and WS1_SOURCE_DIRTY ("0" or "1", default "1"); the record then says
`git_source: "env"`, so such a claim is never mistaken for one read from git.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ws1_harness.errors import HarnessError

UNKNOWN = "unknown"
_PACKAGES = (
    "ws1-contract",
    "ws1-workload",
    "ws1-kernels",
    "ws1-harness",
    "torch",
    "triton",
    "jsonschema",
    "numpy",
)
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$|^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Provenance:
    """Where and from what an evidence file came."""

    git_commit: str
    git_dirty: bool
    git_source: str  # "git", "env" or "unknown"
    source_dir: str
    device: str  # "cuda" or "cpu"
    device_name: str
    capability: str | None  # "sm_90" on CUDA, None on CPU
    driver: str | None
    cuda: str | None
    torch: str
    triton: str
    python: str
    platform: str
    argv: tuple[str, ...]
    packages: tuple[tuple[str, str], ...]
    # Set when code built for one arch ran on another (sm86 PTX JIT-compiled on an sm_90 card): such evidence
    # is a proxy and must never be read as a run on the named arch.
    arch_proxy: str | None = None
    # The host CPU's vector ISA as torch dispatches it, plus its native bf16 instructions: a CPU run's cost and
    # its stock bf16 GEMM path depend on it (without native bf16, torch's bf16 `mm` can take a scalar path
    # that makes the full-width native lm_head baseline take hours; docs/matrix.md).
    cpu_isa: str | None = None
    # plug-in profiles registered in this process: (profile, module, portable file, sha256 of the source). A
    # plug-in once registered itself as `portable_cpu` and its evidence could not be told from the built-in's.
    plugins: tuple[tuple[str, str, str, str | None], ...] = ()
    # The ws1 CUDA extension's kernels as the runtime loaded them on this device: (name, binary version, PTX
    # version). Which code ran, read off the device: an sm86 proxy shows PTX 86 JIT-compiled; a shard that claims
    # a proxy without it is refused by the gate.
    code_objects: tuple[tuple[str, int, int], ...] = ()
    # The arch lists the loaded extensions were built for (`ws1_cuda_ext=8.0;9.0a ws1_cuda_sm90_ext=9.0a`): what
    # a merged verdict's reader compares between the sm86 and sm90 shards beside the code objects.
    extension_archs: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["argv"] = list(self.argv)
        d["packages"] = dict(self.packages)
        d["code_objects"] = [
            {"name": name, "binary_version": binary, "ptx_version": ptx}
            for name, binary, ptx in self.code_objects
        ]
        d["plugins"] = [
            {"profile": profile, "module": module, "file": file, "sha256": digest}
            for profile, module, file, digest in self.plugins
        ]
        return d


def plugin_sources() -> tuple[tuple[str, str, str, str | None], ...]:
    """The plug-in profiles the kernel registry holds in this process, with portable file paths.

    Read only when the registry is already loaded (the matrix loads it, with any `--candidates` plug-in, before
    the evidence writer starts); a process that never loaded it (the gate, a merge) has none to record.
    """
    registry = sys.modules.get("ws1_kernels.registry")
    if registry is None:
        return ()
    return tuple(
        (e["profile"], e["module"], portable_path(e["file"]) if e["file"] else "", e["sha256"])
        for e in registry.plugin_sources()
    )


def _run(cmd: Sequence[str], cwd: Path) -> str | None:
    """stdout of a command, or None if it is missing, fails or hangs."""
    try:
        proc = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def source_dir() -> Path:
    """The directory the running ws1_harness package lives in (its checkout when installed editable)."""
    return Path(__file__).resolve().parent.parent


def portable_path(arg: str, base: Path | None = None) -> str:
    """An argument as evidence records it: machine paths never leak into committed evidence.

    An absolute path inside the checkout (or `base`) becomes relative to it; any other absolute path keeps only
    its last two parts behind `.../` (enough to read the command, nothing about the machine). Other arguments
    are unchanged.
    """
    if not arg.startswith("/"):
        return arg
    path = Path(arg)
    for root in (base, repo_root()):
        if root is not None:
            try:
                return str(path.resolve().relative_to(root.resolve())) or "."
            except ValueError:
                pass
    return ".../" + "/".join(path.parts[-2:])


def repo_root() -> Path | None:
    """The checkout holding this code (packages/ws1-harness/src/ws1_harness -> four levels up), if it is one."""
    root = source_dir().parents[3]
    return root if (root / "packages").is_dir() else None


def portable_command(argv: Sequence[str]) -> tuple[str, ...]:
    """`argv` with every path made portable (see `portable_path`); the program itself by its name only."""
    if not argv:
        return ()
    return (Path(argv[0]).name, *(portable_path(a) for a in argv[1:]))


class ProvenanceError(HarnessError):
    """A provenance claim that cannot be recorded truthfully (bad input: exit 2, one line)."""


def git_state(where: Path | None = None) -> tuple[str, bool, str]:
    """(commit, dirty, source) of the checkout holding `where` (default: this code).

    Dirty means any tracked change or untracked, non-ignored file. Anything unreadable gives
    ("unknown", True, "unknown").
    """
    where = where or source_dir()
    env_commit = os.environ.get("WS1_SOURCE_COMMIT")
    if env_commit:
        commit = env_commit.strip().lower()
        if not _COMMIT_RE.match(commit):
            # refused, not recorded as "unknown": an abbreviated hash once turned a whole GPU run's evidence
            # into commit-unknown evidence without a word
            raise ProvenanceError(
                f"WS1_SOURCE_COMMIT={env_commit!r}: give the full 40-hex commit (git rev-parse HEAD)"
            )
        return commit, os.environ.get("WS1_SOURCE_DIRTY", "1") != "0", "env"
    if shutil.which("git") is None:
        return UNKNOWN, True, UNKNOWN
    head = _run(["git", "rev-parse", "--verify", "HEAD"], where)
    status = _run(["git", "status", "--porcelain"], where)
    if head is None or status is None:
        return UNKNOWN, True, UNKNOWN
    return head.strip(), bool(status.strip()), "git"


def unknown_commit_hint(prov: Mapping[str, Any] | None = None) -> str | None:
    """What to do when a run (its provenance record; None: this process) cannot name its commit, else None.

    A non-editable install (`pip install packages/ws1-harness`) copies the code out of the checkout, so git
    cannot see it: the commit is "unknown" and the tree dirty, and `ws1 gate --require-clean` or
    `--expect-commit` can never pass. Gated runs install editable (what nox does) or state the commit.
    """
    if prov is None:
        prov = {"git_source": git_state()[2], "source_dir": portable_path(str(source_dir()))}
    if prov["git_source"] != UNKNOWN:
        return None
    return (
        f"the commit is unknown: the ws1_harness code at {prov['source_dir']} is not in a git checkout (a "
        "non-editable install?); for a gated run install with `pip install -e packages/...` (as nox does) or "
        "set WS1_SOURCE_COMMIT=<sha> and WS1_SOURCE_DIRTY=0"
    )


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _nvidia_driver() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], Path.cwd())
    return out.strip().splitlines()[0] if out and out.strip() else None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or UNKNOWN


def _cpu_isa() -> str | None:
    """e.g. "AVX512 +avx512_bf16 +amx_bf16" or "AVX2": torch's CPU capability and the bf16 flags of the host."""
    torch = sys.modules.get("torch")  # loaded by the run side; the verdict side never imports it
    if torch is None:
        return None
    try:
        isa = str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        return None
    try:
        flags = next(
            (
                ln.split(":", 1)[1].split()
                for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("flags")
            ),
            [],
        )
    except OSError:
        flags = []
    bf16 = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return " ".join([isa, *(f"+{f}" for f in bf16)])


def _device() -> tuple[str, str, str | None, str | None, str | None]:
    """(device, device_name, capability, driver, cuda) from torch when the run side has loaded it.

    The verdict side never imports torch: a merge or a gate records the host's CPU, and the run side (which
    has imported torch before it collects provenance) records the device it ran on.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return "cpu", _cpu_name(), None, None, None
    cuda = torch.version.cuda
    if torch.cuda.is_available():
        idx = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(idx)
        return "cuda", torch.cuda.get_device_name(idx), f"sm_{major}{minor}", _nvidia_driver(), cuda
    return "cpu", _cpu_name(), None, _nvidia_driver(), cuda


def _code_objects() -> tuple[tuple[str, int, int], ...]:
    """The CUDA extensions' kernels as the runtime reports them (the generic build, then the Hopper one), when the
    run side has loaded them (read through sys.modules: the verdict side imports no kernels)."""
    rows: list[dict[str, object]] = []
    for name in ("ws1_kernels.cuda", "ws1_kernels.cuda_sm90"):
        mod = sys.modules.get(name)
        if mod is not None:
            rows.extend(mod.kernel_attributes())
    return tuple(
        (str(r["name"]), int(r["binary_version"]), int(r["ptx_version"]))  # type: ignore[call-overload]
        for r in rows
        if not r.get("error")
    )


def _extension_archs() -> str | None:
    """`ws1_cuda_ext=<its recorded arch list>`, and `ws1_cuda_sm90_ext=9.0a` when the Hopper module is loaded
    (csrc/setup.py builds it for 9.0a alone), read through sys.modules like the code objects; None without any."""
    parts: list[str] = []
    cuda = sys.modules.get("ws1_kernels.cuda")
    if cuda is not None and cuda.extension() is not None:
        parts.append(f"ws1_cuda_ext={';'.join(cuda.built_targets())}")
    hopper = sys.modules.get("ws1_kernels.cuda_sm90")
    if hopper is not None and hopper.extension() is not None:
        parts.append("ws1_cuda_sm90_ext=9.0a")
    return " ".join(parts) or None


def collect_provenance(argv: Sequence[str] | None = None) -> Provenance:
    """Collect provenance now. Always call this; never accept provenance from a caller."""
    commit, dirty, src = git_state()
    device, name, cap, driver, cuda = _device()
    return Provenance(
        git_commit=commit,
        git_dirty=dirty,
        git_source=src,
        source_dir=portable_path(str(source_dir())),
        device=device,
        device_name=name,
        capability=cap,
        driver=driver,
        cuda=cuda,
        torch=_version("torch"),
        triton=_version("triton"),
        python=platform.python_version(),
        platform=platform.platform(),
        argv=portable_command(sys.argv if argv is None else argv),
        packages=tuple((p, _version(p)) for p in _PACKAGES),
        arch_proxy=os.environ.get("WS1_ARCH_PROXY") or None,
        cpu_isa=_cpu_isa(),
        plugins=plugin_sources(),
        code_objects=_code_objects(),
        extension_archs=_extension_archs(),
    )
