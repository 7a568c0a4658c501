"""The base of every error the harness raises on bad input: the `ws1` command catches it, prints its one line
and exits 2. Anything else that escapes a command is a bug in ws1 and is reported as an internal error.

No torch here: the verdict side (evidence, merge, gate, report) raises these too.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Bad input to the harness (arguments, evidence files, cells). The message is one line: '<where>: <what>'."""
