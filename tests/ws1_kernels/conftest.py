"""Make the shared test support importable as ``kernels_support`` (tests/ws1_kernels is not a package)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402


@pytest.fixture
def seq_dot(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tl.dot`` = the accumulator plus each k's products in ascending k (restored after the test)."""
    from kernels_support import sequential_dot
    from triton.runtime import interpreter as interp

    monkeypatch.setattr(interp.InterpreterBuilder, "create_dot", sequential_dot)
