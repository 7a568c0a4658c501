"""The ``cuda_bf16_sm90`` profile: Hopper kernels (sm_90a: TMA, wgmma) where they decide the speed, the generic
``cuda_bf16`` kernels everywhere else.

The Hopper kernels live in ``csrc/sm90/`` and build into their own extension, ``ws1_cuda_sm90_ext`` (registering
``torch.ops.ws1_sm90.*``), for sm_90a alone; ``nox -s gpu_sm90`` builds it beside ``ws1_cuda_ext``. An operator
this package does not override runs the generic candidate unchanged, and its kernel id (``ws1.cuda.*``) says so:
nothing here pretends a generic kernel is a Hopper one.

Fail-closed off capability 9.0: wgmma and ``setmaxnreg`` exist on sm_90a only (not on an sm_100 or sm_120 part,
which runs other instructions), so every candidate is unavailable there, with the device's name and the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from types import ModuleType

import torch

from .. import cuda
from ..backend import Backend, OpEntry

PROFILE = "cuda_bf16_sm90"
MIN_ARCH = "sm90"
EXTENSION = "ws1_cuda_sm90_ext"
CAPABILITY = (9, 0)


@lru_cache(maxsize=1)
def extension() -> ModuleType | None:
    """The built Hopper extension (importing it registers ``torch.ops.ws1_sm90.*``), or None."""
    try:
        import ws1_cuda_sm90_ext  # type: ignore[import-not-found]
    except ImportError:
        return None
    return ws1_cuda_sm90_ext  # type: ignore[no-any-return]


def missing_reason() -> str | None:
    """Why the profile has no candidates here (an extension is not built), or None."""
    generic = cuda.missing_reason()
    if generic is not None:
        return generic
    if extension() is None:
        return (
            f"the ws1 Hopper extension ({EXTENSION}, csrc/sm90/) is not built here: `nox -s gpu_sm90` builds it "
            "(csrc/setup.py with 9.0a in TORCH_CUDA_ARCH_LIST and CUTLASS's headers)"
        )
    return None


def capability_reason(name: str, capability: tuple[int, int]) -> str | None:
    """Why a device of ``capability`` cannot run the sm_90a kernels, or None (9.0 exactly)."""
    if capability == CAPABILITY:
        return None
    major, minor = capability
    return (
        f"{PROFILE} needs compute capability 9.0 (sm_90a code: TMA, wgmma); {name} is sm_{major}{minor}, which "
        "cannot run it: use cuda_bf16 or triton_cuda_bf16 there"
    )


def _available(device: str) -> str | None:
    why = missing_reason()
    if why is not None:
        return why
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return f"needs a CUDA device of capability 9.0, asked for {device}"
    why = capability_reason(torch.cuda.get_device_name(dev), torch.cuda.get_device_capability(dev))
    return why if why is not None else cuda.BACKEND.available(device)


def kernel_attributes() -> list[dict[str, object]]:
    """What the runtime reports of each Hopper kernel on the current device (``cuda.kernel_attributes``'s keys)."""
    return cuda.attribute_dicts(extension())


def _loaded() -> ModuleType:
    """The built Hopper extension, or a RuntimeError with the reason it is missing."""
    ext = extension()
    if ext is None:
        raise RuntimeError(missing_reason())
    return ext


def gemm_bucket(m: int) -> int:
    """The Hopper GEMM's M bucket for ``m`` rows, as the extension computes it (0 small, 1 mid, 2 large)."""
    return int(_loaded().gemm_bucket(m))


def linear_logp_bucket(m: int) -> int:
    """linear_logp's fused forward's M bucket for ``m`` rows, as the extension computes it (0 small, 1 mid, 2
    large): its own table (``logprob.FUSED_BUCKETS``), since every tile gives the same bits and only speed picks."""
    return int(_loaded().linear_logp_bucket(m))


def _load() -> tuple[Mapping[str, OpEntry], str | None]:
    why = missing_reason()
    if why is not None:
        return {}, why
    generic, why = cuda.BACKEND.load()
    if why is not None:
        return {}, why
    return {**generic, **cuda.own_ops(__name__)}, None


BACKEND = Backend(
    device="cuda",
    min_arch=MIN_ARCH,
    param_grad_rule="sample_blocks_main_grad",
    load=_load,
    available=_available,
)
