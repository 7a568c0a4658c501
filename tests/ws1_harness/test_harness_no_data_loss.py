"""Nothing is lost: no ws1 command replaces, deletes or shadows evidence without `--force`.

Each test writes a file, runs the command that once destroyed it, and checks the file byte for byte afterwards:
a matrix rerun, an interrupted matrix over complete evidence, a merge onto an existing file, a report of a
partial file beside a complete one, an interrupted chain, and an `--out` inside the checkout (refused before a
folder is made). The matrix runs in-process with stand-in units (no kernel runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from standin_units import error_records

from ws1_harness import cli
from ws1_harness.run import matrix
from ws1_harness.run.tasks import UnitTask

TINY = ["--model", "tiny", "--tier", "short", "--in-process"]
REPO = Path(__file__).resolve().parents[2]


def _stand_in_unit(task: UnitTask) -> list[dict[str, Any]]:
    return error_records(task)


def _matrix(out: Path, *extra: str) -> int:
    args = ["matrix", "--profile", "portable_cpu", "--op", "silu", *TINY, "--out", str(out), *extra]
    return cli.main(args)


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    return lines[0]


@pytest.fixture
def stand_in(monkeypatch) -> None:
    monkeypatch.setattr(matrix, "execute_task", _stand_in_unit)


def test_matrix_refuses_to_replace_evidence_without_force(tmp_path: Path, capsys, stand_in) -> None:
    _matrix(tmp_path)
    final = tmp_path / "portable_cpu.json"
    before = final.read_bytes()
    capsys.readouterr()
    assert _matrix(tmp_path) == 2
    line = _one_line(capsys.readouterr().err)
    assert "exists" in line and "--force" in line and str(final) in line
    assert final.read_bytes() == before


def test_matrix_force_replaces_evidence_and_its_stale_report(tmp_path: Path, capsys, stand_in) -> None:
    _matrix(tmp_path)
    final = tmp_path / "portable_cpu.json"
    assert cli.main(["report", str(final)]) == 0
    report = tmp_path / "portable_cpu.report.md"
    assert report.is_file()
    final.write_text('{"old": "run"}\n')  # stands for the earlier run (timestamps may match within a second)
    _matrix(tmp_path, "--force")
    assert final.read_text() != '{"old": "run"}\n' and '"finalised": true' in final.read_text()
    assert not report.exists(), "the old report described the replaced run"


def test_interrupted_forced_run_keeps_complete_evidence(tmp_path: Path, capsys, monkeypatch) -> None:
    """Ctrl-C during a --force rerun once deleted the complete file at start-up and left a header-only
    partial file; now the complete file stays until the new run finalises."""
    monkeypatch.setattr(matrix, "execute_task", _stand_in_unit)
    _matrix(tmp_path)
    final = tmp_path / "portable_cpu.json"
    before = final.read_bytes()

    def interrupted(task: UnitTask) -> list[dict[str, Any]]:
        raise KeyboardInterrupt

    monkeypatch.setattr(matrix, "execute_task", interrupted)
    assert _matrix(tmp_path, "--force") == 130
    assert final.read_bytes() == before
    assert (tmp_path / "portable_cpu.partial.jsonl").is_file()


def test_matrix_refuses_an_interrupted_runs_partial_file_without_force(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setattr(matrix, "execute_task", lambda task: (_ for _ in ()).throw(KeyboardInterrupt))
    assert _matrix(tmp_path) == 130
    partial = tmp_path / "portable_cpu.partial.jsonl"
    before = partial.read_bytes()
    capsys.readouterr()
    monkeypatch.setattr(matrix, "execute_task", _stand_in_unit)
    assert _matrix(tmp_path) == 2
    assert "interrupted run" in _one_line(capsys.readouterr().err)
    assert partial.read_bytes() == before


def test_report_of_a_partial_file_keeps_the_complete_files_report(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setattr(matrix, "execute_task", _stand_in_unit)
    _matrix(tmp_path)
    final = tmp_path / "portable_cpu.json"
    assert cli.main(["report", str(final)]) == 0
    report = tmp_path / "portable_cpu.report.md"
    before = report.read_bytes()
    monkeypatch.setattr(matrix, "execute_task", lambda task: (_ for _ in ()).throw(KeyboardInterrupt))
    assert _matrix(tmp_path, "--force") == 130
    partial = tmp_path / "portable_cpu.partial.jsonl"
    assert cli.main(["report", str(partial)]) == 0
    assert report.read_bytes() == before
    assert (tmp_path / "portable_cpu.partial.report.md").is_file()


def test_merge_refuses_an_existing_out_without_force(factory, tmp_path: Path, capsys) -> None:
    writer, _ = factory.write("m")
    shard = writer.path
    existing = tmp_path / "unrelated.json"
    existing.write_text('{"keep": "me"}\n')
    assert cli.main(["merge", str(shard), "--out", str(existing)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "exists" in line and "--force" in line
    assert existing.read_text() == '{"keep": "me"}\n'
    assert cli.main(["merge", str(shard), "--out", str(existing), "--force"]) == 0
    assert existing.read_text() != '{"keep": "me"}\n'  # negative control: --force does replace it


@pytest.mark.parametrize(
    "argv",
    [
        ["matrix", "--profile", "portable_cpu", "--out"],
        ["chain", "--profile", "portable_cpu", "--out"],
    ],
    ids=["matrix", "chain"],
)
def test_out_inside_the_checkout_is_refused_before_a_folder_is_made(argv: list[str], capsys) -> None:
    target = REPO / "ws1-refused-out-dir" / "sub"
    assert not target.parent.exists()
    assert cli.main([*argv, str(target)]) == 2
    assert "inside the git checkout" in _one_line(capsys.readouterr().err)
    assert not target.parent.exists()


def test_merge_out_inside_the_checkout_is_refused_before_a_folder_is_made(factory, capsys) -> None:
    writer, _ = factory.write("c")
    target = REPO / "ws1-refused-merge-dir" / "m.json"
    assert cli.main(["merge", str(writer.path), "--out", str(target)]) == 2
    assert "inside the git checkout" in _one_line(capsys.readouterr().err)
    assert not target.parent.exists()


def _chain_args(out: Path, *tiers: str) -> list[str]:
    return [
        "chain",
        "--profile",
        "portable_cpu",
        *(a for t in tiers for a in ("--tier", t)),
        "--out",
        str(out),
    ]


def test_chain_refuses_a_repeated_tier_up_front(tmp_path: Path, capsys) -> None:
    assert cli.main(_chain_args(tmp_path, "short", "short")) == 2
    assert "--tier short given more than once" in _one_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


def test_interrupted_chain_keeps_the_tiers_it_finished(tmp_path: Path, capsys, monkeypatch) -> None:
    """An interrupted `ws1 chain` once lost every tier it had judged: each tier's cell now reaches the partial
    file as soon as it is judged."""
    import json

    from ws1_harness.run import chain as chain_mod

    calls: list[str] = []

    class _Cell:
        def __init__(self, tier: str) -> None:
            self.tier = tier

        def to_json(self) -> dict[str, Any]:
            return {"profile": "portable_cpu", "model": "tiny", "layers": 2, "tier": self.tier, "stub": True}

    def cell(self, tier: str) -> _Cell:
        calls.append(tier)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return _Cell(tier)

    monkeypatch.setattr(chain_mod.Chain, "cell", cell)
    args = _chain_args(tmp_path, "short", "primary")
    assert cli.main(args) == 130
    partials = list(tmp_path.glob("*.partial.jsonl"))
    assert len(partials) == 1, list(tmp_path.iterdir())
    records = [json.loads(line) for line in partials[0].read_text().splitlines()]
    kept = [r["cell"]["tier"] for r in records if r["record"] == "chain_cell"]
    assert kept == ["short"]
    assert "kept in" in capsys.readouterr().err
