"""`ci/clean_evidence_paths.py`: the device machine's paths in an evidence folder's logs become `<out>`,
`<checkout>` and `<venv>`; JSON files are left as they came back; --check finds what is left and changes nothing;
a bad folder is one line and exit 2. Each property with the case that must not change beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.repo_scripts import load_repo_script

clean = load_repo_script("ci/clean_evidence_paths.py", "ws1_ci_clean_evidence_paths")

LOG = (
    "nox > /tmp/ws1-device-clone/.nox/gpu_sm90/bin/ws1 matrix --out /root/out/ev/gpu_sm90\n"
    "python3: /opt/torch/.venv/bin/python3\n"
)


def _bundle(tmp_path: Path) -> Path:
    (tmp_path / "b" / "logs").mkdir(parents=True)
    (tmp_path / "b" / "logs" / "nox.log").write_text(LOG)
    (tmp_path / "b" / "m.json").write_text('{"out": "/root/out/ev/m.json"}')
    (tmp_path / "b" / "clean.txt").write_text("nothing to replace\n")
    return tmp_path / "b"


def test_the_logs_device_paths_become_placeholders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = _bundle(tmp_path)
    assert clean.main([str(b)]) == 0
    assert (b / "logs" / "nox.log").read_text() == (
        "nox > <checkout>/.nox/gpu_sm90/bin/ws1 matrix --out <out>/ev/gpu_sm90\npython3: <venv>/bin/python3\n"
    )
    assert "nox.log: 3 device paths replaced" in capsys.readouterr().out


def test_json_and_clean_files_are_left_as_they_are(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    before = {p: p.stat().st_mtime_ns for p in (b / "m.json", b / "clean.txt")}
    clean.main([str(b)])
    assert (b / "m.json").read_text() == '{"out": "/root/out/ev/m.json"}'
    assert {p: p.stat().st_mtime_ns for p in before} == before  # not rewritten at all


def test_check_finds_what_is_left_and_changes_nothing(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    assert clean.main([str(b), "--check"]) == 1
    assert (b / "logs" / "nox.log").read_text() == LOG
    clean.main([str(b)])
    assert clean.main([str(b), "--check"]) == 0  # the control: a cleaned folder passes


def test_a_missing_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert clean.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a folder" in err[0]


def test_a_path_is_replaced_only_where_it_stands_whole() -> None:
    """A replacement is not matched again (the clone's own `root/out` folder stays), and a longer path that merely
    contains a device path is left alone; the control, the path itself and its subpaths, is replaced."""
    text, count = clean.clean_text(
        "/tmp/ws1-device-clone/root/out /home/root/outputs /root/outx '/root/out/a'"
    )
    assert text == "<checkout>/root/out /home/root/outputs /root/outx '<out>/a'" and count == 2


def test_the_checkout_path_is_the_device_sessions_clone_dir() -> None:
    """The clone folder is defined by ci/device_session.sh (CLONE_DIR's default); the tool's copy must say the
    same, or a changed default would leave every log's checkout paths in place."""
    import re

    script = (Path(clean.__file__).parent / "device_session.sh").read_text()
    match = re.search(r"CLONE_DIR:-([^}]+)\}", script)
    assert match is not None, "ci/device_session.sh no longer defaults CLONE_DIR"
    assert (match.group(1), "<checkout>") in clean.REPLACEMENTS
