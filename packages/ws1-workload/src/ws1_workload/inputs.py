"""Deterministic inputs keyed by logical identity.

Every value derives from `(case_id, tensor name, logical key)` alone: a SHA-256 of those three gives the seed
of a torch.Generator for that one row. So a case run alone sees the same bytes as in the full sweep, and a
row's data never depends on which other rows (samples, layouts, filters) exist. Values are standard normal
draws rounded to bf16 (exactly representable in bf16, hence in fp32), with exact zeros replaced.

Hard rows: a tensor may be asked to hold rows of the kinds in `HARD_ROW_KINDS` (the manifest names which
tensors hold which kinds). Row `(s, p)` is of kind K when `(s + p) % HARD_ROW_PERIOD == HARD_ROW_SLOT[K]`, so
every run of six consecutive positions holds one row of each kind its tensor asks for, whatever the batch.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from .errors import WorkloadError

#: Replacement for a draw that rounds to exactly zero (bf16-exact, small, positive).
ZERO_REPLACEMENT = 2.0**-8

#: The kinds of hard row a logical tensor can hold, and what each one is:
#: - `signed_zero_rows`: every element an exact zero, +0 at even and -0 at odd indices (a norm must rely on
#:   eps there, a pointwise op must keep each zero's sign);
#: - `tiny_norm_rows`: N(0, 1) scaled by 2^-10, a mean square near 1e-6, comparable to the models' RMSNorm eps;
#: - `large_logit_rows`: N(0, 1) scaled by 2^10 (up to about 2^14 after the logp adapter's scale of 4): exp
#:   overflows fp32 beyond 88, so a logsumexp that does not subtract the row maximum first turns to inf. Not
#:   nearer the bf16 range on purpose: above about 2^15, `lse = m + log(s)` in fp32 loses log(s) (ulp(m) > 1),
#:   and every logsumexp-based softmax backward (fp32 math included) counts a tied maximum twice; measured at
#:   2^118 on portable_cpu: relative gradient error 1.0 at tied maxima.
#: - `dot_order_rows`: exact zeros except three elements of the last axis (`order_probe_positions`): the
#:   survivor `ORDER_PROBE_TINY` first, then +1 and -1 in the last quarter. Against an operand whose three
#:   matching elements are equal (`ws1_harness.run.adapters` builds the weights so), a dot product over that axis
#:   is `tiny * c` when the +c and -c products cancel before the tiny one meets them, and exactly 0 when the
#:   tiny one is added to +c first: a change of summation order changes the bits (ws1_workload.order_probes).
#: - `lse_order_rows`: `ORDER_PROBE_LSE_PEAK` at index 0 and exact zeros elsewhere: each exp(0 - peak) is below
#:   half an ulp of the maximum's exp(0) = 1, so a walk that adds them to 1 one at a time loses every one, and
#:   a walk that sums some of them first keeps them: the fp32 logsumexp moves by several ulps.
HARD_ROW_KINDS: tuple[str, ...] = (
    "signed_zero_rows",
    "tiny_norm_rows",
    "large_logit_rows",
    "dot_order_rows",
    "lse_order_rows",
)
HARD_ROW_PERIOD = 6
HARD_ROW_SLOT: dict[str, int] = {
    "signed_zero_rows": 1,
    "large_logit_rows": 2,
    "tiny_norm_rows": 3,
    "dot_order_rows": 4,
    "lse_order_rows": 4,
}
TINY_ROW_SCALE = 2.0**-10
LARGE_ROW_SCALE = 2.0**10
#: The survivor of a dot-order probe: 2^-30 is lost against 1 in fp32 (half an ulp of 1 is 2^-24) with room
#: for the few extra bits a tensor-core accumulator may keep, and its products stay normal fp32 and bf16
#: numbers, far below every contract atol (so the accuracy judgment is unchanged on these rows).
ORDER_PROBE_TINY = 2.0**-30
#: Peak of an lse-order probe row before the logp adapter's scale of 4: logits 20 and 0, exp(-20) = 2.1e-9.
ORDER_PROBE_LSE_PEAK = 5.0
#: The shortest axis a dot-order probe fits (an aligned block of 32 inside its last quarter).
ORDER_PROBE_MIN_WIDTH = 256
_EXACT_DTYPES = (torch.bfloat16, torch.float32, torch.float64)


def canonical_key(key: Any) -> str:
    """Stable text of a logical key: ints, strings and (nested) tuples/lists of them, as compact JSON."""

    def norm(k: Any) -> Any:
        if isinstance(k, bool):
            raise WorkloadError(f"logical key {key!r}: booleans are not keys")
        if isinstance(k, (tuple, list)):
            return [norm(x) for x in k]
        if isinstance(k, str):
            return k
        if isinstance(k, torch.Tensor) and k.numel() == 1 and not k.is_floating_point():
            return int(k.item())
        try:
            return int(k.__index__())
        except (AttributeError, TypeError):
            raise WorkloadError(f"logical key {key!r}: only ints, strings and tuples are keys") from None

    return json.dumps(norm(key), separators=(",", ":"), ensure_ascii=False)


def derive_seed(*parts: str) -> int:
    """63-bit seed from the SHA-256 of the NUL-joined parts (domain-separated, order-sensitive)."""
    digest = hashlib.sha256("\x00".join(("ws1", *parts)).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def derive_int(modulus: int, *parts: str) -> int:
    """Deterministic integer in [0, modulus) from the parts (used for token ids)."""
    digest = hashlib.sha256("\x00".join(("ws1", *parts)).encode("utf-8")).digest()
    return int.from_bytes(digest[:16], "little") % modulus


def round_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 to nearest-even bf16 and replace exact zeros: the result is bf16, never zero."""
    y = x.to(torch.bfloat16)
    zero = y == 0
    if bool(zero.any()):
        y.masked_fill_(zero, ZERO_REPLACEMENT)  # in place: no second full-size tensor (y is a fresh copy)
    return y


def hard_row_kind(key: Any, kinds: Sequence[str]) -> str | None:
    """The kind of hard row at logical key `(sample_id, position)` among `kinds`, or None for an ordinary row.

    A pure function of the key: `(s + p) % HARD_ROW_PERIOD` picks the slot. Keys that are not a
    (sample, position) pair never hold hard rows.
    """
    if not kinds or not isinstance(key, (tuple, list)) or len(key) != 2:
        return None
    slot = (int(key[0]) + int(key[1])) % HARD_ROW_PERIOD
    for kind in kinds:
        if HARD_ROW_SLOT[kind] == slot:
            return kind
    return None


def order_probe_positions(width: int) -> tuple[int, int, int]:
    """Indices `(tiny, plus, minus)` of a dot-order probe along an axis of `width` elements.

    The pair must meet each other before either meets the survivor in every order a kernel uses:
    - the survivor sits at index 1, the pair in the last quarter: a split into 2, 3 or 4 equal parts keeps the
      pair in the last part and the survivor in the first, and a walk of the blocks backwards meets the pair
      first;
    - the pair fills one aligned block of `2d` elements (`plus` at its start, `minus = plus + d`, `d` a power of
      two, at most 64): a tree over adjacent elements joins them inside that block, a tree that adds the upper
      half onto the lower half (`tree_sum`, a butterfly) joins them when the stride is `d`, and the odd survivor
      only at stride 1, last;
    - `d >= 16`: no 16-wide MMA instruction holds both (at the full widths `d = 64`: no 64-wide K tile does).
    """
    if width < ORDER_PROBE_MIN_WIDTH:
        raise WorkloadError(f"an order probe needs an axis of at least {ORDER_PROBE_MIN_WIDTH}, got {width}")
    start = width - width // 4
    block = 128
    while block > 32:
        plus = -(-start // block) * block  # first aligned block inside the last quarter
        if plus + block <= width:
            break
        block //= 2
    plus = -(-start // block) * block
    return 1, plus, plus + block // 2


def _dot_order_row(shape: tuple[int, ...]) -> torch.Tensor:
    row = torch.zeros(shape, dtype=torch.float32)
    tiny, plus, minus = order_probe_positions(shape[-1])
    row[..., tiny] = ORDER_PROBE_TINY
    row[..., plus] = 1.0
    row[..., minus] = -1.0
    return row


def _lse_order_row(shape: tuple[int, ...]) -> torch.Tensor:
    row = torch.zeros(shape, dtype=torch.float32)
    row[..., 0] = ORDER_PROBE_LSE_PEAK
    return row


def _signed_zeros(shape: tuple[int, ...]) -> torch.Tensor:
    flat = torch.zeros(math.prod(shape), dtype=torch.float32)
    flat[1::2] = -0.0
    return flat.reshape(shape)


#: rows x row size under which `draw_rows` draws on the calling thread alone (a pool costs more than it saves)
PARALLEL_DRAW_MIN = 1 << 22
#: `draw_rows`'s threads when the caller names none: one. On a 16-core GPU host, a pool of torch's intra-op count of
#: threads, each calling `normal_` (itself parallel inside torch), drew `logp`'s long-tier logits in 13.1 s, against
#: 2.3 s row by row on one thread (hopper-h100-3e8dae1, in git history); on 2 cores the pool had won (3.8 s against
#: 7.0). Nested parallelism that oversubscribes the cores loses where the cores are many, so the pool is opt-in
DRAW_THREADS = 1


def run_in_threads(calls: Sequence[Callable[[], None]], workers: int) -> None:
    """Run every call, on this thread when `workers` is 1, else on a pool of that many threads; the first failure
    is raised here. Shared by the draws whose pieces have seeds of their own (`draw_rows`, the harness's
    `make_param`), so their bits do not depend on the thread count."""
    if workers <= 1:
        for call in calls:
            call()
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for done in [pool.submit(call) for call in calls]:
            done.result()  # a failed draw raises here


def draw_rows(
    seeds: Sequence[int],
    shape: tuple[int, ...],
    scales: dict[int, float] | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """fp32 ``[len(seeds), *shape]``: row r is N(0, 1) from a CPU generator seeded with ``seeds[r]``, times
    ``scales[r]`` where given.

    Why in place: a full-vocabulary tensor of the long tier ([1896, 151936], 1.2 GB in fp32) took a matrix unit
    most of its time when its rows were drawn one by one into tensors of their own and stacked, and on a GPU
    machine those seconds hold a GPU slot. Each row has its own seed, so rows are drawn into one preallocated
    tensor, by up to ``threads`` threads (default `DRAW_THREADS`), each with its own generator over a contiguous
    range of rows: a row's values depend on its seed alone (``normal_`` on a contiguous row of the same shape),
    so the bits are those of one thread (tests/ws1_workload/test_draw_rows.py)."""
    n = len(seeds)
    data = torch.empty((n, *shape), dtype=torch.float32)
    scales = scales or {}

    def draw(lo: int, hi: int) -> None:
        gen = torch.Generator(device="cpu")
        for i in range(lo, hi):
            gen.manual_seed(seeds[i])
            row = data[i].normal_(generator=gen)
            if i in scales:
                row.mul_(scales[i])

    width = max(1, math.prod(shape))
    workers = max(1, min(threads or DRAW_THREADS, n))
    if workers == 1 or n * width < PARALLEL_DRAW_MIN:
        draw(0, n)
        return data
    bounds = [n * w // workers for w in range(workers + 1)]
    run_in_threads([functools.partial(draw, bounds[w], bounds[w + 1]) for w in range(workers)], workers)
    return data


def logical_tensor(
    case_id: str,
    name: str,
    logical_keys: Sequence[Any],
    row_shape: Sequence[int] | int,
    dtype: torch.dtype = torch.bfloat16,
    hard_rows: Sequence[str] = (),
) -> torch.Tensor:
    """Tensor [len(logical_keys), *row_shape]; row r depends only on (case_id, name, logical_keys[r]).

    Values are N(0, 1) draws rounded to bf16, never zero, returned in `dtype` (bf16, fp32 or fp64 exactly;
    any other dtype must hold every value exactly or WorkloadError is raised). `hard_rows` names the kinds of
    hard row (`HARD_ROW_KINDS`) this tensor holds; their rows follow `hard_row_kind` instead (zero rows and
    order probes are the only places a zero appears).
    """
    shape = (row_shape,) if isinstance(row_shape, int) else tuple(int(d) for d in row_shape)
    if any(d < 0 for d in shape):
        raise WorkloadError(f"logical_tensor {name!r}: negative row shape {shape}")
    unknown = sorted(set(hard_rows) - set(HARD_ROW_KINDS))
    if unknown:
        raise WorkloadError(f"logical_tensor {name!r}: unknown hard row kinds {unknown}")
    seeds = [derive_seed("logical", case_id, name, canonical_key(key)) for key in logical_keys]
    scales: dict[int, float] = {}
    zero_rows = []
    # rows whose zeros are meant: set after the zero replacement
    exact_rows: list[tuple[int, torch.Tensor]] = []
    for i, key in enumerate(logical_keys):
        kind = hard_row_kind(key, hard_rows)
        if kind == "tiny_norm_rows":
            scales[i] = TINY_ROW_SCALE
        elif kind == "large_logit_rows":
            scales[i] = LARGE_ROW_SCALE
        elif kind == "signed_zero_rows":
            zero_rows.append(i)
        elif kind == "dot_order_rows":
            exact_rows.append((i, _dot_order_row(shape)))
        elif kind == "lse_order_rows":
            exact_rows.append((i, _lse_order_row(shape)))
    data = draw_rows(seeds, shape, scales)
    out = round_to_bf16(data)
    for i in zero_rows:
        out[i] = _signed_zeros(shape).to(torch.bfloat16)
    for i, exact in exact_rows:
        out[i] = exact.to(torch.bfloat16)
    if dtype in _EXACT_DTYPES:
        return out.to(dtype)
    cast = out.to(dtype)
    if not torch.equal(cast.to(torch.bfloat16), out) or bool(((cast == 0) != (out == 0)).any()):
        raise WorkloadError(f"logical_tensor {name!r}: dtype {dtype} cannot hold the bf16 values exactly")
    return cast
