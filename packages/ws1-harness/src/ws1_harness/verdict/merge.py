"""Merge shard evidence files into one evidence document.

Shards are run separately (per profile, per GPU kind, `--shard i/n`) and merged before the gate. A merge is
only meaningful when every shard judged the same code against the same workload and contract, so the merge
refuses shards that disagree on the schema version, git commit, dirty flag, workload (id, fingerprint,
revision), contract fingerprint, judgments or operator specs, shards that are not finalised, shards that are
themselves merges, and shards that overlap (the same cell key, or the same chain cell, twice). A `ws1 chain`
shard (chain cells, no matrix axes) merges with the matrix shards of the same commit, workload and contract.
Evidence from another commit is never mixed in (an earlier gate accepted it on the claim that later commits did
not change operators). The merged file records every shard (file name, hash, command, provenance, counts, the
shard's own cells digests), and each cell (matrix or chain) records the index of the shard it came from; the
merged file's own digests cover the merged cells. Every reader recomputes them, so a cell edited in the merged
file is refused even where the shard files are gone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ws1_harness.verdict.cells import CellKey, cell_key_of
from ws1_harness.verdict.evidence import (
    SCHEMA_VERSION,
    EvidenceError,
    cells_digest,
    chain_key,
    chain_label,
    counts_of,
    file_sha256,
    load_evidence,
    utc_now,
    validate_evidence,
)
from ws1_harness.verdict.inventory import node_verdicts
from ws1_harness.verdict.provenance import collect_provenance


class MergeError(EvidenceError):
    """Shards that cannot be merged. One line."""


def _union(seqs: Sequence[Sequence[str]]) -> list[str]:
    out: list[str] = []
    for seq in seqs:
        for item in seq:
            if item not in out:
                out.append(item)
    return out


def _agree(docs: Sequence[tuple[str, Mapping[str, Any]]], what: str, get: Any) -> None:
    first_name, first = docs[0]
    want = get(first)
    for name, doc in docs[1:]:
        got = get(doc)
        if got != want:
            raise MergeError(f"merge: {name} disagrees with {first_name} on {what}: {got!r} != {want!r}")


def merge(
    shards: Sequence[str | Path],
    *,
    command: str = "ws1 merge",
    argv: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Merge finalised shard files into one finalised, validated evidence document (not yet written)."""
    if not shards:
        raise MergeError("merge: no shards given")
    loaded: list[tuple[str, Mapping[str, Any], str]] = []
    for path in shards:
        shard_doc = load_evidence(path)
        if shard_doc["shards"]:
            raise MergeError(f"merge: {path} is already a merged file; merge the original shards")
        loaded.append((str(path), shard_doc, file_sha256(path)))
    named = [(name, doc) for name, doc, _ in loaded]
    _agree(named, "schema_version", lambda d: d["schema_version"])
    _agree(named, "git commit", lambda d: d["provenance"]["git_commit"])
    _agree(named, "dirty flag", lambda d: d["provenance"]["git_dirty"])
    _agree(named, "workload id", lambda d: d["workload"]["id"])
    _agree(named, "workload fingerprint", lambda d: d["workload"]["fingerprint"])
    _agree(named, "workload revision", lambda d: d["workload"]["revision"])
    _agree(named, "contract fingerprint", lambda d: d["contract"]["fingerprint"])
    # A chain shard (`ws1 chain`: chain cells, empty matrix axes) renders no matrix judgment; the matrix shards
    # among the inputs must still agree on theirs.
    matrix = [(name, doc) for name, doc in named if doc["axes"]["operators"]]
    if matrix:
        _agree(matrix, "judgments", lambda d: sorted(d["axes"]["judgments"]))

    specs: dict[str, Any] = {}
    for name, doc in named:
        for op, spec in doc["axes"]["operator_specs"].items():
            if op in specs and specs[op] != spec:
                raise MergeError(f"merge: {name} disagrees on the operator spec of {op!r}")
            specs[op] = spec

    owner: dict[CellKey, str] = {}
    cells: list[dict[str, Any]] = []
    for index, (name, doc) in enumerate(named):
        for raw in doc["cells"]:
            key = cell_key_of(raw)
            if key in owner:
                raise MergeError(f"merge: shards overlap: {key.label()} is in {owner[key]} and {name}")
            owner[key] = name
            cells.append({**raw, "shard": index})
    chain_owner: dict[tuple[str, str, int, str], str] = {}
    chain_cells: list[dict[str, Any]] = []
    for index, (name, doc) in enumerate(named):
        for raw in doc["chain_cells"]:
            ckey = chain_key(raw)
            if ckey in chain_owner:
                raise MergeError(
                    f"merge: shards overlap: {chain_label(raw)} is in {chain_owner[ckey]} and {name}"
                )
            chain_owner[ckey] = name
            chain_cells.append({**raw, "shard": index})

    inventory: dict[tuple[str, str], dict[str, Any]] = {}
    for _, doc in named:
        for item in doc.get("inventory", []):
            key2 = (item["profile"], item["item"])
            # Shards may each check the same item; any verdict other than pass wins (never hide a failure).
            if key2 not in inventory or item["verdict"] != "pass":
                inventory[key2] = dict(item)

    profiles = _union([d["axes"]["profiles"] for _, d in named])
    # The chain-node items are verdicts of the merged cells, derived again here as the gate derives them (a
    # shard that ran other operators says `not_run` for a node another shard ran green).
    for profile in profiles:
        for item, verdict in node_verdicts(cells, profile).items():
            inventory[(profile, item)] = {"profile": profile, **verdict.to_json()}

    axes = {
        "profiles": profiles,
        "operators": _union([d["axes"]["operators"] for _, d in named]),
        "tiers": _union([d["axes"]["tiers"] for _, d in named]),
        "judgments": _union([d["axes"]["judgments"] for _, d in named]),
        "operator_specs": specs,
    }
    first = named[0][1]
    merged: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "finalised": True,
        "created_utc": utc_now(),
        "provenance": collect_provenance(argv).to_json(),
        "workload": dict(first["workload"]),
        "contract": dict(first["contract"]),
        "command": command,
        "shard": None,
        "axes": axes,
        "counts": counts_of(cells),
        "cells": cells,
        "cells_digest": cells_digest(cells),
        "chain_cells": chain_cells,
        "chain_cells_digest": cells_digest(chain_cells),
        "inventory": [inventory[k] for k in sorted(inventory)],
        "shards": [
            {
                "file": Path(name).name,
                "sha256": digest,
                "command": doc["command"],
                "shard": doc["shard"],
                "provenance": doc["provenance"],
                "counts": doc["counts"],
                "cells_digest": doc["cells_digest"],
                "chain_cells_digest": doc["chain_cells_digest"],
            }
            for name, doc, digest in loaded
        ],
    }
    validate_evidence(merged, "merge")
    return merged
