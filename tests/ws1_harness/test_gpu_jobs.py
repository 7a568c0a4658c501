"""The GPU sessions' side-by-side runner (ci/gpu_jobs.py) and how the noxfile splits a session into jobs.

Each property has the case that must be refused or ordered differently beside it. The jobs are short Python
commands: no GPU is needed to check the scheduling.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from repo_scripts import ROOT as REPO_ROOT
from repo_scripts import load_noxfile, load_repo_script

JOBS = load_repo_script("ci/gpu_jobs.py", "ws1_gpu_jobs_test")


def _sleep(seconds: float, rc: int = 0) -> list[str]:
    return [sys.executable, "-c", f"import time, sys; time.sleep({seconds}); sys.exit({rc})"]


def _runner(slots: int) -> object:
    return JOBS.JobRunner(slots, say=lambda _msg: None, poll_s=0.02)


def _overlap(a: object, b: object) -> bool:
    return b.start_s < a.start_s + a.wall_s - 0.05 and a.start_s < b.start_s + b.wall_s - 0.05  # type: ignore[attr-defined]


def test_one_gpu_slot_runs_gpu_jobs_one_after_another(tmp_path: Path) -> None:
    r = _runner(1)
    a = r.add(JOBS.Job("a", _sleep(0.4), tmp_path / "a.log"))
    b = r.add(JOBS.Job("b", _sleep(0.4), tmp_path / "b.log"))
    r.run()
    assert a.ok and b.ok and not _overlap(a, b)


def test_two_gpu_slots_run_them_together(tmp_path: Path) -> None:
    r = _runner(2)
    a = r.add(JOBS.Job("a", _sleep(0.6), tmp_path / "a.log"))
    b = r.add(JOBS.Job("b", _sleep(0.6), tmp_path / "b.log"))
    r.run()
    assert a.ok and b.ok and _overlap(a, b)


def test_a_job_without_gpu_takes_no_slot(tmp_path: Path) -> None:
    r = _runner(1)
    build = r.add(JOBS.Job("build", _sleep(0.6), tmp_path / "build.log", gpu=False))
    gpu = r.add(JOBS.Job("gpu", _sleep(0.6), tmp_path / "gpu.log"))
    r.run()
    assert _overlap(build, gpu)


def test_a_job_waits_for_the_job_it_needs(tmp_path: Path) -> None:
    r = _runner(4)
    build = r.add(JOBS.Job("build", _sleep(0.4), tmp_path / "build.log", gpu=False))
    use = r.add(JOBS.Job("use", _sleep(0.1), tmp_path / "use.log", after=("build",)))
    r.run()
    assert use.ok and use.start_s >= build.start_s + build.wall_s - 0.05


def test_a_failed_dependency_stops_its_users(tmp_path: Path) -> None:
    r = _runner(4)
    build = r.add(JOBS.Job("build", _sleep(0.1, rc=3), tmp_path / "build.log", gpu=False))
    use = r.add(JOBS.Job("use", _sleep(0.1), tmp_path / "use.log", after=("build",)))
    other = r.add(JOBS.Job("other", _sleep(0.1), tmp_path / "other.log"))
    r.run()
    assert build.rc == 3 and not build.ok
    assert use.rc == JOBS.NOT_RUN and not use.ok and not use.log.exists()
    assert other.ok, "a job that needs nothing failed still runs"


def test_the_allowed_codes_decide_success(tmp_path: Path) -> None:
    r = _runner(2)
    red = r.add(JOBS.Job("matrix", _sleep(0, rc=1), tmp_path / "m.log", codes=(0, 1)))
    strict = r.add(JOBS.Job("tests", _sleep(0, rc=1), tmp_path / "t.log"))
    r.run()
    assert red.ok and not strict.ok


def test_each_job_writes_its_own_log(tmp_path: Path) -> None:
    r = _runner(2)
    job = r.add(
        JOBS.Job("say", [sys.executable, "-c", "print('hello from a job')"], tmp_path / "logs" / "say.log")
    )
    r.run()
    assert "hello from a job" in job.log.read_text()
    assert JOBS.log_tail(job.log, 1) == "hello from a job"


@pytest.mark.parametrize(
    ("after", "message"), [(("missing",), "not added before it"), ((), "two jobs are named")]
)
def test_a_bad_job_list_is_refused(tmp_path: Path, after: tuple[str, ...], message: str) -> None:
    r = _runner(1)
    r.add(JOBS.Job("a", _sleep(0), tmp_path / "a.log"))
    name = "b" if after else "a"
    with pytest.raises(ValueError, match=message):
        r.add(JOBS.Job(name, _sleep(0), tmp_path / "b.log", after=after))


def _two_sessions(tmp_path: Path, dir_a: Path, dir_b: Path) -> tuple[object, object]:
    """One GPU job in each of two runners run at once (two threads, as two sessions would be), each runner
    with one slot in its own slot folder; the two jobs."""
    import threading

    jobs = []
    runners = []
    for name, slot_dir in (("a", dir_a), ("b", dir_b)):
        r = JOBS.JobRunner(1, say=lambda _msg: None, poll_s=0.02, slot_dir=slot_dir)
        jobs.append(r.add(JOBS.Job(name, _sleep(0.6), tmp_path / f"{name}.log")))
        runners.append(r)
    threads = [threading.Thread(target=r.run) for r in runners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    base = runners[0]._t0
    for r, j in zip(runners, jobs, strict=True):  # one clock for both: each runner counts from its own start
        j.start_s += r._t0 - base
    return jobs[0], jobs[1]


def test_sessions_sharing_the_machines_slots_take_turns(tmp_path: Path) -> None:
    a, b = _two_sessions(tmp_path, tmp_path / "slots", tmp_path / "slots")
    assert a.ok and b.ok and not _overlap(a, b)


def test_sessions_with_their_own_slots_run_together(tmp_path: Path) -> None:
    """The control: the same two sessions with a slot each of their own overlap, so the test above sees the
    shared lock, not a runner that never overlaps anything."""
    a, b = _two_sessions(tmp_path, tmp_path / "slots-a", tmp_path / "slots-b")
    assert a.ok and b.ok and _overlap(a, b)


def _busy_and_late(tmp_path: Path, fair: bool) -> tuple[list[object], object]:
    """Session A queues three GPU jobs on the machine's one slot; session B's one job becomes ready while A's
    first runs. A's jobs and B's job, their start times on A's clock.

    The two sessions are stepped by hand in one thread, A's poll always before B's, and each step waits for the
    running command to end: the moment A gives its slot back and would retake it is the same on every host, so
    the order seen is the policy's, never the scheduler's (threads let B slip in between under load)."""
    slots = tmp_path / "slots"
    a = JOBS.JobRunner(1, say=lambda _msg: None, poll_s=0.02, slot_dir=slots, fair=fair)
    b = JOBS.JobRunner(1, say=lambda _msg: None, poll_s=0.02, slot_dir=slots, fair=fair)
    mine = [a.add(JOBS.Job(f"a{i}", _sleep(0.05), tmp_path / f"a{i}.log")) for i in range(3)]
    late = b.add(JOBS.Job("b", _sleep(0.05), tmp_path / "b.log"))
    a.poll()  # A's first job takes the one slot
    for _step in range(10):  # 4 commands, one at a time: 4 steps end them, the rest is margin
        b.poll()  # B finds the slot taken (and, with turns, queues its ticket)
        for runner in (a, b):
            for proc, _began in list(runner._running.values()):
                proc.wait()
        a.poll()  # A reaps its job, frees the slot and may retake it at once
        if all(j.rc is not None for j in (*mine, late)):
            break
    b.poll()
    for runner in (a, b):
        runner._leave_line()
    late.start_s += b._t0 - a._t0  # one clock for both
    return mine, late


def test_a_waiting_session_gets_the_next_free_slot(tmp_path: Path) -> None:
    mine, late = _busy_and_late(tmp_path, fair=True)
    assert late.ok and late.start_s < mine[1].start_s  # served before A's second job


def test_without_the_line_the_busier_session_keeps_the_slot(tmp_path: Path) -> None:
    """The control: without turns, A retakes its slot and B waits for all three (the starved sm86 session)."""
    mine, late = _busy_and_late(tmp_path, fair=False)
    assert late.ok and late.start_s > mine[2].start_s


def test_a_dead_sessions_ticket_does_not_block_the_line(tmp_path: Path) -> None:
    slots = tmp_path / "slots"
    slots.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (slots / f"wait-{dead.stdout.strip()}-1").write_text("0 1")  # the oldest ticket, of a process now gone
    r = JOBS.JobRunner(1, say=lambda _msg: None, poll_s=0.02, slot_dir=slots)
    job = r.add(JOBS.Job("a", _sleep(0.05), tmp_path / "a.log"))
    r.run()
    assert job.ok and not list(slots.glob("wait-*"))


def test_a_finished_job_gives_its_machine_slot_back(tmp_path: Path) -> None:
    r = JOBS.JobRunner(1, say=lambda _msg: None, poll_s=0.02, slot_dir=tmp_path / "slots")
    for name in ("a", "b", "c"):
        r.add(JOBS.Job(name, _sleep(0.05), tmp_path / f"{name}.log"))
    r.run()
    assert all(j.ok for j in r.jobs)
    other = JOBS.JobRunner(1, say=lambda _msg: None, poll_s=0.02, slot_dir=tmp_path / "slots")
    assert other._take_slot(0) is not None  # free again: no lock outlived its job


def test_zero_slots_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        JOBS.JobRunner(0, say=print)


def test_the_times_record_every_job(tmp_path: Path) -> None:
    r = _runner(2)
    r.add(JOBS.Job("build", _sleep(0.1, rc=2), tmp_path / "b.log", gpu=False))
    r.add(JOBS.Job("matrix x (qwen3-8b)", _sleep(0.1), tmp_path / "m.log", after=("build",)))
    r.run()
    record = JOBS.write_times(tmp_path / "t.json", "gpu_sm90", r)
    assert json.loads((tmp_path / "t.json").read_text()) == record
    assert record["gpu_slots_shared_with_other_sessions"] is False  # no slot folder: the session's own slots
    rows = {j["name"]: j for j in record["jobs"]}
    assert rows["build"]["rc"] == 2 and rows["build"]["wall_s"] > 0 and not rows["build"]["ok"]
    assert rows["matrix x (qwen3-8b)"]["rc"] == JOBS.NOT_RUN and record["gpu_slots"] == 2
    # the control: a runner taking its slots from the machine's folder says they were shared
    shared = JOBS.JobRunner(2, say=lambda _msg: None, poll_s=0.02, slot_dir=tmp_path / "slots")
    assert (
        JOBS.write_times(tmp_path / "s.json", "gpu_sm86", shared)["gpu_slots_shared_with_other_sessions"]
        is True
    )


# ---- how the noxfile splits a session


@pytest.fixture(scope="module")
def noxfile() -> ModuleType:
    return load_noxfile("ws1_noxfile_gpu_jobs")


@pytest.mark.parametrize(("value", "want"), [("", (None, 4)), ("2", (None, 2)), (" 8 ", (None, 8))])
def test_gpu_slots_from_the_environment(noxfile: ModuleType, value: str, want: tuple[object, int]) -> None:
    assert noxfile.gpu_slots(value, 139.8) == want


@pytest.mark.parametrize(("value", "workers"), [("", None), ("1", None), (" 3 ", "3")])
def test_gpu_test_workers_from_the_environment(noxfile: ModuleType, value: str, workers: str | None) -> None:
    """N > 1 adds pytest-xdist's `-n N` to the job's command; unset or 1 (the control) runs one process."""
    problem, cmd = noxfile.gpu_test_command("gpu and not needs_build", value)
    assert problem is None and cmd[cmd.index("pytest") + 2] == "gpu and not needs_build"
    assert (cmd[cmd.index("-n") + 1] if "-n" in cmd else None) == workers


@pytest.mark.parametrize(
    ("value", "omp", "want"), [(" 4 ", None, {"OMP_NUM_THREADS": "4"}), ("", None, {}), ("4", "2", {})]
)
def test_gpu_job_threads_from_the_environment(
    noxfile: ModuleType, value: str, omp: str | None, want: dict[str, str]
) -> None:
    """N caps every GPU job's torch threads; unset (the control) leaves torch's default, and a caller's
    OMP_NUM_THREADS is kept."""
    assert noxfile.gpu_job_threads(value, omp) == (None, want)


@pytest.mark.parametrize("value", ["0", "two", "-2", "1.5"])
def test_bad_gpu_job_threads_are_one_line(noxfile: ModuleType, value: str) -> None:
    problem, env = noxfile.gpu_job_threads(value, None)
    assert problem is not None and "WS1_GPU_JOB_THREADS" in problem and "\n" not in problem and env == {}


@pytest.mark.parametrize("value", ["0", "two", "-2", "1.5"])
def test_bad_gpu_test_workers_are_one_line(noxfile: ModuleType, value: str) -> None:
    problem, _ = noxfile.gpu_test_command("gpu", value)
    assert problem is not None and "WS1_GPU_TEST_WORKERS" in problem and "\n" not in problem


@pytest.mark.parametrize(("gib", "want"), [(139.8, 4), (79.2, 2), (47.5, 1), (23.6, 1), (0.0, 1), (640.0, 4)])
def test_default_slots_follow_the_cards_memory(noxfile: ModuleType, gib: float, want: int) -> None:
    """Four GPU commands at once ran an 80 GB H100 out of memory; the default must not ask that of it."""
    assert noxfile.gpu_slots("", gib) == (None, want)


def test_an_explicit_slot_count_overrides_the_memory_default(noxfile: ModuleType) -> None:
    assert noxfile.gpu_slots("4", 79.2) == (None, 4)


@pytest.mark.parametrize("value", ["0", "-1", "four", "1.5"])
def test_a_bad_slot_count_is_named(noxfile: ModuleType, value: str) -> None:
    problem, _ = noxfile.gpu_slots(value, 79.2)
    assert problem is not None and repr(value) in problem


def test_the_sm90_session_tests_everything_once(noxfile: ModuleType) -> None:
    phases = noxfile.gpu_test_phases("gpu_sm90", ("build generic",))
    assert phases == [
        ("gpu and not needs_build", (), True),
        ("gpu and needs_build", ("build generic",), False),
    ]


def test_the_proxy_session_tests_only_its_own_build(noxfile: ModuleType) -> None:
    phases = noxfile.gpu_test_phases("gpu_sm86", ("build generic",))
    assert phases == [("gpu and needs_build and not sm90 and not launch_ext", ("build generic",), False)]


class _Recorder:
    def __init__(self) -> None:
        self.jobs: list[object] = []

    def add(self, job: object) -> object:
        self.jobs.append(job)
        return job


@pytest.mark.parametrize(
    ("session", "modules"), [("gpu_sm90", ["generic", "hopper", "launch"]), ("gpu_sm86", ["generic"])]
)
def test_each_module_builds_in_its_own_folder(
    noxfile: ModuleType, tmp_path: Path, session: str, modules: list[str]
) -> None:
    (tmp_path / "ws1_cuda_sm90_ext.cpython-312-x86_64-linux-gnu.so").write_text("stale")
    rec = _Recorder()
    found, names = noxfile._add_build_jobs(rec, session, tmp_path, tmp_path / "logs")
    assert sorted(found) == modules and len(names) == len(modules)
    assert not list(tmp_path.glob("ws1_cuda_sm90_ext*.so")), (
        "a stale Hopper module stayed beside the generic one"
    )
    temps = {job.cmd[job.cmd.index("--build-temp") + 1] for job in rec.jobs}
    libs = {job.cmd[job.cmd.index("--build-lib") + 1] for job in rec.jobs}
    assert len(temps) == len(modules) and len(libs) == len(modules), "two builds share a folder"
    assert [job.env["WS1_MODULES"] for job in rec.jobs] == modules
    assert all(not job.gpu for job in rec.jobs)


BUILD_JOBS = {"generic": "build generic", "hopper": "build hopper", "launch": "build launch"}


@pytest.mark.parametrize(
    ("profile", "waits"),
    [
        ("cuda_bf16", ("build generic",)),
        ("cuda_bf16_sm90", ("build generic", "build hopper")),
        ("triton_cuda_bf16", ()),
        ("native_torch", ()),
    ],
)
def test_a_matrix_waits_for_the_builds_of_its_own_modules(
    noxfile: ModuleType, profile: str, waits: tuple[str, ...]
) -> None:
    """Each profile in its own environment sees only its own modules, so it waits only for their builds."""
    assert noxfile.matrix_waits(profile, BUILD_JOBS, one_env=False) == waits


def test_the_control_in_one_environment_every_matrix_waits_for_every_build(noxfile: ModuleType) -> None:
    """In the machine's one environment every profile sees every build folder: none starts before all end."""
    for profile in ("cuda_bf16", "triton_cuda_bf16"):
        assert noxfile.matrix_waits(profile, BUILD_JOBS, one_env=True) == tuple(BUILD_JOBS.values())


def test_a_module_this_build_lacks_is_not_waited_for(noxfile: ModuleType) -> None:
    """The sm86 session builds no Hopper module: the Hopper profile then waits for the generic build alone (its
    cells say the module is missing)."""
    assert noxfile.matrix_waits("cuda_bf16_sm90", {"generic": "build generic"}, one_env=False) == (
        "build generic",
    )


# ---- the test files that need the build, and the collection that leaves them out

_BUILD_USES = ("from ws1_kernels import cuda", "ws1_kernels.cuda_sm90", "ws1_cuda_ext", '"cuda_bf16"')


def build_marker_problems(files: dict[str, str]) -> list[str]:
    """The GPU test files that use the CUDA extension but do not carry the `needs_build` marker."""
    return [
        name
        for name, text in files.items()
        if "pytest.mark.gpu" in text
        and any(use in text for use in _BUILD_USES)
        and "pytest.mark.needs_build" not in text
    ]


def test_every_gpu_test_of_the_extension_needs_the_build() -> None:
    files = {
        str(p.relative_to(REPO_ROOT)): p.read_text() for p in (REPO_ROOT / "tests").rglob("test_*_gpu.py")
    }
    assert len(files) >= 8
    assert build_marker_problems(files) == []


def test_an_unmarked_extension_test_is_found() -> None:
    planted = {"test_x_gpu.py": "pytestmark = pytest.mark.gpu\nfrom ws1_kernels import cuda\n"}
    assert build_marker_problems(planted) == ["test_x_gpu.py"]


_CONFTEST = (REPO_ROOT / "tests" / "conftest.py").read_text()


@pytest.mark.parametrize(("without_build", "want_rc"), [(True, 0), (False, 2)])
def test_the_files_that_need_the_build_are_not_imported_while_it_compiles(
    tmp_path: Path, without_build: bool, want_rc: int
) -> None:
    """A marked file that fails at import (a half-written module) is never imported with
    WS1_COLLECT_WITHOUT_BUILD=1; without it, the same collection fails (the control)."""
    (tmp_path / "conftest.py").write_text(_CONFTEST.split("@pytest.fixture", 1)[0])
    (tmp_path / "test_built_gpu.py").write_text(
        "import pytest\npytestmark = [pytest.mark.needs_build]\nraise ImportError('half-written module')\n"
    )
    (tmp_path / "test_plain.py").write_text("def test_ok():\n    assert True\n")
    env = {k: v for k, v in os.environ.items() if k != "WS1_COLLECT_WITHOUT_BUILD"}
    if without_build:
        env["WS1_COLLECT_WITHOUT_BUILD"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode == want_rc, proc.stdout[-1500:]


def test_an_interrupted_session_leaves_no_command_running(tmp_path: Path) -> None:
    """A failure while jobs run (here the progress callback raises once the long job has started) stops them: the
    long job ends within the grace period, not after its 60 s; the control job that had ended keeps its status."""

    class Interrupt(Exception):
        pass

    def say(msg: str) -> None:
        if msg.startswith("start long"):
            raise Interrupt

    r = JOBS.JobRunner(2, say=say, poll_s=0.02)
    quick = r.add(JOBS.Job("quick", _sleep(0), tmp_path / "q.log"))
    quick_done = r.add(JOBS.Job("wait", _sleep(0.2), tmp_path / "w.log", after=("quick",), gpu=False))
    long = r.add(JOBS.Job("long", _sleep(60), tmp_path / "l.log", after=("wait",)))
    with pytest.raises(Interrupt):
        r.run()
    assert quick.ok and quick_done.ok
    assert long.rc is not None and long.rc != 0 and long.wall_s < 15, (long.rc, long.wall_s)


# ---- the CPU session's pytest workers


@pytest.mark.parametrize(
    ("workers", "omp", "cores", "want"),
    [
        ("2", None, 2, {"OMP_NUM_THREADS": "1"}),
        ("2", None, 8, {"OMP_NUM_THREADS": "4"}),
        ("4", None, 2, {"OMP_NUM_THREADS": "1"}),
    ],
)
def test_workers_share_the_cores(
    noxfile: ModuleType, workers: str, omp: str | None, cores: int, want: dict
) -> None:
    """Two workers on two cores must not each start two threads (four spinning threads slowed a guard 15x)."""
    assert noxfile.worker_threads(workers, omp, cores) == want


@pytest.mark.parametrize(("workers", "omp"), [("2", "3"), ("auto", None), ("0", None)])
def test_a_callers_thread_count_or_an_unknown_worker_count_is_left_alone(
    noxfile: ModuleType, workers: str, omp: str | None
) -> None:
    assert noxfile.worker_threads(workers, omp, 2) == {}


_PATH_PROBE = """
import os
from pathlib import Path

import torch


def test_record_the_path():
    worker = os.environ["PYTEST_XDIST_WORKER"]
    seen = [str(torch.backends.cpu.get_cpu_capability()), os.environ["MKL_ENABLE_INSTRUCTIONS"],
            os.environ["ONEDNN_MAX_CPU_ISA"], str(torch.get_num_threads())]
    (Path(os.environ["PATH_PROBE_OUT"]) / worker).write_text(" ".join(seen))
"""


def test_every_forced_cpu_path_runs_every_test_in_its_own_worker(noxfile: ModuleType, tmp_path: Path) -> None:
    """The planted-fault step runs all forced paths in one pytest: each path's worker runs every test, on that path
    (torch's ATen path, the MKL and oneDNN variables). Control: a worker whose torch is not on the path it was told
    to expect errors (tests/conftest.py), so a path that did not take can never pass."""
    args = noxfile.forced_path_args(noxfile.FORCED_CPU_PATHS)
    assert args[:2] == ["--dist", "each"] and args.count("--tx") == len(noxfile.FORCED_CPU_PATHS)
    wrong = args[-1].replace("WS1_EXPECT_CPU_CAPABILITY=default", "WS1_EXPECT_CPU_CAPABILITY=avx2")
    assert wrong != args[-1], "the control's planted expectation did not land"
    wrong = wrong.replace("id=sse", "id=wrong")
    (tmp_path / "conftest.py").write_text((REPO_ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_path_probe.py").write_text(_PATH_PROBE)
    env = {**os.environ, "PATH_PROBE_OUT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    env.pop("WS1_EXPECT_CPU_CAPABILITY", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "--tx", wrong, "test_path_probe.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert (tmp_path / "avx2").read_text() == "AVX2 AVX2 AVX2 1"
    assert (tmp_path / "sse").read_text() == "DEFAULT SSE4_2 SSE41 1"
    assert not (tmp_path / "wrong").exists()
    assert "WS1_EXPECT_CPU_CAPABILITY=avx2 but torch runs the DEFAULT CPU path" in proc.stdout


# ---- the full-width matrices in shards


@pytest.mark.parametrize(("value", "want"), [("", (None, 2)), ("1", (None, 1)), (" 3 ", (None, 3))])
def test_matrix_shards_from_the_environment(
    noxfile: ModuleType, value: str, want: tuple[object, int]
) -> None:
    assert noxfile.matrix_shards(value) == want


@pytest.mark.parametrize("value", ["0", "13", "two", "-1"])
def test_a_bad_shard_count_is_named(noxfile: ModuleType, value: str) -> None:
    problem, _ = noxfile.matrix_shards(value)
    assert problem is not None and "WS1_MATRIX_SHARDS" in problem and repr(value) in problem


def test_a_sharded_matrix_job_runs_its_part_only(noxfile: ModuleType, tmp_path: Path) -> None:
    whole = noxfile._matrix_job(JOBS, "cuda_bf16", "qwen3-8b", ["short"], tmp_path, {}, None, (), tmp_path)
    part = noxfile._matrix_job(
        JOBS, "cuda_bf16", "qwen3-8b", ["short"], tmp_path, {}, None, (), tmp_path, (1, 2)
    )
    assert "--shard" not in whole.cmd
    assert part.cmd[part.cmd.index("--shard") + 1] == "1/2"
    assert part.name != whole.name and part.log != whole.log


def _evidence(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text("{}")


def test_a_sharded_matrix_is_judged_on_all_its_shards(noxfile: ModuleType, tmp_path: Path) -> None:
    _evidence(
        tmp_path, "t.sm90.shard-0-of-2.json", "t.sm90.shard-1-of-2.json", "t.sm90.shard-1-of-2.partial.json"
    )
    problem, files = noxfile.matrix_evidence(tmp_path, 2)
    assert problem is None and [f.name for f in files] == [
        "t.sm90.shard-0-of-2.json",
        "t.sm90.shard-1-of-2.json",
    ]


def test_a_missing_shard_is_named(noxfile: ModuleType, tmp_path: Path) -> None:
    _evidence(tmp_path, "t.sm90.shard-0-of-2.json", "t.sm90.shard-1-of-2.partial.json")
    problem, _ = noxfile.matrix_evidence(tmp_path, 2)
    assert problem is not None and "expected 2 shard files" in problem and "found 1" in problem


def test_an_unsharded_matrix_ignores_shard_files(noxfile: ModuleType, tmp_path: Path) -> None:
    _evidence(tmp_path, "t.sm90.json")
    assert noxfile.matrix_evidence(tmp_path, 1)[0] is None
    _evidence(tmp_path, "u.sm90.json")  # the control: two whole files are one too many
    assert "found 2" in (noxfile.matrix_evidence(tmp_path, 1)[0] or "")


def test_sessions_at_once_share_one_slot_folder(noxfile: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WS1_GPU_SLOT_DIR", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    first = noxfile.gpu_slot_dir()
    assert noxfile.gpu_slot_dir() == first
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # another card has slots of its own
    assert noxfile.gpu_slot_dir() != first
    monkeypatch.setenv("WS1_GPU_SLOT_DIR", "/x/y")
    assert noxfile.gpu_slot_dir() == Path("/x/y")


def test_the_checkout_lock_admits_one_holder(
    noxfile: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    monkeypatch.setenv("WS1_GPU_SLOT_DIR", str(tmp_path))
    with (
        noxfile.checkout_lock(),
        (tmp_path / "install.lock").open("a") as other,
        pytest.raises(BlockingIOError),
    ):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with (tmp_path / "install.lock").open("a") as other:  # the control: released on leaving
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_an_earlier_runs_output_is_set_aside_not_lost(noxfile: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "gpu_sm90"
    (out / "triton_cuda_bf16").mkdir(parents=True)
    (out / "triton_cuda_bf16" / "triton_cuda_bf16.sm90.json").write_text("old")
    moved = noxfile.set_aside_previous(out)
    assert moved is not None and moved.parent == tmp_path and moved.name.startswith("gpu_sm90.previous-")
    assert (moved / "triton_cuda_bf16" / "triton_cuda_bf16.sm90.json").read_text() == "old"
    assert out.is_dir() and not any(out.iterdir())
    (out / "x").write_text("second")  # a second earlier run in the same second gets its own folder
    again = noxfile.set_aside_previous(out)
    assert again is not None and again != moved and (again / "x").read_text() == "second"


def test_an_empty_session_folder_is_left_alone(noxfile: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "gpu_sm86"
    out.mkdir()
    assert noxfile.set_aside_previous(out) is None
    assert [p.name for p in tmp_path.iterdir()] == ["gpu_sm86"]


def test_a_live_sessions_older_ticket_holds_the_slot_back(tmp_path: Path) -> None:
    """The control of the dead-ticket test: the same ticket of a process that is alive (this test's parent) keeps
    the free slot for that session."""
    slots = tmp_path / "slots"
    slots.mkdir()
    (slots / f"wait-{os.getppid()}-1").write_text("0 1")
    r = JOBS.JobRunner(1, say=lambda _msg: None, poll_s=0.02, slot_dir=slots)
    assert r._take_slot(0) is None
    (slots / f"wait-{os.getppid()}-1").unlink()
    assert r._take_slot(0) is not None


def test_sessions_at_once_share_one_parameter_folder(
    noxfile: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both arch sessions of the merged run find the same folder of generated weights (ws1_harness.run.param_cache),
    so each full-vocabulary weight is drawn once between them; the variable overrides it."""
    monkeypatch.delenv("WS1_PARAM_CACHE", raising=False)
    first = noxfile.param_cache_dir()
    assert noxfile.param_cache_dir() == first and str(os.getuid()) in first.name
    monkeypatch.setenv("WS1_PARAM_CACHE", "/x/params")  # the control: the variable names another folder
    assert noxfile.param_cache_dir() == Path("/x/params") != first


# ---- light slots: a GPU command that needs little memory (the tiny matrices) runs beside the full slots


def _full_and_light(tmp_path: Path, light_slots: int, slot_dir: Path | None = None) -> tuple[object, object]:
    r = JOBS.JobRunner(1, say=lambda _msg: None, poll_s=0.02, slot_dir=slot_dir, light_slots=light_slots)
    full = r.add(JOBS.Job("full", _sleep(0.6), tmp_path / "full.log"))
    light = r.add(JOBS.Job("light", _sleep(0.6), tmp_path / "light.log", light=True))
    r.run()
    return full, light


@pytest.mark.parametrize("machine", [False, True], ids=["own-slots", "machine-slots"])
def test_a_light_job_runs_beside_the_full_slots_job(tmp_path: Path, machine: bool) -> None:
    full, light = _full_and_light(tmp_path, 1, tmp_path / "slots" if machine else None)
    assert full.ok and light.ok and _overlap(full, light)


def test_without_light_slots_a_light_job_takes_a_full_slot(tmp_path: Path) -> None:
    """The control: no light slot, one full slot: the same two jobs run one after the other."""
    full, light = _full_and_light(tmp_path, 0)
    assert full.ok and light.ok and not _overlap(full, light)


def test_light_jobs_queue_for_their_own_slots(tmp_path: Path) -> None:
    """Two light jobs and one light slot: one after the other, while the full slot stays free for full jobs."""
    r = JOBS.JobRunner(1, say=lambda _msg: None, poll_s=0.02, light_slots=1)
    a = r.add(JOBS.Job("a", _sleep(0.4), tmp_path / "a.log", light=True))
    b = r.add(JOBS.Job("b", _sleep(0.4), tmp_path / "b.log", light=True))
    full = r.add(JOBS.Job("full", _sleep(0.4), tmp_path / "full.log"))
    r.run()
    assert not _overlap(a, b) and _overlap(a, full)


def test_negative_light_slots_are_refused() -> None:
    with pytest.raises(ValueError, match="light_slots must be at least 0"):
        JOBS.JobRunner(1, say=print, light_slots=-1)


def test_the_tiny_matrices_are_the_light_jobs(noxfile: ModuleType, tmp_path: Path) -> None:
    tiny = noxfile._matrix_job(JOBS, "cuda_bf16", "tiny", ["short"], tmp_path, {}, None, (), tmp_path)
    full = noxfile._matrix_job(JOBS, "cuda_bf16", "qwen3-8b", ["short"], tmp_path, {}, None, (), tmp_path)
    assert tiny.light and not full.light
    r = JOBS.JobRunner(1, say=lambda _msg: None, light_slots=noxfile.LIGHT_GPU_JOBS)
    record = JOBS.write_times(tmp_path / "t.json", "gpu_sm90", r)
    assert record["light_gpu_slots"] == noxfile.LIGHT_GPU_JOBS >= 1
