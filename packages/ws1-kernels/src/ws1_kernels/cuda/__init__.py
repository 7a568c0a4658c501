"""The ``cuda_bf16`` profile: ws1's own CUDA kernels (``csrc/``), registered as torch ops ``torch.ops.ws1.*``.

The kernels live in ``csrc/kernels/*.cu`` (raw pointers, sizes and a stream) and one binding file,
``csrc/ws1_ops.cpp``, registers each as a torch op with a CUDA and a Meta implementation; this package layers
autograd, the layout context and the ``sample_blocks_main_grad`` rule on top, one module per operator family,
each exporting ``OPS[operator] = OpEntry(...)``. The extension module (``ws1_cuda_ext``) is built per arch by
``nox -s gpu_sm90`` / ``nox -s gpu_sm86`` (``csrc/setup.py``, an explicit ``TORCH_CUDA_ARCH_LIST``); without it
the profile is a declared name whose every cell says the extension is not built, and nothing falls back to
another profile's kernels. On a device the build holds no code for, every candidate says which device and which
archs (``available``).

The rules are those of ``triton_ops``: each output element's reduction order depends only on the reduced length;
no split-K, no batch-dependent split-KV, no atomics on reduced values; fp32 accumulation.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from functools import lru_cache
from types import ModuleType

import torch

from ..backend import Backend, OpEntry, collect_ops

PROFILE = "cuda_bf16"
MIN_ARCH = "sm80"
EXTENSION = "ws1_cuda_ext"


@lru_cache(maxsize=1)
def extension() -> ModuleType | None:
    """The built extension module (importing it registers ``torch.ops.ws1.*``), or None."""
    try:
        import ws1_cuda_ext  # type: ignore[import-not-found]
    except ImportError:
        return None
    return ws1_cuda_ext  # type: ignore[no-any-return]


def missing_reason() -> str | None:
    if extension() is None:
        return (
            f"the ws1 CUDA extension ({EXTENSION}, csrc/) is not built here: `nox -s gpu_sm90` or "
            "`nox -s gpu_sm86` builds it (csrc/setup.py)"
        )
    return None


def built_targets() -> tuple[str, ...]:
    """The arch list the extension was built for (``TORCH_CUDA_ARCH_LIST``), e.g. ``("8.0", "9.0a")``."""
    ext = extension()
    return () if ext is None else tuple(a for a in re.split(r"[;, ]+", ext.built_targets()) if a)


def runs_on(capability: tuple[int, int], targets: tuple[str, ...]) -> bool:
    """Whether code built for ``targets`` runs on a device of ``capability``: machine code of the same major
    arch and no newer minor (``9.0a`` only on 9.0 exactly), or PTX of an arch not newer than the device."""
    cc = capability[0] * 10 + capability[1]
    for t in targets:
        m = re.fullmatch(r"(\d+)\.(\d+)(a?)(\+PTX)?", t)
        if m is None:
            continue
        arch = int(m.group(1)) * 10 + int(m.group(2))
        if m.group(4) and arch <= cc and not m.group(3):
            return True
        if m.group(3) and arch == cc:
            return True
        if not m.group(3) and int(m.group(1)) == capability[0] and arch <= cc:
            return True
    return False


def _available(device: str) -> str | None:
    why = missing_reason()
    if why is not None:
        return why
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return f"needs a CUDA device, asked for {device}"
    major, minor = torch.cuda.get_device_capability(dev)
    targets = built_targets()
    if not runs_on((major, minor), targets):
        name = torch.cuda.get_device_name(dev)
        return (
            f"the ws1 CUDA extension holds code for {';'.join(targets) or 'no arch'}, none of which runs on "
            f"{name} (sm_{major}{minor}): rebuild it for this device"
        )
    return None


#: the fields of a built module's `kernel_attributes()` rows (csrc/binding.h `AttributeRow`), in order
ATTRIBUTE_KEYS = (
    "name",
    "binary_version",
    "ptx_version",
    "registers",
    "shared_bytes",
    "local_bytes",
    "max_threads",
    "error",
)


def attribute_dicts(ext: ModuleType | None) -> list[dict[str, object]]:
    """A built module's `kernel_attributes()` rows as dicts keyed by `ATTRIBUTE_KEYS` ([] when it is not built):
    both extensions (this one and the Hopper one) report their kernels the same way."""
    return (
        []
        if ext is None
        else [dict(zip(ATTRIBUTE_KEYS, row, strict=True)) for row in ext.kernel_attributes()]
    )


def kernel_attributes() -> list[dict[str, object]]:
    """What the runtime reports of each kernel of the build on the current device: binary and PTX versions
    (which code runs: an sm86 proxy must show PTX 86 JIT-compiled), registers, shared and local memory."""
    return attribute_dicts(extension())


def own_ops(module_name: str) -> Mapping[str, OpEntry]:
    """The operators a built profile's package registers (`collect_ops`). The extension is there when this runs,
    so a module of the package that does not import is a bug to see: ImportError, never a silent gap."""
    found, broken = collect_ops(sys.modules[module_name])
    if broken:
        name, reason = next(iter(broken.items()))
        raise ImportError(f"{name}: {reason}")
    return found


def _load() -> tuple[Mapping[str, OpEntry], str | None]:
    why = missing_reason()
    if why is not None:
        return {}, why
    return own_ops(__name__), None


BACKEND = Backend(
    device="cuda",
    min_arch=MIN_ARCH,
    param_grad_rule="sample_blocks_main_grad",
    load=_load,
    available=_available,
)
