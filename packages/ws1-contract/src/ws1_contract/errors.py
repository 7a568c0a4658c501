"""The one error type of ws1_contract.

Every failure a user can cause (a missing file, bad JSON, a schema or semantic violation, an unknown name) is a
ContractError whose text is a single line `<where>: <what>`, so a command line can print it and exit 2 without a
traceback, and a caller can still read `.path` and `.message` separately.
"""

from __future__ import annotations

_MAX_MESSAGE = 400  # long enough for any rule's message, short enough that a repr'd document stays one line


def _one_line(text: str) -> str:
    """Collapse newlines and trim, so the error always prints as exactly one line."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= _MAX_MESSAGE else flat[: _MAX_MESSAGE - 3] + "..."


class ContractError(ValueError):
    """A contract, schema or resolution error: `str(err)` is `<where>: <what>` on one line."""

    def __init__(self, message: str, path: str = "") -> None:
        self.message = _one_line(message)
        self.path = _one_line(path)
        super().__init__(f"{self.path}: {self.message}" if self.path else self.message)
