"""The environment each shard of an evidence file ran in, and what differs between them (printed by `ws1 gate`).

A merged verdict over the CPU, sm86 and sm90 shards is one claim about one commit, but each shard ran on its own
machine: another torch, Triton, CUDA or driver can change a kernel's bits. The gate does not refuse a difference
(the CPU shard never has the GPU's CUDA), it names it, so a reader can tell a disagreement between arches from a
disagreement between environments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: provenance fields compared across shards, in print order
FIELDS: tuple[str, ...] = (
    "device_name",
    "capability",
    "arch_proxy",
    "driver",
    "cuda",
    "torch",
    "triton",
    "python",
    "extension_archs",
)


def _code(prov: Mapping[str, Any]) -> str:
    """The code the runtime loaded, as `binary/PTX` versions (the CUDA extension's build as it ran)."""
    objs = prov.get("code_objects") or []
    versions = sorted({f"{o.get('binary_version')}/{o.get('ptx_version')}" for o in objs})
    return ",".join(versions) if versions else "-"


def shard_provenances(doc: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(shard file, provenance) of each shard of a merged file, or of the file itself."""
    shards = doc.get("shards") or []
    if shards:
        return [(s["file"], s["provenance"]) for s in shards]
    return [("(this file)", doc["provenance"])]


def environment_lines(doc: Mapping[str, Any]) -> list[str]:
    """One line per shard, then one line per field whose value differs between shards."""
    rows = shard_provenances(doc)
    lines = ["environments:"]
    for name, prov in rows:
        lines.append(
            "  "
            + name
            + ": "
            + " ".join(f"{f}={prov.get(f) if prov.get(f) not in (None, '') else '-'}" for f in FIELDS)
            + f" code_objects={_code(prov)}"
        )
    lines += differences(rows)
    return lines


def differences(rows: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    out = []
    for field in (*FIELDS, "code_objects"):
        values: dict[str, list[str]] = {}
        for name, prov in rows:
            value = _code(prov) if field == "code_objects" else str(prov.get(field) or "-")
            values.setdefault(value, []).append(name)
        if len(values) > 1:
            out.append(f"  differ: {field}: " + "; ".join(f"{v} ({', '.join(n)})" for v, n in values.items()))
    return out
