"""Bad input is one plain line and exit 2; only a bug in ws1 is called an internal error."""

from __future__ import annotations

from pathlib import Path

import pytest

from ws1_harness import cli


def test_unknown_profile_is_bad_input_not_an_internal_error(tmp_path: Path, capsys) -> None:
    assert cli.main(["matrix", "--profile", "nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ws1 matrix: unknown profile 'nope'") and "internal error" not in err
    assert len(err.splitlines()) == 1


def test_a_bug_is_reported_as_an_internal_error(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(args):
        raise RuntimeError("something ws1 did wrong")

    monkeypatch.setattr(cli, "_cmd_gate", broken)
    assert cli.main(["gate", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "ws1: internal error: RuntimeError: something ws1 did wrong"


def test_every_harness_input_error_shares_one_base() -> None:
    from ws1_harness.bench.records import BenchInputError
    from ws1_harness.cells import CellError
    from ws1_harness.compare import ComparatorError
    from ws1_harness.errors import HarnessError
    from ws1_harness.evidence import EvidenceError
    from ws1_harness.matrix import MatrixInputError
    from ws1_harness.status import StatusError

    for cls in (BenchInputError, CellError, ComparatorError, EvidenceError, MatrixInputError, StatusError):
        assert issubclass(cls, HarnessError), cls
