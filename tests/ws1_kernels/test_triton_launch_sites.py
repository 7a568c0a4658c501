"""Every Triton launch of the profile goes through `_launch.launch`: the one place that records the kernel id
(the harness compares it with what Triton really launched) and takes the bound-kernel fast path.

Read from the sources (no Triton needed): a call of a subscript, `something[grid](...)`, anywhere in
`triton_ops` other than the launch modules is a launch that skips both. The control feeds the finder a planted
direct launch.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ws1_kernels.triton_ops as triton_ops

LAUNCH_MODULES = {"_launch.py", "_bound.py"}


def direct_launches(source: str) -> list[int]:
    """Line numbers of ``X[...](...)`` calls in ``source``."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
    )


def test_no_triton_op_module_launches_a_kernel_directly() -> None:
    folder = Path(triton_ops.__file__).parent
    modules = sorted(p for p in folder.glob("*.py") if p.name not in LAUNCH_MODULES)
    assert len(modules) >= 8, f"expected the Triton op modules under {folder}"
    found = {p.name: lines for p in modules if (lines := direct_launches(p.read_text()))}
    assert found == {}, f"launches outside _launch.launch (file: lines): {found}"


def test_a_planted_direct_launch_is_found() -> None:
    planted = "def f(x):\n    y = table[0]\n    _kernel[(4,)](x, 1, BLOCK=16)\n    return y\n"
    assert direct_launches(planted) == [3]
    assert direct_launches("def f(x):\n    return launch(_kernel, (4,), 'fwd', x)\n") == []  # control
