"""The Hopper GPU test modules' preamble (`cuda_only.skip_module_without_hopper`): in a GPU session
(`WS1_REQUIRE_GPU=1`) a Hopper module that cannot run is an error when the session built 9.0a or has the Hopper
extension on its path, and a skip otherwise.

Why: a device call that built only the Hopper module (the generic one missing) once saw every weight-gradient GPU
test skip, one line of "1 skipped", where it meant to run them. The controls are the two cases that must stay a
skip: a GPU session with neither, and a run outside a GPU session.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import cuda_only
import pytest

from ws1_kernels import cuda, cuda_sm90


def _setup(monkeypatch: pytest.MonkeyPatch, *, gpu_session: bool, targets: str, on_path: bool) -> None:
    if gpu_session:
        monkeypatch.setenv("WS1_REQUIRE_GPU", "1")
    else:
        monkeypatch.delenv("WS1_REQUIRE_GPU", raising=False)
    monkeypatch.setattr(cuda_sm90, "missing_reason", lambda: "the generic module is missing")
    monkeypatch.setattr(cuda, "built_targets", lambda: targets)
    real = importlib.util.find_spec

    def find_spec(name: str, *a: Any) -> Any:
        if name == cuda_sm90.EXTENSION:
            return object() if on_path else None
        return real(name, *a)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_the_hopper_module_on_the_path_makes_a_missing_piece_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _setup(monkeypatch, gpu_session=True, targets="", on_path=True)
    with pytest.raises(RuntimeError, match="on the path: the generic module is missing"):
        cuda_only.skip_module_without_hopper()


def test_a_9_0a_build_makes_it_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _setup(monkeypatch, gpu_session=True, targets="8.0;9.0a", on_path=False)
    with pytest.raises(RuntimeError, match="9.0a build"):
        cuda_only.skip_module_without_hopper()


def test_a_gpu_session_with_neither_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    _setup(monkeypatch, gpu_session=True, targets="8.6+PTX", on_path=False)
    with pytest.raises(pytest.skip.Exception, match="the generic module is missing"):
        cuda_only.skip_module_without_hopper()


def test_outside_a_gpu_session_it_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    _setup(monkeypatch, gpu_session=False, targets="8.0;9.0a", on_path=True)
    with pytest.raises(pytest.skip.Exception):
        cuda_only.skip_module_without_hopper()
