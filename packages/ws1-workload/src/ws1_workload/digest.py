"""Content digests of fixtures and layouts: what `ws1-workload describe` prints and evidence can record.

A digest is the SHA-256 of the canonical JSON of every field that defines the object (token ids, masks,
physical maps, prefix lengths), so two runs agree on a digest exactly when they agree on the bytes.
"""

from __future__ import annotations

from typing import Any

from ._contract import fingerprint
from .fixtures import Fixture
from .layouts import Layout


def fixture_record(fx: Fixture) -> dict[str, Any]:
    return {
        "case_id": fx.case_id,
        "pad_id": fx.pad_id,
        "samples": [
            {
                "sample_id": s.sample_id,
                "length": s.length,
                "prompt_len": s.prompt_len,
                "token_ids": s.token_ids.tolist(),
                "active": s.active.tolist(),
            }
            for s in fx.samples
        ],
    }


def fixture_digest(fx: Fixture) -> str:
    return fingerprint(fixture_record(fx))


def layout_record(layout: Layout) -> dict[str, Any]:
    return {
        "name": layout.name,
        "kind": layout.kind,
        "type": layout.type,
        "fixture": fixture_digest(layout.fixture),
        "calls": [
            {
                "index": c.index,
                "grid": list(c.grid) if c.grid is not None else None,
                "prefix_lengths": sorted([int(s), int(p)] for s, p in c.prefix_lengths.items()),
                "sample_ids": c.sample_ids.tolist(),
                "positions": c.positions.tolist(),
                "token_ids": c.token_ids.tolist(),
            }
            for c in layout.calls
        ],
    }


def layout_digest(layout: Layout) -> str:
    return fingerprint(layout_record(layout))
