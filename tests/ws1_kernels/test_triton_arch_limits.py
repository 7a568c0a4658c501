"""Every tile of the Triton GEMM's frozen tables compiles for sm_80, sm_86, sm_89 and sm_90 within that arch's limits.

The tables were tuned on the H200 (sm_90: 227 KB of shared memory per block, TMA). An sm_86 card has 99 KB and no
TMA; nothing ran there. Triton compiles for any arch on this CPU machine (its own ptxas), so each tile is compiled
for each arch and its shared memory (Triton's metadata) and registers (the wheel's cuobjdump) are checked against
the arch's per-block shared-memory limit and the 64K-register file. Stack use (spills) is printed, not judged:
the production tiles use some on sm_90 too. The negative control feeds the check a tile over the sm_86 limit.
The GEMM is the kernel with the largest tiles; the other Triton kernels are not covered yet.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ws1_kernels.triton_ops import gemm as G  # noqa: E402

#: the largest dynamic shared memory one block may opt into, in bytes, and the register file per SM
SHARED_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
REGISTER_FILE = 65536
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
SIGNATURE = {
    **dict.fromkeys(("a_ptr", "b_ptr", "c_ptr"), "*bf16"),
    **dict.fromkeys(("M", "N", "K", "stride_am", "stride_bk", "stride_bn", "stride_cm", "num_progs"), "i32"),
    **dict.fromkeys(("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "EVEN_K", "IEEE"), "constexpr"),
}


def _tiles() -> list[G.Tile]:
    tables = [G.DEFAULT_TABLE, *G.FWD_TABLES.values(), *G.DX_TABLES.values()]
    return sorted({tile for table in tables for _, tile in table.buckets}, key=repr)


def limit_problems(cc: int, shared: int, registers: int, warps: int) -> list[str]:
    """Why a compiled tile does not fit the arch (empty when it fits)."""
    out = []
    if shared > SHARED_LIMIT[cc]:
        out.append(f"shared memory {shared} B over sm_{cc}'s {SHARED_LIMIT[cc]} B")
    if registers * warps * 32 > REGISTER_FILE:
        out.append(f"{registers} registers x {warps * 32} threads over the {REGISTER_FILE}-register file")
    return out


def _compile(tile: G.Tile, cc: int) -> tuple[int, int, int]:
    """(shared bytes, registers, stack bytes) of the tile compiled for sm_<cc>."""
    consts = {
        "BLOCK_M": tile.block_m,
        "BLOCK_N": tile.block_n,
        "BLOCK_K": tile.block_k,
        "GROUP_M": tile.group_m,
        "EVEN_K": True,
        "IEEE": False,
    }
    src = ASTSource(fn=G.ws1_gemm_fixed_k, signature=SIGNATURE, constexprs=consts)
    opts = {"num_warps": tile.num_warps, "num_stages": tile.num_stages}
    kernel = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=opts)
    cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"ws1-tile-{os.getpid()}-{cc}.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    try:
        usage = subprocess.run(
            [str(CUOBJDUMP), "--dump-resource-usage", str(cubin)], capture_output=True, text=True, check=True
        ).stdout
    finally:
        cubin.unlink(missing_ok=True)
    regs, stack = re.search(r"REG:(\d+)", usage), re.search(r"STACK:(\d+)", usage)
    assert regs is not None, usage
    return int(kernel.metadata.shared), int(regs.group(1)), int(stack.group(1)) if stack else 0


@pytest.mark.parametrize("cc", sorted(SHARED_LIMIT))
@pytest.mark.parametrize("tile", _tiles(), ids=repr)
def test_gemm_tile_fits_the_arch(tile: G.Tile, cc: int) -> None:
    shared, regs, stack = _compile(tile, cc)
    print(f"sm_{cc} {tile}: shared {shared} B, {regs} registers, stack {stack} B")
    assert limit_problems(cc, shared, regs, tile.num_warps) == []


def test_a_tile_over_the_sm86_limit_is_caught() -> None:
    """Negative control: 128 KB of shared memory fits sm_90 and not sm_86; 255 registers x 512 threads fits none."""
    assert limit_problems(90, 131072, 128, 4) == []
    assert limit_problems(86, 131072, 128, 4) == ["shared memory 131072 B over sm_86's 101376 B"]
    assert limit_problems(90, 1024, 255, 16) != []
