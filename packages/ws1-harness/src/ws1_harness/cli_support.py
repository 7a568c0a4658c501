"""Checks shared by the `ws1` subcommands: usage errors, `--out` folders and files, the run extra.

Split from `cli` so that a subcommand's own module (`chain_args`) can use them without importing `cli`, which
imports it: one direction only, no cycle.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ws1_harness.errors import HarnessError


class UsageError(HarnessError):
    """Bad command-line arguments (raised instead of argparse's print-and-exit)."""


def out_dir(value: str, command: str, *, create: bool = True, allow_in_checkout: bool = True) -> Path:
    """An `--out` directory that exists (created here unless `create` is false) and is writable, or one
    UsageError line saying why not.

    An empty value once wrote into the current folder, and a file (or a path under a file, or /proc) ended in
    "internal error: FileExistsError". Unless `allow_in_checkout`, a directory inside the git checkout (not
    ignored) is refused before it is created: the refusal once came after the directory had been made.
    """
    where = f"ws1 {command}: --out {value!r}"
    if not value.strip():
        raise UsageError(f"ws1 {command}: --out is empty: name a directory outside the checkout")
    path = Path(value)
    for probe in (path, *path.parents):
        if probe.exists() and not probe.is_dir():
            what = "is a file" if probe == path else f"lies under {str(probe)!r}, which is a file"
            raise UsageError(f"{where} {what}, not a directory")
    if not create:
        return path
    if not allow_in_checkout:
        from ws1_harness.verdict.evidence import check_outside_checkout

        check_outside_checkout(path / "probe.json")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"{where}: cannot create the directory ({exc.strerror or type(exc).__name__})"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{where}: the directory is not writable")
    return path


def out_file(value: str, command: str, inputs: Sequence[str] = (), *, allow_in_checkout: bool = True) -> Path:
    """An `--out` JSON file whose folder is usable and that is none of the `inputs` (never overwrite an input)."""
    where = f"ws1 {command}: --out {value!r}"
    if not value.strip():
        raise UsageError(f"ws1 {command}: --out is empty: name a .json file outside the checkout")
    if not value.endswith(".json"):
        raise UsageError(f"{where}: must end in .json")
    path = Path(value)
    if path.is_dir():
        raise UsageError(f"{where} is a directory, not a file")
    out_dir(str(path.parent), command, allow_in_checkout=allow_in_checkout)
    target = path.resolve()
    for given in inputs:
        if Path(given).resolve() == target:
            raise UsageError(f"{where} is also an input ({given}): write the result to a new file")
    return path


# What the execution commands need beyond the torch-free verdict side (`pip install "ws1-harness[run]"`).
RUN_MODULES = ("torch", "ws1_workload", "ws1_kernels")


def require_run_extra(command: str) -> None:
    """Refuse an execution command in an install of the verdict side alone, with one line saying what to add.

    `ws1 gate`, `merge` and `report` need no torch (a gate machine need not have it); `matrix`, `bench` and
    `chain` run candidates and need torch and the workload and kernel packages.
    """
    import importlib.util

    missing = [m for m in RUN_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(
            f"ws1 {command}: needs {', '.join(missing)}, which this install lacks "
            "(from a checkout: pip install -e packages/ws1-contract -e packages/ws1-workload "
            '-e packages/ws1-kernels -e "packages/ws1-harness[run]"; the packages are on no index)'
        )
