"""Evidence written under a stated commit in tests: shards written under one claim merge."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

REAL_COMMIT = "a" * 40  # the commit every in-process test run claims, so their shards merge


@contextlib.contextmanager
def stated_commit(commit: str) -> Iterator[None]:
    """Evidence written inside claims `commit`, clean (WS1_SOURCE_COMMIT/DIRTY), restored after: shards written
    under one claim merge."""
    saved = {k: os.environ.get(k) for k in ("WS1_SOURCE_COMMIT", "WS1_SOURCE_DIRTY")}
    os.environ.update(WS1_SOURCE_COMMIT=commit, WS1_SOURCE_DIRTY="0")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
