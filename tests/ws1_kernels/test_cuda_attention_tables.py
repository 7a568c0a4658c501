"""The CUDA attention's host tables (no GPU needed): every query row sees exactly its sample's keys of positions
0..p, laid out contiguously from the row its `key_base` names, whether the keys come from a prefix or the call.

Checked by gathering the keys each row would read and comparing them with the logical keys of its sample; the
negative control shifts one table entry and must see the check fail.
"""

from __future__ import annotations

import torch

from ws1_kernels import LayoutContext
from ws1_kernels.cuda.attention import _keys, _tables

HKV, D = 2, 4


def _logical_keys(lengths: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """sample -> [L, Hkv, D]: a distinct value per (sample, position), so a wrong row is visible."""
    return {
        s: (torch.arange(n, dtype=torch.float32)[:, None, None] + 1000 * s).expand(n, HKV, D).clone()
        for s, n in enumerate(lengths)
    }


def _call(keys: dict[int, torch.Tensor], rows: list[tuple[int, int]], prefixes: dict[int, int]):
    """A call holding `rows` [(sample, position)], pads (-1, -1), and each sample's keys before `prefixes[s]`."""
    sids = torch.tensor([s for s, _ in rows], dtype=torch.int64)
    pos = torch.tensor([p for _, p in rows], dtype=torch.int64)
    prefix = {s: (keys[s][:n], keys[s][:n]) for s, n in prefixes.items() if n}
    ctx = LayoutContext(sids, pos, prefix)
    k = torch.stack([keys[s][p] if s >= 0 else torch.full((HKV, D), -7.0) for s, p in rows])
    return ctx, k


def _seen(ctx: LayoutContext, k: torch.Tensor, rows: list[tuple[int, int]]) -> list[bool]:
    t = _tables(ctx, len(rows), torch.device("cpu"))
    k_all, _ = _keys(ctx, k, k) if t.prefix else (k, k)
    ok = []
    for r, (s, p) in enumerate(rows):
        n, base = int(t.n_keys[r]), int(t.key_base[r])
        if s < 0:
            ok.append(n == 0)
            continue
        want = torch.arange(p + 1, dtype=torch.float32) + 1000 * s
        ok.append(n == p + 1 and torch.equal(k_all[base : base + n, 0, 0], want))
    return ok


def test_a_packed_call_sees_each_samples_own_keys() -> None:
    keys = _logical_keys((3, 5))
    rows = [(0, 0), (0, 1), (0, 2), (-1, -1), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4)]
    ctx, k = _call(keys, rows, {})
    assert all(_seen(ctx, k, rows))
    t = _tables(ctx, len(rows), torch.device("cpu"))
    assert t.q_end.tolist() == [3, 3, 3, 3, 9, 9, 9, 9, 9] and not t.prefix


def test_a_chunked_or_decode_call_sees_prefix_then_its_rows() -> None:
    keys = _logical_keys((6, 4))
    rows = [(0, 4), (0, 5), (1, 3)]  # sample 0 after 4 cached keys, sample 1 decoding its position 3
    ctx, k = _call(keys, rows, {0: 4, 1: 3})
    assert all(_seen(ctx, k, rows))
    assert _tables(ctx, len(rows), torch.device("cpu")).prefix


def test_a_shifted_table_is_caught() -> None:
    keys = _logical_keys((6, 4))
    rows = [(0, 4), (0, 5), (1, 3)]
    ctx, k = _call(keys, rows, {0: 4, 1: 3})
    t = _tables(ctx, len(rows), torch.device("cpu"))
    t.key_base[2] += 1  # the cached table, shifted by one row
    assert _seen(ctx, k, rows) == [True, True, False]
