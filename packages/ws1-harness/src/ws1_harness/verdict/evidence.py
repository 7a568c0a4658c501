"""Evidence files: written cell by cell while the matrix runs, finalised into one validated JSON document.

Why it works this way:
- A hung or crashed run of an earlier gate left nothing behind. The writer appends every cell to
  `<name>.partial.jsonl` (one JSON object per line, flushed and fsync'd) as soon as it is known; a crash leaves
  a readable partial file whose `finalised` is false, which the gate reads as red, never as a pass.
- An empty or truncated file once passed an earlier gate. `finalise()` validates the whole document against
  `evidence.schema.json` (shipped by ws1_contract) plus semantic checks before an atomic rename, and every
  reader repeats those checks; missing fields never default to empty.
- Provenance is collected by the writer itself, always (an earlier gate checked it only when a caller
  passed it).
- A finalised file records a digest of its cells (`cells_digest`; a merged file also each shard's), and every
  reader recomputes it, so a cell edited after the file was written is bad input, never a quiet pass. A forger
  who rewrites the cells and recomputes the digest is not stopped by it (docs/gate.md says what the gate cannot
  stop); the gate re-judges each cell from its own records for that.
- Duplicate JSON keys are refused (`"status": "red", "status": "green"` would otherwise keep the last one):
  evidence is parsed with the contract's strict reader, the same one the contract loader uses.
- An earlier gate wrote its artifact into the checkout and dirtied the tree. Every command names where its
  output goes (`--out`; nox uses `$WS1_OUT`, else a folder under the system temp dir), and a path inside a git
  work tree that git does not ignore is refused unless the caller passes `allow_in_checkout=True`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ws1_harness.errors import HarnessError
from ws1_harness.verdict.cells import Cell, CellError, CellKey, OperatorInfo, operator_infos
from ws1_harness.verdict.provenance import collect_provenance
from ws1_harness.verdict.status import CellStatus

# 2: arch-labelled profiles, per-cell device; 3: checks, cells digests, plug-in sources; 4: chain cells
SCHEMA_VERSION = 4
PARTIAL_SUFFIX = ".partial.jsonl"
#: What `ws1 report` writes beside `<stem>.json` (ws1_harness.verdict.report names its files with these)
REPORT_SUFFIX = ".report.md"
HEATMAP_SUFFIX = ".heatmap.png"
#: ... and, for a file whose profiles ran on two or more arches, one heatmap panel per arch side by side
ARCH_HEATMAP_SUFFIX = ".arch-heatmap.png"
#: The largest evidence file read (the full-width matrix of one profile is about 0.5 MB; a merge of every
#: profile and arch a few MB): refused before reading, so a wrong path cannot exhaust memory.
MAX_EVIDENCE_BYTES = 256 * 2**20


class EvidenceError(HarnessError):
    """Bad, incomplete or unwritable evidence. The message is one line: '<where>: <what>'."""


class DigestError(EvidenceError):
    """A recorded cells digest that does not match the cells: the file was edited after it was written."""


@dataclass(frozen=True)
class WorkloadRef:
    """The manifest a run used: its workload id, fingerprint and revision."""

    id: str
    fingerprint: str
    revision: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "fingerprint": self.fingerprint, "revision": self.revision}


@dataclass(frozen=True)
class Axes:
    """The matrix axes and the operator specs that decide which cells exist and which must be `na`."""

    profiles: tuple[str, ...]
    operators: tuple[str, ...]
    tiers: tuple[str, ...]
    judgments: tuple[str, ...]
    operator_specs: Mapping[str, OperatorInfo]

    @classmethod
    def build(
        cls,
        profiles: Sequence[str],
        operators: Sequence[str],
        tiers: Sequence[str],
        judgments: Sequence[str],
        operator_specs: Mapping[str, Any] | Iterable[Any],
    ) -> Axes:
        """Axes from plain sequences; operator specs (manifest OperatorSpec objects or dicts) are kept only
        for the operators on the axis, and every operator on the axis must have one."""
        infos = operator_infos(operator_specs)
        missing = [op for op in operators if op not in infos]
        if missing:
            raise EvidenceError(f"axes: operators without a spec: {', '.join(missing)}")
        return cls(
            tuple(profiles),
            tuple(operators),
            tuple(tiers),
            tuple(judgments),
            {op: infos[op] for op in operators},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "profiles": list(self.profiles),
            "operators": list(self.operators),
            "tiers": list(self.tiers),
            "judgments": list(self.judgments),
            "operator_specs": {name: info.to_json() for name, info in self.operator_specs.items()},
        }

    def contains(self, key: CellKey) -> bool:
        return (
            key.profile in self.profiles
            and key.operator in self.operators
            and key.tier in self.tiers
            and key.judgment in self.judgments
        )


@dataclass(frozen=True)
class EvidenceHeader:
    """Everything about a run except its cells and provenance (which the writer collects itself)."""

    workload: WorkloadRef
    contract_fingerprint: str
    command: str
    axes: Axes
    shard: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload.to_json(),
            "contract": {"fingerprint": self.contract_fingerprint},
            "command": self.command,
            "shard": self.shard,
            "axes": self.axes.to_json(),
        }


# ---------------------------------------------------------------------------------------------- locations


def partial_path_for(path: Path) -> Path:
    """`dir/name.json` → `dir/name.partial.jsonl`."""
    stem = path.name[: -len(".json")] if path.name.endswith(".json") else path.name
    return path.with_name(stem + PARTIAL_SUFFIX)


def _git_toplevel(path: Path) -> Path | None:
    """The work tree holding `path` (found by walking up to a `.git` entry), or None."""
    probe = path.resolve()
    for parent in (probe, *probe.parents):
        if (parent / ".git").exists():
            return parent
    return None


def check_outside_checkout(path: Path) -> None:
    """Refuse an evidence path inside a git work tree unless git ignores it: it would dirty the tree."""
    top = _git_toplevel(path.parent if not path.is_dir() else path)
    if top is None:
        return
    if shutil.which("git") is not None:
        try:
            proc = subprocess.run(
                ["git", "-C", str(top), "check-ignore", "-q", "--no-index", str(path.resolve())],
                capture_output=True,
                timeout=30,
                check=False,
            )
            if proc.returncode == 0:
                return
        except (OSError, subprocess.SubprocessError):
            pass
    raise EvidenceError(
        f"evidence: {path} is inside the git checkout {top} and not ignored; write outside it "
        "(e.g. under $WS1_OUT or /tmp) or pass --allow-in-checkout"
    )


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def json_safe_copy(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A plain-JSON copy (tuples become lists), so the digest of what is written equals the digest read back."""
    return dict(json.loads(_dumps(obj)))


def _dumps(obj: Any) -> str:
    """Strict JSON (no NaN/Infinity): a non-finite float in a diagnostic must be converted by its producer."""
    try:
        return json.dumps(obj, allow_nan=False, sort_keys=False, separators=(",", ":"))
    except ValueError as exc:
        raise EvidenceError(f"evidence: not strict JSON ({exc})") from None


# ---------------------------------------------------------------------------------------------- validation


def counts_of(cells: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Number of cells per status, plus the total."""
    counts = {s.value: 0 for s in CellStatus}
    total = 0
    for cell in cells:
        counts[cell["status"]] += 1
        total += 1
    counts["total"] = total
    return counts


def cells_digest(cells: Iterable[Mapping[str, Any]]) -> str:
    """`sha256:<hex>` of the canonical JSON (sorted keys, no whitespace) of a list of cells."""
    from ws1_contract import sha256_fingerprint

    return sha256_fingerprint([dict(c) for c in cells])


def chain_key(raw: Mapping[str, Any]) -> tuple[str, str, int, str]:
    """A chain cell's identity: (profile, model, layers, tier)."""
    return (raw["profile"], raw["model"], raw["layers"], raw["tier"])


def chain_label(raw: Mapping[str, Any]) -> str:
    """`chain <profile>/<model>/L<layers>/<tier>`: how the gate and the report name a chain cell."""
    return f"chain {raw['profile']}/{raw['model']}/L{raw['layers']}/{raw['tier']}"


def shard_cells(cells: Iterable[Mapping[str, Any]], index: int) -> list[dict[str, Any]]:
    """The cells of a merged file that came from shard `index`, as that shard recorded them (no `shard` key)."""
    return [{k: v for k, v in c.items() if k != "shard"} for c in cells if c.get("shard") == index]


def _check_digests(doc: Mapping[str, Any], source: str) -> None:
    if doc["cells_digest"] is None and doc["chain_cells_digest"] is None and not doc["finalised"]:
        return  # a partial file: no digest yet
    for field, what in (("cells", "cells"), ("chain_cells", "chain cells")):
        recorded = doc[f"{field}_digest"]
        if recorded is None:
            raise DigestError(
                f"{source}: {field}_digest: a finalised file must record the digest of its {what}"
            )
        actual = cells_digest(doc[field])
        if recorded != actual:
            raise DigestError(
                f"{source}: {field}_digest: {recorded[:19]}... does not match the {what} ({actual[:19]}...): "
                f"the {what} were edited after the file was written"
            )
        for i, entry in enumerate(doc["shards"]):
            actual = cells_digest(shard_cells(doc[field], i))
            if entry[f"{field}_digest"] != actual:
                raise DigestError(
                    f"{source}: shards[{i}] ({entry['file']}): {what} digest {entry[f'{field}_digest'][:19]}... "
                    f"does not match the {what} of that shard in this file ({actual[:19]}...)"
                )


def _schema_check(doc: Any, source: str) -> None:
    from ws1_contract import ContractError, validate_document

    # A file of another evidence version would fail the schema on whichever field changed first ("'cells_digest'
    # is a required property"), which says nothing about why; say the version instead. Files with a `kind`
    # (bench, tuning) are not evidence and keep the schema's own message.
    version = doc.get("schema_version") if isinstance(doc, dict) and "kind" not in doc else None
    if isinstance(version, int) and not isinstance(version, bool) and version != SCHEMA_VERSION:
        raise EvidenceError(
            f"{source}: evidence schema_version {version}; this ws1 reads version {SCHEMA_VERSION} only "
            f"(run the matrix again with this ws1)"
        )

    try:
        validate_document(doc, "evidence", source)
    except ContractError as exc:
        raise EvidenceError(str(exc).splitlines()[0] if str(exc) else f"{source}: schema violation") from None


def validate_evidence(doc: Any, source: str) -> None:
    """Schema plus semantic checks; raises EvidenceError. Does not require `finalised` (see load_evidence)."""
    _schema_check(doc, source)
    cells = doc["cells"]
    if doc["counts"] != counts_of(cells):
        raise EvidenceError(f"{source}: counts {doc['counts']} do not match the cells {counts_of(cells)}")
    seen: set[CellKey] = set()
    n_shards = len(doc["shards"])
    for i, raw in enumerate(cells):
        try:
            cell = Cell.from_json(raw)
        except CellError as exc:
            raise EvidenceError(f"{source}: cells[{i}]: {exc}") from None
        if cell.key in seen:
            raise EvidenceError(f"{source}: cells[{i}]: duplicate cell {cell.key.label()}")
        seen.add(cell.key)
        if cell.shard is not None and cell.shard >= n_shards:
            raise EvidenceError(
                f"{source}: cells[{i}]: shard index {cell.shard} but {n_shards} shards recorded"
            )
        if n_shards and cell.shard is None:
            raise EvidenceError(f"{source}: cells[{i}]: a merged file's cell must name its shard")
    chain_seen: set[tuple[str, str, int, str]] = set()
    for i, raw in enumerate(doc["chain_cells"]):
        if chain_key(raw) in chain_seen:
            raise EvidenceError(f"{source}: chain_cells[{i}]: duplicate {chain_label(raw)}")
        chain_seen.add(chain_key(raw))
        shard = raw.get("shard")
        if shard is not None and shard >= n_shards:
            raise EvidenceError(
                f"{source}: chain_cells[{i}]: shard index {shard} but {n_shards} shards recorded"
            )
        if n_shards and shard is None:
            raise EvidenceError(f"{source}: chain_cells[{i}]: a merged file's chain cell must name its shard")
    _check_digests(doc, source)
    workload = doc["workload"]
    if not workload["id"].endswith(f".r{workload['revision']}"):
        raise EvidenceError(
            f"{source}: workload id {workload['id']!r} does not embed its revision {workload['revision']}"
        )
    ax = doc["axes"]
    missing = [op for op in ax["operators"] if op not in ax["operator_specs"]]
    if missing:
        raise EvidenceError(f"{source}: axes: operators without a spec: {', '.join(missing)}")


def _parse_json(text: str, source: str) -> Any:
    """Strict JSON: no NaN/Infinity, no duplicate keys (the contract's own reader, one helper for both)."""
    from ws1_contract import ContractError
    from ws1_contract.documents import parse_json

    try:
        return parse_json(text, source)
    except ContractError as exc:
        raise EvidenceError(f"{exc.path}: malformed JSON ({exc.message})") from None


def _read_partial(text: str, source: str, tolerate_torn_tail: bool) -> dict[str, Any]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines and tolerate_torn_tail:
        lines.pop()  # a line without its newline was cut by a crash
    if not lines:
        raise EvidenceError(f"{source}: empty partial evidence file")
    records = []
    for n, line in enumerate(lines, start=1):
        rec = _parse_json(line, f"{source}:{n}")
        if not isinstance(rec, dict) or rec.get("record") not in (
            "header",
            "cell",
            "chain_cell",
            "inventory",
        ):
            raise EvidenceError(f"{source}:{n}: not a header, cell, chain cell or inventory record")
        records.append(rec)
    if records[0]["record"] != "header" or any(r["record"] == "header" for r in records[1:]):
        raise EvidenceError(f"{source}: a partial file is one header record followed by cell records")
    header = records[0].get("evidence")
    if not isinstance(header, dict):
        raise EvidenceError(f"{source}:1: header record has no evidence object")
    cells: list[Any] = [r.get("cell") for r in records[1:] if r["record"] == "cell"]
    doc = dict(header)
    doc["cells"] = cells
    doc["chain_cells"] = [r.get("cell") for r in records[1:] if r["record"] == "chain_cell"]
    for rec in records[1:]:
        if rec["record"] == "inventory":
            doc["inventory"] = rec.get("inventory")
    with contextlib.suppress(KeyError, TypeError):  # a malformed cell: the schema check names it
        doc["counts"] = counts_of(cells)
    doc["finalised"] = False
    doc["cells_digest"] = None  # a partial file has no digest; the gate reads it as red (not finalised)
    doc["chain_cells_digest"] = None
    return doc


def read_evidence(path: str | Path, *, tolerate_torn_tail: bool = False) -> dict[str, Any]:
    """Read a finalised `.json` or a `.partial.jsonl` file; schema + semantic checks, `finalised` may be false.

    Any problem (missing file, empty, truncated, malformed, schema-invalid, inconsistent) is an EvidenceError.
    """
    p = Path(path)
    source = str(p)
    try:
        info = p.stat()
        if not stat.S_ISREG(info.st_mode):  # /dev/zero once read until MemoryError
            raise EvidenceError(f"{source}: not a regular file")
        if info.st_size > MAX_EVIDENCE_BYTES:
            raise EvidenceError(
                f"{source}: {info.st_size / 2**20:.0f} MiB, above the {MAX_EVIDENCE_BYTES // 2**20} MiB an "
                "evidence file may hold"
            )
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EvidenceError(f"{source}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise EvidenceError(f"{source}: unreadable ({type(exc).__name__})") from None
    if not text.strip():
        raise EvidenceError(f"{source}: empty file")
    if p.name.endswith(PARTIAL_SUFFIX):
        doc = _read_partial(text, source, tolerate_torn_tail)
    else:
        doc = _parse_json(text, source)
    validate_evidence(doc, source)
    return doc


def load_evidence(path: str | Path) -> dict[str, Any]:
    """A complete evidence file: read_evidence plus `finalised` must be true."""
    doc = read_evidence(path)
    if not doc["finalised"]:
        raise EvidenceError(f"{path}: evidence is not finalised (partial or crashed run)")
    return doc


def file_sha256(path: str | Path) -> str:
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


def refuse_existing(path: Path, what: str) -> None:
    """One line refusing to write over `path` (which holds `what`) without `--force`: nothing is lost silently."""
    if path.exists():
        raise EvidenceError(f"{path} exists ({what}): pass --force to replace it, or name another --out")


def write_evidence_json(doc: Mapping[str, Any], path: str | Path, *, allow_in_checkout: bool = False) -> Path:
    """Validate `doc` and write it atomically (temp file, fsync, rename)."""
    p = Path(path)
    if not allow_in_checkout:
        check_outside_checkout(p)
    validate_evidence(doc, str(p))
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, allow_nan=False, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    _fsync_dir(p.parent)
    return p


# ---------------------------------------------------------------------------------------------- writer


def _judged_plugins(prov: dict[str, Any], header: Mapping[str, Any]) -> dict[str, Any]:
    """Keep the plug-in records of the profiles this file judges: a process (a test session, a notebook) may
    have loaded plug-ins it does not judge here, and their records would only say where the file was written."""
    profiles = {str(p).split("@", 1)[0] for p in header.get("axes", {}).get("profiles", [])}
    if profiles:
        prov["plugins"] = [
            e for e in prov.get("plugins", []) if str(e.get("profile", "")).split("@", 1)[0] in profiles
        ]
    return prov


class EvidenceWriter:
    """Writes one run's evidence: each cell is appended and fsync'd as soon as it is known; `finalise()`
    turns the partial file into the complete, validated JSON.

    `path` is the final JSON path (`dir/name.json`); the partial file is `dir/name.partial.jsonl`. An existing
    final or partial file is refused unless `force`; with `force` a complete file at `path` stays untouched
    until `finalise()` replaces it atomically, so an interrupted run never deletes complete evidence (it once
    removed it at start-up and left a header-only partial file). The report and heatmap of the file replaced
    are removed with it: they described the old run.
    """

    def __init__(
        self,
        path: str | Path,
        header: EvidenceHeader,
        *,
        allow_in_checkout: bool = False,
        argv: Sequence[str] | None = None,
        force: bool = False,
    ) -> None:
        self.path = Path(path)
        if not self.path.name.endswith(".json"):
            raise EvidenceError(f"evidence: {self.path} must end in .json")
        if not allow_in_checkout:
            check_outside_checkout(self.path)
        self.allow_in_checkout = allow_in_checkout
        self.partial_path = partial_path_for(self.path)
        if not force:
            refuse_existing(self.path, "a complete evidence file")
            refuse_existing(self.partial_path, "the cells of an interrupted run")
        self.force = force
        self.header = header
        self._doc: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "finalised": False,
            "created_utc": utc_now(),
            "provenance": _judged_plugins(collect_provenance(argv).to_json(), header.to_json()),
            **header.to_json(),
            "cells_digest": None,
            "chain_cells": [],
            "chain_cells_digest": None,
            "shards": [],
            "inventory": [],
        }
        self._cells: list[dict[str, Any]] = []
        self._keys: set[CellKey] = set()
        self._chain_cells: list[dict[str, Any]] = []
        self._finalised = False
        # Validate the header now (with no cells) so a bad header fails before any work is done.
        validate_evidence({**self._doc, "counts": counts_of([]), "cells": []}, str(self.partial_path))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.partial_path, "w", encoding="utf-8")  # noqa: SIM115 - held open across cells
        self._append({"record": "header", "evidence": self._doc})
        _fsync_dir(self.path.parent)

    def _append(self, record: Mapping[str, Any]) -> None:
        self._file.write(_dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def write_cell(self, cell: Cell) -> None:
        """Append one cell (durably). Refuses a cell outside the axes or a key written twice."""
        if self._finalised:
            raise EvidenceError(f"{self.path}: already finalised")
        if not self.header.axes.contains(cell.key):
            raise EvidenceError(f"{self.partial_path}: cell {cell.key.label()} is outside the axes")
        if cell.key in self._keys:
            raise EvidenceError(f"{self.partial_path}: cell {cell.key.label()} written twice")
        raw = cell.to_json()
        self._append({"record": "cell", "cell": raw})
        self._keys.add(cell.key)
        self._cells.append(raw)

    def write_chain_cell(self, raw: Mapping[str, Any]) -> None:
        """Append one `ws1 chain` cell (`ChainCell.to_json()`), durably. Refuses a key written twice; the
        schema is checked on finalise."""
        if self._finalised:
            raise EvidenceError(f"{self.path}: already finalised")
        if any(chain_key(c) == chain_key(raw) for c in self._chain_cells):
            raise EvidenceError(f"{self.partial_path}: {chain_label(raw)} written twice")
        cell = json_safe_copy(raw)
        self._append({"record": "chain_cell", "cell": cell})
        self._chain_cells.append(cell)

    def set_inventory(self, items: Sequence[Mapping[str, Any]]) -> None:
        """Record the inventory of small elementwise steps (one entry per profile and item); written with the final document."""
        if self._finalised:
            raise EvidenceError(f"{self.path}: already finalised")
        self._doc["inventory"] = [dict(i) for i in items]
        self._append({"record": "inventory", "inventory": self._doc["inventory"]})

    @property
    def cells(self) -> tuple[dict[str, Any], ...]:
        return tuple(self._cells)

    def close(self) -> None:
        """Close the partial file without finalising (what a crash leaves behind)."""
        if not self._file.closed:
            self._file.close()

    def finalise(self) -> Path:
        """Validate the complete document, write it atomically to `path`, and remove the partial file."""
        if self._finalised:
            raise EvidenceError(f"{self.path}: already finalised")
        doc = {
            **self._doc,
            "finalised": True,
            "counts": counts_of(self._cells),
            "cells": list(self._cells),
            "cells_digest": cells_digest(self._cells),
            "chain_cells": list(self._chain_cells),
            "chain_cells_digest": cells_digest(self._chain_cells),
        }
        self.close()
        replaced = self.path.exists()
        write_evidence_json(doc, self.path, allow_in_checkout=self.allow_in_checkout)
        if replaced:  # the old run's report and heatmap would describe cells this file no longer holds
            stem = self.path.name[: -len(".json")]
            for stale in (stem + REPORT_SUFFIX, stem + HEATMAP_SUFFIX, stem + ARCH_HEATMAP_SUFFIX):
                (self.path.parent / stale).unlink(missing_ok=True)
        self._finalised = True
        self.partial_path.unlink(missing_ok=True)
        _fsync_dir(self.path.parent)
        return self.path

    def __enter__(self) -> EvidenceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
