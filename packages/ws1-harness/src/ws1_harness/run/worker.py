"""A worker process that runs units one at a time, so a hung or crashing candidate costs one unit, not the sweep.

Without a time limit, a hung kernel once blocked an earlier CI for 90 minutes and no partial matrix came out.
The parent sends a task, waits at most the unit's limit, and on expiry kills the worker, records the unit as
red `timeout` and starts a fresh worker for the next unit. The worker keeps its caches (manifest, contract,
generated weights) between units while it lives.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from ws1_harness.run.tasks import UnitTask, crash_records, execute_task, timeout_records


def _serve(conn: Connection) -> None:
    """Worker main loop: receive a task, send back its records; None stops the loop."""
    while True:
        task = conn.recv()
        if task is None:
            return
        try:
            conn.send(("ok", execute_task(task)))
        except BaseException as exc:  # the parent turns this into an error cell
            conn.send(("crash", f"{type(exc).__name__}: {exc}".splitlines()[0]))


def death_message(exitcode: int | None) -> str:
    """How a worker ended, from its exit code: a signal by name (SIGKILL is what the out-of-memory killer sends),
    else its exit status. A dead worker once read "worker exited: " and nothing more."""
    if exitcode is None:
        return "stopped replying and did not exit"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (out of memory?)" if -exitcode == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with status {exitcode}"


@dataclass
class _Live:
    process: Any
    conn: Connection


class WorkerPool:
    """One worker at a time (the CPU has two cores and torch uses both); restarted after a timeout or crash."""

    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")  # no fork after torch's thread pools exist
        self._live: _Live | None = None

    def _start(self) -> _Live:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_serve, args=(child,), daemon=True)
        proc.start()
        child.close()
        return _Live(proc, parent)

    def run(self, task: UnitTask, limit_s: float) -> list[dict[str, Any]]:
        """Run `task` in the worker; a unit past `limit_s` is killed and recorded red `timeout`."""
        if self._live is None or not self._live.process.is_alive():
            self._live = self._start()
        live = self._live
        live.conn.send(task)
        if not live.conn.poll(limit_s):
            self._kill()
            return timeout_records(task, limit_s)
        try:
            kind, payload = live.conn.recv()
        except (EOFError, ConnectionError):
            live.process.join(timeout=10)  # the pipe closed because the process ended: read how it ended
            why = death_message(live.process.exitcode)
            self._kill()
            return crash_records(task, why)
        if kind == "crash":
            self._kill()
            return crash_records(task, payload)
        return payload  # type: ignore[no-any-return]

    def _kill(self) -> None:
        if self._live is not None:
            self._live.process.kill()
            self._live.process.join(timeout=10)
            self._live = None

    def close(self) -> None:
        if self._live is not None and self._live.process.is_alive():
            try:
                self._live.conn.send(None)
                self._live.process.join(timeout=10)
            except (BrokenPipeError, OSError):
                pass
        self._kill()
