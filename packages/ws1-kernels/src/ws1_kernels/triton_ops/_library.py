"""Define an inference op in the ``ws1_triton`` namespace with the dispatcher's cheapest path.

Why not ``torch.library.custom_op``: its every call runs Python wrappers around the kernel (an autograd
wrapper that redispatches, then an aliasing check of the outputs), about 9 us a call under ``no_grad`` on a
2-core CI host against about 2 us for an op defined with ``torch.library.Library`` and a backend kernel
(`ci/host_cost_triton.py` times both layers on a GPU). The step path's ops are inference only: they need no
autograd formula, only a fake implementation so ``torch.compile`` can trace them as opaque nodes, which
``torch.library.register_fake`` gives an op of either kind.

With the C++ step path built (``native.py``), a step op's CUDA kernel is C++ and the decorated function becomes
the CUDA kernel of its twin ``<op>_py``, which the C++ kernel calls on a miss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import native

NAMESPACE = "ws1_triton"
#: one fragment for the namespace's inference ops (the training ops are ``custom_op``s in the same namespace)
_LIB = torch.library.Library(NAMESPACE, "FRAGMENT")


def inference_op(schema: str, fake: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Define ``ws1_triton::<schema>``, run by the decorated function on CUDA (and on the CPU, where the
    interpreter runs Triton kernels for the logic tests), with ``fake`` as its fake implementation."""

    def define(fn: Callable[..., Any]) -> Callable[..., Any]:
        name = schema.split("(", 1)[0]
        _LIB.define(schema)
        if name in native.NATIVE_OPS and native.available():  # CUDA: the C++ kernel, which calls the twin
            _LIB.define(schema.replace(f"{name}(", f"{name}_py(", 1))
            _LIB.impl(f"{name}_py", native.twin(fn), "CUDA")
            _LIB.impl(name, fn, "CPU")
        else:
            for key in ("CUDA", "CPU"):
                _LIB.impl(name, fn, key)
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIB)
        return fn

    return define
