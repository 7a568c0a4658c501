"""Compile every Triton kernel that the `triton_cuda_bf16` operators launch at full Qwen3-8B widths, forward and
backward, for sm_80, sm_86, sm_89 and sm_90, and print, as JSON, each one's shared memory (Triton's metadata),
registers and stack bytes (the wheel's cuobjdump).

How the launches are found without a GPU: every operator runs on CPU tensors of the full widths (zeros; values do
not matter), with the modules' `launch` replaced by a recorder that keeps the kernel, its arguments and its
constexprs and launches nothing. The recorded launches are then compiled for each arch (Triton's `GPUTarget`, the
wheel's ptxas). The GEMM's forward tiles at these M are a subset of what `triton_arch_measure.py` compiles (every
tile of its frozen tables); its weight gradient is compiled only here.

Run as a script in a process without TRITON_INTERPRET: `test_triton_arch_limits.py` does that and judges.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

from triton_arch_measure import resource_row

ARCHS = (80, 86, 89, 90)
ROWS = (16, 640)  # a decode-sized and a prefill-sized call: tiles that follow M are seen on both sides
OPTION_NAMES = frozenset({"num_warps", "num_stages", "num_ctas", "enable_fp_fusion", "maxnreg"})

_DTYPES = {
    "torch.bfloat16": "*bf16",
    "torch.float32": "*fp32",
    "torch.float64": "*fp64",
    "torch.int64": "*i64",
    "torch.int32": "*i32",
}


def _type_of(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return _DTYPES[str(value.dtype)]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i64" if abs(value) >= 2**31 else "i32"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"unsupported kernel argument {type(value).__name__}")


def record_launches() -> list[dict[str, Any]]:
    """Run every operator forward and backward with a recording `launch`; the unique launches."""
    import torch

    from ws1_contract import operators as spec
    from ws1_kernels import LayoutContext, triton_ops
    from ws1_kernels.backend import collect_ops
    from ws1_kernels.triton_ops import _launch
    from ws1_workload import load_manifest

    seen: dict[str, dict[str, Any]] = {}

    def recorder(kernel: Any, grid: Any, phase: str, *args: Any, **kwargs: Any) -> None:
        params = kernel.params
        signature: dict[str, str] = {}
        constexprs: dict[str, Any] = {}
        options = {k: v for k, v in kwargs.items() if k in OPTION_NAMES}
        given = dict(zip((p.name for p in params), args, strict=False))
        given.update({k: v for k, v in kwargs.items() if k not in OPTION_NAMES})
        for p in params:
            value = given.get(p.name)
            if p.is_constexpr or value is None:
                signature[p.name] = "constexpr"
                constexprs[p.name] = value
            else:
                signature[p.name] = _type_of(value)
        key = json.dumps([kernel.fn.__name__, signature, constexprs, options], sort_keys=True, default=str)
        seen.setdefault(
            key, {"kernel": kernel, "signature": signature, "constexprs": constexprs, "options": options}
        )

    _launch.interpreting = lambda: True  # type: ignore[assignment]  # CPU tensors pass check_device
    ops, broken = collect_ops(triton_ops)  # imports every operator module; nothing launches until called
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("ws1_kernels.triton_ops") and hasattr(mod, "launch"):
            mod.launch = recorder  # type: ignore[attr-defined]
    if broken:
        raise ImportError(str(broken))

    cfg = load_manifest(None).model("qwen3-8b")
    widths = {"H": cfg.hidden, "V": cfg.vocab, "F": cfg.intermediate, "Hq": cfg.num_heads,
              "Hkv": cfg.num_kv_heads, "D": cfg.head_dim}  # fmt: skip
    model = type("M", (), {"head_dim": cfg.head_dim, "rms_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta})
    for op, entry in spec.operators().items():
        if entry.layout_only or op not in ops:
            continue
        for rows in ROWS:
            values: dict[str, Any] = {}
            leaves = []
            for inp in entry.inputs:
                shape = tuple(spec.evaluate(d, widths) for d in inp.shape)
                if inp.role == "param":
                    t = torch.zeros(shape, dtype=torch.bfloat16, requires_grad=True)
                    t.main_grad = torch.zeros(shape, dtype=torch.float32)  # type: ignore[attr-defined]
                elif inp.role == "float":
                    t = torch.zeros((rows, *shape), dtype=torch.bfloat16, requires_grad=True)
                else:
                    t = torch.zeros(rows, dtype=torch.int64)
                values[inp.name] = t
                if t.requires_grad:
                    leaves.append(t)
            ctx = LayoutContext(torch.zeros(rows, dtype=torch.int64), torch.arange(rows, dtype=torch.int64))
            args = [values[a] if a in values else spec.scalar(a, model) for a in entry.call]
            out = ops[op].fn(*args, ctx)
            if entry.differentiable and out.requires_grad:
                out.backward(torch.zeros_like(out))
    return list(seen.values())


def measure() -> list[dict[str, object]]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    out: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for launch in record_launches():
            kernel = launch["kernel"]
            opts = dict(launch["options"])
            for cc in ARCHS:
                src = ASTSource(fn=kernel, signature=launch["signature"], constexprs=launch["constexprs"])
                compiled = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=opts)
                consts = {k: v for k, v in launch["constexprs"].items() if v is not None}
                label = f"{kernel.fn.__name__} {consts}"
                out.append(resource_row(compiled, cc, int(opts.get("num_warps", 4)), label, tmp))
    return out


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET"):
        sys.exit("triton_launch_measure.py: unset TRITON_INTERPRET (interpreted kernels cannot be compiled)")
    json.dump(measure(), sys.stdout)
