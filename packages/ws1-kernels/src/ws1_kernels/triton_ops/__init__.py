"""The ``triton_cuda_bf16`` profile: Triton kernels, batch-invariant by construction.

One module per operator family; each holds its ``@triton.jit`` kernels, its ``torch.autograd.Function`` and the
public entry points, and exports for every operator it implements::

    OPS[operator] = triton_op(fn, kernels, declared_ops, forward)   # an ws1_kernels.backend.OpEntry

``forward`` is the kernel the forward launches, the candidate's primary id (``triton:<forward>``); ``kernels``
are the Triton kernel names the operator may launch (forward and backward), recorded at the launch site as
``triton:<name>`` (``_launch.launch``) and seen again by the harness through Triton's own launch hook;
``declared_ops`` are the aten overload packets the entry point may dispatch around its launches (allocation,
the host-to-device copy of the layout ids). ``BACKEND`` collects every module's ``OPS``.

Rules every kernel here follows (docs/kernels.md): each output element's reduction order depends only on the
reduced length; no split-K, no batch-dependent split-KV, no atomics on reduced values, no runtime autotuner
(tile tables are frozen and keyed by shape buckets); fp32 accumulation; parameter gradients under
``sample_blocks_main_grad``.  Under ``TRITON_INTERPRET=1`` the same kernels run on CPU tensors for logic tests.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from ..backend import Backend, OpEntry, collect_ops

PROFILE = "triton_cuda_bf16"
MIN_ARCH = "sm80"


def triton_op(
    fn: Callable[..., Any], kernels: frozenset[str], declared_ops: frozenset[str], forward: str
) -> OpEntry:
    """The entry of one Triton operator: its primary id is the forward kernel, as launch sites and the launch
    hook name it; every kernel it may launch is ``triton:<name>``."""
    if forward not in kernels:
        raise ValueError(f"triton_op: forward kernel {forward!r} is not among {sorted(kernels)}")
    return OpEntry(
        fn=fn,
        kernel_id=f"triton:{forward}",
        declared_ops=declared_ops,
        kernel_ids=frozenset(f"triton:{k}" for k in kernels),
    )


def triton_missing() -> str | None:
    """None when Triton imports, else a one-line reason."""
    try:
        import triton  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"triton does not import: {type(exc).__name__}: {exc}".splitlines()[0]
    return None


def _load() -> tuple[Mapping[str, OpEntry], str | None]:
    why = triton_missing()
    if why is not None:
        return {}, why
    found, broken = collect_ops(sys.modules[__name__])
    if broken:  # Triton imports, so a module that does not is a bug to see, never a silently missing operator
        name, reason = next(iter(broken.items()))
        raise ImportError(f"{name}: {reason}")
    return found, None


BACKEND = Backend(device="cuda", min_arch=MIN_ARCH, param_grad_rule="sample_blocks_main_grad", load=_load)
