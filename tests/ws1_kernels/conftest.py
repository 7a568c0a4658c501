"""Make the shared test support importable as ``kernels_support`` (tests/ws1_kernels is not a package)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
