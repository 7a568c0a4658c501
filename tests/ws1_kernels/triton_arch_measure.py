"""Compile every tile of the Triton GEMM's frozen tables for sm_80, sm_86, sm_89 and sm_90 and print, as JSON, the
shared memory (Triton's metadata), registers and stack bytes (the wheel's cuobjdump) of each.

Run as a script in a process without TRITON_INTERPRET (under the interpreter the kernels are not compilable):
`test_triton_arch_limits.py` does that and judges the figures.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ARCHS = (80, 86, 89, 90)
SIGNATURE = {
    **dict.fromkeys(("a_ptr", "b_ptr", "c_ptr"), "*bf16"),
    **dict.fromkeys(("M", "N", "K", "stride_am", "stride_bk", "stride_bn", "stride_cm", "num_progs"), "i32"),
    **dict.fromkeys(("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "EVEN_K", "IEEE"), "constexpr"),
}


def resource_row(compiled: object, cc: int, warps: int, label: str, tmp: str) -> dict[str, object]:
    """One compiled kernel's row: shared memory (Triton's metadata), registers and stack (the wheel's cuobjdump)."""
    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    cubin = Path(tmp) / f"k-{cc}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])  # type: ignore[attr-defined]
    usage = subprocess.run(
        [str(cuobjdump), "--dump-resource-usage", str(cubin)], capture_output=True, text=True, check=True
    ).stdout
    regs, stack = re.search(r"REG:(\d+)", usage), re.search(r"STACK:(\d+)", usage)
    return {
        "tile": label,
        "warps": warps,
        "cc": cc,
        "shared": int(compiled.metadata.shared),  # type: ignore[attr-defined]
        "registers": int(regs.group(1)) if regs else -1,
        "stack": int(stack.group(1)) if stack else 0,
    }


def measure() -> list[dict[str, object]]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ws1_kernels.triton_ops import gemm as G

    tables = [G.DEFAULT_TABLE, *G.FWD_TABLES.values(), *G.DX_TABLES.values()]
    tiles = sorted({tile for table in tables for _, tile in table.buckets}, key=repr)
    out: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for tile in tiles:
            consts = {
                "BLOCK_M": tile.block_m,
                "BLOCK_N": tile.block_n,
                "BLOCK_K": tile.block_k,
                "GROUP_M": tile.group_m,
                "EVEN_K": True,
                "IEEE": False,
            }
            for cc in ARCHS:
                src = ASTSource(fn=G.ws1_gemm_fixed_k, signature=SIGNATURE, constexprs=consts)
                opts = {"num_warps": tile.num_warps, "num_stages": tile.num_stages}
                kernel = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=opts)
                out.append(resource_row(kernel, cc, tile.num_warps, repr(tile), tmp))
    return out


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET"):
        sys.exit("triton_arch_measure.py: unset TRITON_INTERPRET (interpreted kernels cannot be compiled)")
    json.dump(measure(), sys.stdout)
