"""csrc/setup.py's build rules that need no GPU: the C++ runtime is linked as a shared library (a private static
copy made every failed check in the Hopper module a segfault on the GPU machine), and `WS1_MODULES` picks the
modules to build (the GPU sessions build the two at once)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from repo_scripts import load_repo_script

SETUP = load_repo_script("csrc/setup.py", "ws1_csrc_setup_link")
GXX = shutil.which("g++")

# formats an integer through a stream (the locale's num_put facet) and throws: what a TORCH_CHECK message does
_SOURCE = """
#include <sstream>
#include <stdexcept>
#include <string>
extern "C" int ws1_probe(long v) {
  std::ostringstream ss; ss << "width " << v;
  if (v < 0) throw std::runtime_error(ss.str());
  return static_cast<int>(ss.str().size());
}
"""


def _shared_object(tmp_path: Path, name: str, *flags: str) -> Path:
    if GXX is None or shutil.which("nm") is None:
        if os.environ.get("CI") == "true":
            raise RuntimeError("CI=true: g++ and nm are needed to link a probe module")
        pytest.skip("g++ and nm are needed to link a probe module")
    src = tmp_path / "probe.cpp"
    src.write_text(_SOURCE)
    out = tmp_path / f"{name}.so"
    subprocess.run([GXX, "-shared", "-fPIC", "-O1", str(src), "-o", str(out), *flags], check=True)
    return out


def test_a_dynamically_linked_module_carries_no_runtime(tmp_path: Path) -> None:
    so = _shared_object(tmp_path, "shared", *SETUP.SHARED_RUNTIME)
    assert SETUP.static_runtime_symbols(so) == []


def test_a_statically_linked_runtime_is_found(tmp_path: Path) -> None:
    """The negative control: the same module with libstdc++ copied in (what the GPU machine's compiler did)."""
    so = _shared_object(tmp_path, "static", "-static-libstdc++")
    found = SETUP.static_runtime_symbols(so)
    assert "__cxa_throw" in found and "_ZNSt6localeC1Ev" in found, found


def test_the_shared_runtime_is_named_before_the_compilers_own() -> None:
    assert SETUP.SHARED_RUNTIME == ["-l:libstdc++.so.6"]


@pytest.mark.parametrize(
    ("archs", "env", "want"),
    [
        ("8.0;9.0a", "", ["generic", "hopper"]),
        ("8.6+PTX", "", ["generic"]),
        ("8.0;9.0a", "hopper", ["hopper"]),
        ("8.0;9.0a", "generic", ["generic"]),
    ],
)
def test_wanted_modules(archs: str, env: str, want: list[str]) -> None:
    assert SETUP.wanted_modules(archs, env) == want


@pytest.mark.parametrize(
    ("archs", "env", "message"),
    [("8.6+PTX", "hopper", "has no 9.0a"), ("8.0;9.0a", "generic,cuda", "unknown module 'cuda'")],
)
def test_a_bad_module_list_stops_the_build(archs: str, env: str, message: str) -> None:
    with pytest.raises(SystemExit) as exc:
        SETUP.wanted_modules(archs, env)
    assert message in str(exc.value)


def test_the_build_info_header_is_rewritten_only_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "_build_info.h"
    SETUP.write_if_changed(path, "a\n")
    first = path.stat().st_mtime_ns
    SETUP.write_if_changed(path, "a\n")
    assert path.stat().st_mtime_ns == first and path.read_text() == "a\n"
    SETUP.write_if_changed(path, "b\n")
    assert path.read_text() == "b\n" and not list(tmp_path.glob(".*"))
