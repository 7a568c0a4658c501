"""The inventory of the small elementwise steps of the chain, each with a verdict.

Some of them are chain nodes with matrix cells (rope, silu, swiglu, qk_norm): their verdict is `pass` only when
every one of their cells for the profile is green. The others (residual add, scale, bias policy, mask fill,
dtype cast) are not separate kernels in any profile; the chain does them with one stock elementwise op each, so
the inventory checks those ops directly (`inventory_checks`, which needs torch): row alone vs row in a batch,
raw bits, and the rounding rule. This module imports no torch: the gate re-derives node verdicts from cells.
An earlier inventory gate counted only one failing kind. Here every verdict other than `pass` is open.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

NODE_ITEMS = ("rope", "silu", "swiglu", "qk_norm")
DIRECT_ITEMS = ("residual_add", "scale", "bias_policy", "mask_fill", "dtype_cast")
ITEMS = NODE_ITEMS + DIRECT_ITEMS


@dataclass(frozen=True)
class InventoryItem:
    """One inventory line: verdict `pass`, `fail` or `not_run`, where it came from, and why."""

    item: str
    verdict: str
    source: str
    detail: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def node_verdicts(cells: Iterable[Mapping[str, Any]], profile: str) -> dict[str, InventoryItem]:
    """Verdicts of the inventory items that are chain nodes, from that node's cells."""
    by_op: dict[str, list[Mapping[str, Any]]] = {}
    for cell in cells:
        if cell["profile"] == profile:
            by_op.setdefault(cell["operator"], []).append(cell)
    out: dict[str, InventoryItem] = {}
    for item in NODE_ITEMS:
        own = by_op.get(item, [])
        if not own:
            out[item] = InventoryItem(item, "not_run", "matrix", "no cell of this operator was run")
            continue
        bad = [f"{c['tier']}/{c['judgment']}={c['status']}" for c in own if c["status"] != "green"]
        verdict = "fail" if bad else "pass"
        detail = "; ".join(bad) if bad else f"{len(own)} cells green"
        out[item] = InventoryItem(item, verdict, "matrix", detail)
    return out
