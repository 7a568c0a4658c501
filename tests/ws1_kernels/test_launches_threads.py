"""The launch log is per thread: a log sees the launches of the thread that opened it, never another's.

Two threads run at once: A holds a log open while B records. The negative control routes B's records the way
autograd's device worker threads are routed (to every open log) and must see them arrive in A's log, so the
check can tell a leak from its absence.
"""

from __future__ import annotations

import _thread
import threading

import pytest

from ws1_kernels import launches


def _two_threads(b_body) -> launches.LaunchLog:
    """A opens a log and records "a"; B runs ``b_body`` while A's log is open; returns A's log."""
    opened, b_done = threading.Event(), threading.Event()
    result: dict[str, launches.LaunchLog] = {}
    errors: list[BaseException] = []

    def thread_a() -> None:
        with launches.observe() as log:
            opened.set()
            assert b_done.wait(10)
            launches.record("a", "fwd")
        result["a"] = log

    def thread_b() -> None:
        try:
            assert opened.wait(10)
            b_body()
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)
        finally:
            b_done.set()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors, errors
    return result["a"]


def test_a_thread_without_a_log_records_into_no_other_threads_log() -> None:
    a_log = _two_threads(lambda: launches.record("b", "fwd"))
    assert a_log.kernels == ["a"]


def test_a_thread_records_into_its_own_log_only() -> None:
    b_logs: list[launches.LaunchLog] = []

    def b_body() -> None:
        with launches.observe() as log:
            launches.record("b", "fwd")
        b_logs.append(log)

    a_log = _two_threads(b_body)
    assert a_log.kernels == ["a"] and b_logs[0].kernels == ["b"]


def test_negative_control_an_engine_thread_reaches_the_open_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Records of autograd's engine threads (no log of their own) go to the open logs: the leak the check sees."""
    monkeypatch.setattr(launches, "_engine_thread", lambda: True)
    a_log = _two_threads(lambda: launches.record("b", "bwd"))
    assert a_log.kernels == ["b", "a"]


def test_only_threads_python_did_not_start_count_as_engine_threads() -> None:
    """A ``threading`` thread is not an engine thread; one started below ``threading`` (as autograd's C++
    engine starts its device threads) is."""
    seen: dict[str, bool] = {}
    t = threading.Thread(target=lambda: seen.__setitem__("threading", launches._engine_thread()))
    t.start()
    t.join()
    done = threading.Event()

    def raw() -> None:
        seen["raw"] = launches._engine_thread()
        done.set()

    _thread.start_new_thread(raw, ())
    assert done.wait(10)
    assert seen == {"threading": False, "raw": True} and not launches._engine_thread()


def test_nested_equal_logs_leave_in_their_own_order() -> None:
    """Two nested, still-empty (hence equal-looking) logs: each block pops its own log; control: ids land in both."""
    from ws1_kernels import launches

    with launches.observe() as outer:
        with launches.observe() as inner:
            assert inner is not outer
        launches.record("k.after_inner", "forward")
    assert outer.kernels == ["k.after_inner"]
    assert inner.kernels == []
