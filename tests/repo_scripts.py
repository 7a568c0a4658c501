"""Load a file of this repository that is not in any package (a `ci/` script, the noxfile) as a module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load_repo_script(relative: str, name: str) -> ModuleType:
    """Execute `ROOT / relative` as module `name`, registered in `sys.modules` (dataclasses look it up there)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None and spec.loader is not None, relative
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_noxfile(name: str) -> ModuleType:
    """The noxfile as module `name`. It imports nox: without it the test skips, except under CI=true, where
    the session that runs the tests installs nox (`nox -s cpu_contract`) and a skip would hide its tests."""
    import os

    import pytest

    try:
        import nox  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            raise RuntimeError("CI=true: nox is not importable, so the noxfile's tests cannot run") from None
        pytest.skip("nox is not installed")
    import warnings

    with warnings.catch_warnings():
        # each load registers the sessions again under nox's one registry, which nox warns about: expected here
        warnings.filterwarnings(
            "ignore", message="The session .* has already been registered", category=FutureWarning
        )
        return load_repo_script("noxfile.py", name)
