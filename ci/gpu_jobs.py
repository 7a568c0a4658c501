"""Run a GPU session's commands side by side: the builds, the GPU tests and each profile's matrix.

Why: run one after another, the sm90 session took over ten minutes (two builds of about a minute each, two minutes
of GPU tests, six matrices of 20-60 s), while the GPU and the machine's 16 cores sat mostly idle. The commands are
independent except for the build: the Triton and stock profiles and the tests that need no extension run while
csrc/ compiles, and the rest start as soon as it is done. Running side by side changes no verdict: every kernel
judged here is batch-invariant by construction (no atomics, no split depending on load), and speed is never
measured in these sessions (`ws1 bench` runs alone).

At most `slots` GPU commands run at once (each one's caching allocator holds memory; six test workers once
exhausted the H200's 140 GB), and commands that use no GPU (the builds) run beside them. With a `slot_dir` the
slots belong to the machine, not to one session: each slot is a lock file there (`flock`), so the sm86 and sm90
sessions run at once (the merged run) share the card's slots instead of doubling them, and the lock of a session
that dies is released by the kernel, never left stale. The sessions take turns: a session with a command ready
and no slot holds a ticket there (`wait-<pid>-<runner>`: how many GPU commands it has started, and since when it
waits), and a free slot goes to the waiting session that has started the fewest (then the one waiting longest).
Without turns, the session with the longer queue retook each slot it freed in the same poll, and the other never
got one (the sm86 session of the merged call at 9dd0891 started no GPU command). Each command writes its own log; the session prints a line as each starts and ends, and the tail of the log of any that failed. The times
are written to `session-times.json` beside the evidence, so the evidence says what each profile cost.

A light GPU command (the tiny-width matrices: under 1 GiB of the card's memory at 35ae4ff, against 17-26 GiB for a
full-width one) takes one of a few light slots (`light-slot-<k>.lock`) instead of a full one. Why: the merged run
at 35ae4ff was bound by its four full slots (1292 slot-seconds of GPU commands over 4 slots: a 323 s floor), and the
tiny matrices held full slots for 191 of those seconds while using a thirtieth of a slot's memory. The light slots
take no turns: each session has one or four light commands, and a full slot's line must not wait on them.

The noxfile imports this file; `python ci/gpu_jobs.py --help` shows nothing more than this text (it is a library).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

#: a job that did not run because a job it waits for failed
NOT_RUN = -100


@dataclasses.dataclass
class Job:
    """One command of a GPU session. `after`: the jobs that must succeed before it starts; `gpu`: whether it
    takes one of the GPU slots; `light`: a GPU command that needs little memory, which takes a light slot where the
    runner has any (else a full one); `codes`: the exit codes that count as success (a matrix exits 1 on a red
    cell: the gate judges that afterwards)."""

    name: str
    cmd: list[str]
    log: Path
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    after: tuple[str, ...] = ()
    gpu: bool = True
    light: bool = False
    codes: tuple[int, ...] = (0,)
    rc: int | None = None
    start_s: float | None = None
    wall_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.rc is not None and self.rc in self.codes


class JobRunner:
    """Starts jobs as their slots and dependencies allow; `run()` returns once every job has ended."""

    def __init__(
        self,
        slots: int,
        say: Callable[[str], None],
        poll_s: float = 0.2,
        slot_dir: Path | None = None,
        fair: bool = True,
        light_slots: int = 0,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        if light_slots < 0:
            raise ValueError(f"light_slots must be at least 0, got {light_slots}")
        self.slots = slots
        self.light_slots = light_slots  # 0: light commands take full slots like the others
        self.say = say
        self.poll_s = poll_s
        self.slot_dir = slot_dir
        self.fair = fair  # take turns with the other sessions (False: only the tests' control)
        self.jobs: list[Job] = []
        self._running: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
        self._served = 0  # GPU commands started (the machine's line serves the least served first)
        self._held: dict[str, int] = {}  # job name -> the slot lock file it holds (machine-wide slots)
        self._t0 = time.monotonic()
        if slot_dir is not None:
            slot_dir.mkdir(parents=True, exist_ok=True)

    @property
    def _ticket(self) -> Path:
        assert self.slot_dir is not None
        return self.slot_dir / f"wait-{os.getpid()}-{id(self)}"

    def _queue_ticket(self, served: bool = False) -> tuple[int, int]:
        """This runner's place in the machine's line: (GPU commands it has started, since when it waits, ns).
        Made when first needed; `served` counts one more command and moves the time to now."""
        ticket = self._ticket
        if served or not ticket.exists():
            self._served += int(served)
            draft = ticket.with_name(f".{ticket.name}.draft")  # written whole, then renamed: never read half
            draft.write_text(f"{self._served} {time.time_ns()}", encoding="utf-8")
            draft.replace(ticket)
        return _read_ticket(ticket) or (self._served, time.time_ns())

    def _leave_line(self) -> None:
        if self.slot_dir is not None and self.fair:
            self._ticket.unlink(missing_ok=True)

    def _first_in_line(self) -> bool:
        """Whether no other live session waiting for a slot has started fewer GPU commands (or as many, and
        waited longer): the sessions take turns, whatever the length of their queues. A dead session's ticket is
        dropped."""
        assert self.slot_dir is not None
        mine = self._queue_ticket()
        for other in self.slot_dir.glob("wait-*"):
            if other == self._ticket:
                continue
            place = _read_ticket(other)
            try:
                pid = int(other.name.split("-")[1])
            except (ValueError, IndexError):
                continue
            if pid != os.getpid() and not _alive(pid):
                other.unlink(missing_ok=True)
                continue
            if place is not None and place < mine:
                return False
        return True

    def _take_slot(self, busy: int) -> int | None:
        """A GPU slot for one more job: its lock file's descriptor (machine-wide slots), -1 (this runner's own
        count), or None when every slot is taken or another session waits longer for one."""
        if self.slot_dir is None:
            return -1 if busy < self.slots else None
        if self.fair and not self._first_in_line():
            return None
        fd = _lock_free(self.slot_dir, "slot", self.slots)
        if fd is not None and self.fair:
            self._queue_ticket(served=True)  # served: behind the sessions served less
        return fd

    def _light(self, job: Job) -> bool:
        """Whether `job` runs in a light slot (a light GPU command, and the runner has light slots)."""
        return job.gpu and job.light and self.light_slots > 0

    def _take_light_slot(self, busy: int) -> int | None:
        """A light slot: its lock file's descriptor (machine-wide slots), -1 (this runner's own count), or None
        when every light slot is taken. No line: light commands never hold up the full slots' turns."""
        if self.slot_dir is None:
            return -1 if busy < self.light_slots else None
        return _lock_free(self.slot_dir, "light-slot", self.light_slots)

    def _free_slot(self, name: str) -> None:
        fd = self._held.pop(name, -1)
        if fd >= 0:
            os.close(fd)  # closing the descriptor releases its lock

    def add(self, job: Job) -> Job:
        known = {j.name for j in self.jobs}
        if job.name in known:
            raise ValueError(f"two jobs are named {job.name!r}")
        missing = [a for a in job.after if a not in known]
        if missing:  # dependencies are added first, so no job can wait on itself or on a cycle
            raise ValueError(f"job {job.name!r} waits for {missing[0]!r}, which is not added before it")
        self.jobs.append(job)
        return job

    def _by_name(self, name: str) -> Job:
        return next(j for j in self.jobs if j.name == name)

    def _start(self, job: Job) -> None:
        job.log.parent.mkdir(parents=True, exist_ok=True)
        job.start_s = time.monotonic() - self._t0
        with job.log.open("wb") as fh:
            proc = subprocess.Popen(
                job.cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **job.env}
            )
        self._running[job.name] = (proc, time.monotonic())
        self.say(f"start {job.name} (at {job.start_s:.0f} s; {len(self._running)} running)")

    def poll(self) -> None:
        """Reap the jobs that ended, then start every job that may start now (in the order added)."""
        for name, (proc, began) in list(self._running.items()):
            rc = proc.poll()
            if rc is None:
                continue
            job = self._by_name(name)
            job.rc, job.wall_s = rc, time.monotonic() - began
            del self._running[name]
            self._free_slot(name)
            verdict = "done" if job.ok else f"FAILED (exit {rc})"
            self.say(f"{verdict}: {job.name} in {job.wall_s:.0f} s (log {job.log})")
        running = [self._by_name(n) for n in self._running]
        gpu_busy = sum(1 for j in running if j.gpu and not self._light(j))
        light_busy = sum(1 for j in running if self._light(j))
        waiting = False  # a GPU job ready to start found no slot
        for job in self.jobs:
            if job.rc is not None or job.name in self._running:
                continue
            deps = [self._by_name(a) for a in job.after]
            if any(d.rc is not None and not d.ok for d in deps):
                job.rc, job.wall_s = NOT_RUN, 0.0
                failed = next(d.name for d in deps if d.rc is not None and not d.ok)
                self.say(f"not run: {job.name} ({failed} failed)")
                continue
            if not all(d.ok for d in deps):
                continue
            if job.gpu:
                light = self._light(job)
                slot = self._take_light_slot(light_busy) if light else self._take_slot(gpu_busy)
                if slot is None:
                    waiting = waiting or not light  # the machine's line is for the full slots alone
                    continue
                self._held[job.name] = slot
                light_busy += light
                gpu_busy += not light
            try:
                self._start(job)
            except BaseException:
                self._free_slot(job.name)
                raise
        if not waiting:
            self._leave_line()

    def run(self) -> list[Job]:
        """Run every job added (also those added after an earlier `poll`) to its end; the jobs, in order.

        A job that has not ended is running, waits for a job it needs, or waits for a GPU slot (held by this
        runner, or by another session on the machine): a job with a failed dependency is marked `NOT_RUN`, so the
        loop ends once every job has."""
        try:
            self.poll()
            # a job may also wait for a slot that another session holds (machine-wide slots)
            while self._running or any(j.rc is None for j in self.jobs):
                time.sleep(self.poll_s)
                self.poll()
        except BaseException:  # Ctrl-C, or a failure of the session itself: no command outlives it
            self.stop()
            raise
        finally:
            self._leave_line()
        return self.jobs

    def stop(self, grace_s: float = 10.0) -> None:
        """Terminate every running command (then kill what is left after `grace_s`) and mark it failed."""
        for proc, _began in self._running.values():
            proc.terminate()
        deadline = time.monotonic() + grace_s
        for name, (proc, began) in list(self._running.items()):
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            job = self._by_name(name)
            job.rc, job.wall_s = proc.returncode, time.monotonic() - began
            self._free_slot(name)
            self.say(f"stopped: {job.name} after {job.wall_s:.0f} s")
        self._running.clear()

    def elapsed_s(self) -> float:
        return time.monotonic() - self._t0


def _lock_free(slot_dir: Path, kind: str, count: int) -> int | None:
    """The descriptor of the first of `<kind>-<k>.lock` (k < count) in `slot_dir` that this process could lock
    (closing it releases the lock, as does the process's end), or None when every one is held."""
    for k in range(count):
        fd = os.open(slot_dir / f"{kind}-{k}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return fd
    return None


def _read_ticket(path: Path) -> tuple[int, int] | None:
    """A ticket's (commands started, waiting since), or None while it is being written or gone."""
    try:
        served, since = path.read_text(encoding="utf-8").split()
        return int(served), int(since)
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    """Whether process `pid` exists (a session's ticket outlives a session killed outright)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def log_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a job's log (what the session prints for a failed job)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"(no log: {exc.strerror})"
    return "\n".join(text.splitlines()[-lines:])


def write_times(path: Path, session: str, runner: JobRunner) -> dict[str, object]:
    """Write the session's times (each job's start, wall time and exit status) as JSON; the record written.
    The slots count as the machine's (a concurrent session may have held some of them) when the runner took them
    from a slot folder."""
    jobs, total_s, slots, shared_with_machine = (
        runner.jobs,
        runner.elapsed_s(),
        runner.slots,
        runner.slot_dir is not None,
    )
    record: dict[str, object] = {
        "session": session,
        "total_s": round(total_s, 1),
        "gpu_slots": slots,
        "light_gpu_slots": runner.light_slots,
        "gpu_slots_shared_with_other_sessions": shared_with_machine,
        "jobs": [
            {
                "name": j.name,
                "gpu": j.gpu,
                "light": j.light,
                "after": list(j.after),
                "start_s": None if j.start_s is None else round(j.start_s, 1),
                "wall_s": None if j.wall_s is None else round(j.wall_s, 1),
                "rc": j.rc,
                "ok": j.ok,
            }
            for j in jobs
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


if __name__ == "__main__":  # pragma: no cover
    print(__doc__)
