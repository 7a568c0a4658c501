"""What a command line does when its reader leaves (`ws1-contract validate | head -c 3`).

Python raises BrokenPipeError at the next write, and again when it flushes stdout at exit, which printed a
traceback. A reader that closes the pipe only silences the output: stdout is pointed at /dev/null and the
command exits with the shell's code for SIGPIPE.
"""

from __future__ import annotations

import os
import sys

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


def quiet_broken_pipe() -> int:
    """Silence stdout for the rest of the process; returns the exit code to use."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor behind stdout: nothing left to flush
        pass
    return EXIT_BROKEN_PIPE
