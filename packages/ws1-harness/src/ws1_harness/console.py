"""Printing for the `ws1` commands: a reader that goes away is not an error.

`ws1 gate FILE | head -2` once ended in "internal error: BrokenPipeError", exit 2: the bad-input code for a
verdict that was fine. Here a closed stdout silences the rest of the output and the command keeps its own exit
code (the gate's verdict), as `head` users expect. No torch here.
"""

from __future__ import annotations

import contextlib
import os
import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C


def silence_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so neither later prints nor Python's flush at exit raise again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def emit(text: str) -> bool:
    """Print `text` to stdout and flush; False (and stdout silenced) when the reader has closed the pipe."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
        return False
    return True
