"""Typed errors of the workload package.

Every message is one line, `<where>: <what>`, so a CLI can print it as is and exit 2; callers branch on the
type, never on the text.
"""

from __future__ import annotations


class WorkloadError(Exception):
    """Bad manifest, fixture request, checkpoint or reference-chain input."""

    def __init__(self, message: str, where: str | None = None) -> None:
        text = f"{where}: {message}" if where else message
        super().__init__(" ".join(text.split()))
        self.where = where

    def __str__(self) -> str:  # one line, always
        return self.args[0]


class LayoutError(WorkloadError):
    """A physical layout or its restore map is inconsistent (missing, extra or duplicate logical keys)."""
