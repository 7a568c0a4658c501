"""The CUDA attention's host tables (no GPU needed): every query row sees exactly its sample's keys of positions
0..p, laid out contiguously from the row its `key_base` names, whether the keys come from a prefix or the call.

Checked by gathering the keys each row would read and comparing them with the logical keys of its sample; the
negative control shifts one table entry and must see the check fail.
"""

from __future__ import annotations

import torch

from ws1_kernels import LayoutContext
from ws1_kernels.cuda.attention import _keys, _tables, row_blocks, tiled

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


# ---- the tiled forward's row blocks: every row in exactly one block, a block within one sample (its rows share
# their keys), at most `tokens` rows, its key count the largest of its rows'


def _blocks_ok(ctx: LayoutContext, rows: int, blocks: list[tuple[int, int, int]], tokens: int) -> list[str]:
    t = _tables(ctx, rows, torch.device("cpu"))
    n_keys = t.n_keys.tolist()
    sample_of = {r: seg.sample_id for seg in ctx.segments for r in range(seg.start, seg.end)}
    faults, seen = [], [0] * rows
    for first, count, keys in blocks:
        members = range(first, first + count)
        if not 1 <= count <= tokens:
            faults.append(f"block at {first}: {count} rows")
        if len({sample_of.get(r, -1) for r in members}) != 1:
            faults.append(f"block at {first} spans samples")
        if keys != max(n_keys[r] for r in members):
            faults.append(f"block at {first}: key count {keys}")
        for r in members:
            seen[r] += 1
    faults += [f"row {r} in {n} blocks" for r, n in enumerate(seen) if n != 1]
    return faults


def test_row_blocks_cover_each_row_once_within_its_sample() -> None:
    keys = _logical_keys((5, 3))
    rows = [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (-1, -1), (-1, -1), (1, 0), (1, 1), (1, 2), (-1, -1)]
    ctx, _ = _call(keys, rows, {})
    n_keys = _tables(ctx, len(rows), torch.device("cpu")).n_keys.tolist()
    blocks = row_blocks(ctx, len(rows), n_keys, 2)
    assert _blocks_ok(ctx, len(rows), blocks, 2) == []
    assert {(0, 2, 2), (2, 2, 4), (4, 1, 5)} <= set(blocks)  # sample 0 in runs of 2, the last run short
    assert (5, 2, 0) in blocks and (10, 1, 0) in blocks  # the pad runs, no keys


def test_row_blocks_put_the_longest_walks_first() -> None:
    """The grid's order: key count descending, ties in row order, so the last wave holds the shortest walks. The
    control: the same blocks in row order are not in that order (sample 0's walks grow with its rows)."""
    keys = _logical_keys((5, 3))
    rows = [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (-1, -1), (-1, -1), (1, 0), (1, 1), (1, 2), (-1, -1)]
    ctx, _ = _call(keys, rows, {})
    n_keys = _tables(ctx, len(rows), torch.device("cpu")).n_keys.tolist()
    blocks = row_blocks(ctx, len(rows), n_keys, 2)
    counts = [b[2] for b in blocks]
    assert counts == sorted(counts, reverse=True) and counts[0] == max(n_keys)
    ties = [b[0] for b in blocks if b[2] == 0]
    assert ties == sorted(ties)
    in_row_order = sorted(blocks)
    assert [b[2] for b in in_row_order] != sorted(counts, reverse=True)


def test_a_decode_call_gets_one_block_per_request_after_its_prefix() -> None:
    keys = _logical_keys((6, 4))
    rows = [(0, 5), (1, 3)]
    ctx, _ = _call(keys, rows, {0: 5, 1: 3})
    t = _tables(ctx, len(rows), torch.device("cpu"), 16)
    assert t.blocks.tolist() == [[0, 1, 6], [1, 1, 4]] and t.tokens == 16


def test_a_block_spanning_two_samples_is_caught() -> None:
    keys = _logical_keys((3, 2))
    rows = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    ctx, _ = _call(keys, rows, {})
    merged = [(0, 4, 3), (4, 1, 2)]  # sample 0's rows and sample 1's first row in one block
    assert any("spans samples" in f for f in _blocks_ok(ctx, len(rows), merged, 4))


def test_tiled_widths_are_the_kernels() -> None:
    assert tiled(32, 8, 128) and tiled(4, 1, 128)  # qwen3-8b and the tiny model
    assert not tiled(32, 8, 64) and not tiled(24, 8, 128)  # another head dim; a group of 3 does not divide 64


def test_a_new_request_beside_decoding_ones_sees_its_own_key() -> None:
    """A request at position 0 (no prefix) after one that decodes after its prefix: the call's keys are laid out
    per sample (prefix, then rows), so the new request's keys are not where its row sits in the call."""
    keys = _logical_keys((6, 1))
    rows = [(0, 5), (1, 0)]
    ctx, k = _call(keys, rows, {0: 5})
    assert all(_seen(ctx, k, rows))


def test_the_tiled_widths_are_read_off_the_kernel_source() -> None:
    """The candidate's choice (`tiled`) and its blocks of TILED_ROWS // group tokens must be what the kernel file
    builds, or the host would hand the kernel blocks its CTA cannot hold, or widths it was not built for. The
    control: a planted copy with another row count disagrees."""
    import re
    from pathlib import Path

    from ws1_kernels.cuda import attention as att

    src = (Path(__file__).resolve().parents[2] / "csrc" / "kernels" / "attention_tiled.cu").read_text()

    def widths(text: str) -> tuple[int, int]:
        rows = re.search(r"constexpr int kRows = (\d+);", text)
        dim = re.search(r"&& d == (\d+);", text)
        assert rows and dim, (
            "attention_tiled.cu no longer states its rows and head dim where this test reads them"
        )
        return int(rows.group(1)), int(dim.group(1))

    assert widths(src) == (att.TILED_ROWS, att.TILED_HEAD_DIM)
    assert widths(src.replace("kRows = 64;", "kRows = 32;")) != (att.TILED_ROWS, att.TILED_HEAD_DIM)
