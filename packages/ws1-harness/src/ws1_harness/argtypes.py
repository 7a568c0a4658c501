"""argparse value types shared by the `ws1` subcommands (no torch here: `ws1 --help` stays fast)."""

from __future__ import annotations

import argparse
import math


def positive(value: str) -> float:
    """A finite number > 0 (`inf` and `1e400` once ended in "internal error: OverflowError")."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not (x > 0 and math.isfinite(x)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0: {value!r}")
    return x


def positive_int(value: str) -> int:
    """An integer >= 1 (`--mm-n -4` once recorded an error ceiling and exited 0; 0 silently meant 512)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {value!r}")
    return n
