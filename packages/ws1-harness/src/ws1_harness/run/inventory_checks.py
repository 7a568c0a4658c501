"""Direct checks of the inventory items that are not chain nodes (needs torch; the gate does not import it).

Each check runs the stock elementwise op the chain uses for that step and asks two things: does a row computed
alone have the same bits as the row inside a batch, and does the op round once from the exact fp32 result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ws1_harness.run.compare import bitwise_equal
from ws1_harness.verdict.inventory import DIRECT_ITEMS, ITEMS, InventoryItem, node_verdicts


def _rows(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(torch.bfloat16)


def _row_alone_equals_batch(op: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> bool:
    """Row 3 computed alone has the same bits as row 3 computed inside the batch."""
    batch = op(*inputs)
    alone = op(*(x[3:4] for x in inputs))
    return bitwise_equal(alone, batch[3:4]).passed


def _check_residual_add() -> tuple[bool, str]:
    x, y = _rows(1, (16, 4096)), _rows(2, (16, 4096))
    ok = _row_alone_equals_batch(torch.add, x, y)
    exact = bitwise_equal(torch.add(x, y), (x.float() + y.float()).to(torch.bfloat16)).passed
    return ok and exact, f"row-invariant={ok}, equals fp32 add rounded once={exact}"


def _check_scale() -> tuple[bool, str]:
    x = _rows(3, (16, 4096))
    scale = 128**-0.5
    ok = _row_alone_equals_batch(lambda t: t * scale, x)
    exact = bitwise_equal(x * scale, (x.float() * scale).to(torch.bfloat16)).passed
    return ok and exact, f"row-invariant={ok}, equals fp32 scale rounded once={exact}"


def _check_mask_fill() -> tuple[bool, str]:
    x = _rows(4, (16, 64))
    mask = torch.zeros(16, 64, dtype=torch.bool)
    mask[:, 40:] = True
    ok = _row_alone_equals_batch(lambda t, m: t.masked_fill(m, float("-inf")), x, mask)
    filled = x.masked_fill(mask, float("-inf"))
    neg_inf = bool(torch.isneginf(filled[mask]).all())
    return ok and neg_inf, f"row-invariant={ok}, masked entries are -inf={neg_inf}"


def _rne_bf16(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 round-to-nearest-even by integer arithmetic, independent of torch's cast."""
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    lsb = (bits >> 16) & 1
    rounded = (bits + 0x7FFF + lsb) >> 16
    return (rounded & 0xFFFF).to(torch.int32).to(torch.int16)


def _check_dtype_cast() -> tuple[bool, str]:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1 << 16, generator=gen)
    # ties: exactly half-way between two bf16 values, both even and odd lower neighbours
    ties = torch.tensor([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -(1.0 + 2.0**-8), 2.0**-8 + 2.0**-16])
    x = torch.cat([x, ties])
    ours = _rne_bf16(x)
    torch_bits = x.to(torch.bfloat16).view(torch.int16)
    ok = bool(torch.equal(ours, torch_bits))
    return ok, f"fp32->bf16 cast is round-to-nearest-even on {x.numel()} values incl. ties: {ok}"


def _check_bias_policy(model_bias: Iterable[bool]) -> tuple[bool, str]:
    flags = list(model_bias)
    ok = bool(flags) and not any(flags)
    return ok, f"manifest models declare bias={flags}; Qwen3 dense has no biases and no candidate takes one"


def direct_verdicts(model_bias: Iterable[bool]) -> dict[str, InventoryItem]:
    """Verdicts of the inventory items checked directly on the stock op the chain uses for them."""
    checks: dict[str, Callable[[], tuple[bool, str]]] = {
        "residual_add": _check_residual_add,
        "scale": _check_scale,
        "mask_fill": _check_mask_fill,
        "dtype_cast": _check_dtype_cast,
        "bias_policy": lambda: _check_bias_policy(model_bias),
    }
    out: dict[str, InventoryItem] = {}
    for item in DIRECT_ITEMS:
        try:
            ok, detail = checks[item]()
        except Exception as exc:  # a crashing check is an open verdict, never a pass
            ok, detail = False, f"check raised {type(exc).__name__}: {exc}"
        out[item] = InventoryItem(item, "pass" if ok else "fail", "direct", detail)
    return out


def inventory(
    cells: Iterable[Mapping[str, Any]], profile: str, model_bias: Iterable[bool]
) -> list[InventoryItem]:
    """The full inventory of one profile, in a fixed item order."""
    merged = {**node_verdicts(cells, profile), **direct_verdicts(model_bias)}
    return [merged[item] for item in ITEMS]
