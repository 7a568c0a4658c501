"""docs/triton/tiles.md is the code's tile tables, regenerated: a hand edit or a code change alone fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "triton" / "tiles.md"


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "ci/tile_doc.py", "--check", str(path)], cwd=REPO, capture_output=True, text=True
    )


def test_the_committed_tile_page_matches_the_code() -> None:
    done = _check(PAGE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_stale_tile_page_is_caught(tmp_path: Path) -> None:
    """Negative control: the page with one stage count changed (the drift once found in gemm.md) fails."""
    stale = tmp_path / "tiles.md"
    text = PAGE.read_text(encoding="utf-8")
    assert "| 4 | 8 | no |" in text
    stale.write_text(text.replace("| 4 | 8 | no |", "| 4 | 6 | no |", 1), encoding="utf-8")
    done = _check(stale)
    assert done.returncode == 1 and "differs from the code" in done.stdout
