"""Test support: logical batches, physical layouts (packed, split, padded, permuted, chunked, decode, rows
alone) and a runner that executes one candidate on a layout and restores outputs and gradients.

The layouts mirror the manifest's layout types but are built here from plain lists so the kernel tests need no
ws1_workload.  Inputs are a pure function of (seed, name, logical row); pads carry garbage values so a pad that
leaks into a real row shows up.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from ws1_kernels import LayoutContext

BF = torch.bfloat16
OP_CLASS = {
    "embedding": "elementwise",
    "rope": "elementwise",
    "silu": "elementwise",
    "swiglu": "elementwise",
    "rms_norm": "reduction",
    "qk_norm": "reduction",
    "det_gemm": "gemm",
    "lm_head": "gemm",
    "attention": "attention",
    "logp": "logprob",
    "linear_logp": "logprob",
}
PARAM_OPS = {"embedding", "rms_norm", "qk_norm", "det_gemm", "lm_head", "linear_logp"}


def tolerance(judgment: str, op: str):
    """(atol, rtol) from the contract: no private tolerances."""
    from ws1_contract import load_contract

    spec = load_contract().resolve(judgment, OP_CLASS[op], "bf16")
    return spec.atol, spec.rtol


def assert_close(name: str, cand: torch.Tensor, ref: torch.Tensor, judgment: str, op: str) -> None:
    atol, rtol = tolerance(judgment, op)
    c, r = cand.double(), ref.double()
    assert c.shape == r.shape, f"{name}: shape {tuple(c.shape)} vs {tuple(r.shape)}"
    assert torch.isfinite(c).all(), f"{name}: non-finite candidate values"
    bad = (c - r).abs() > atol + rtol * r.abs()
    assert not bad.any(), (
        f"{name}: {int(bad.sum())} elements out of tolerance, max abs {float((c - r).abs().max())}"
    )


def bits(t: torch.Tensor) -> torch.Tensor:
    """Integer view for bitwise comparison."""
    return t.contiguous().view({torch.bfloat16: torch.int16, torch.float32: torch.int32}[t.dtype])


def assert_bitwise(name: str, a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, (
        f"{name}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    )
    diff = (bits(a) != bits(b)).reshape(a.shape[0], -1).any(-1) if a.dim() else bits(a) != bits(b)
    assert not diff.any(), f"{name}: rows {diff.nonzero().flatten().tolist()[:8]} differ in bits"


# ---------------------------------------------------------------------------------------------------------
# logical batch and layouts


@dataclass(frozen=True)
class Batch:
    lengths: tuple[int, ...]
    prompt_lens: tuple[int, ...]

    @property
    def offsets(self) -> list[int]:
        out, acc = [], 0
        for n in self.lengths:
            out.append(acc)
            acc += n
        return out

    @property
    def total(self) -> int:
        return sum(self.lengths)


@dataclass(frozen=True)
class Call:
    keys: tuple[tuple[int, int], ...]  # (sample, position) per row, (-1, -1) for pads


def _rows(b: Batch, s: int, lo: int = 0, hi: int | None = None) -> list[tuple[int, int]]:
    return [(s, p) for p in range(lo, b.lengths[s] if hi is None else min(hi, b.lengths[s]))]


def layout(b: Batch, name: str) -> list[Call]:
    n = len(b.lengths)
    ids = list(range(n))
    if name == "packed":
        return [Call(tuple(k for s in ids for k in _rows(b, s)))]
    if name == "split_1":
        return [Call(tuple(_rows(b, s))) for s in ids]
    if name == "split_half":
        h = n // 2
        return [Call(tuple(k for s in part for k in _rows(b, s))) for part in (ids[:h], ids[h:])]
    if name == "permuted":
        perm = ids[1::2] + ids[0::2]
        return [Call(tuple(k for s in perm for k in _rows(b, s)))]
    if name in ("padded_right", "padded_left"):
        width = -(-max(b.lengths) // 8) * 8
        keys = []
        for s in ids:
            pads = [(-1, -1)] * (width - b.lengths[s])
            keys += _rows(b, s) + pads if name == "padded_right" else pads + _rows(b, s)
        return [Call(tuple(keys))]
    if name.startswith("chunked"):
        cs = int(name.split("_")[1]) if "_" in name else 5
        return [
            Call(tuple(k for s in ids for k in _rows(b, s, c * cs, (c + 1) * cs)))
            for c in range(-(-max(b.lengths) // cs))
        ]
    if name == "decode":
        calls = [Call(tuple(k for s in ids for k in _rows(b, s, 0, b.prompt_lens[s])))]
        for p in range(min(b.prompt_lens), max(b.lengths)):
            keys = tuple((s, p) for s in ids if b.prompt_lens[s] <= p < b.lengths[s])
            if keys:
                calls.append(Call(keys))
        return calls
    if name == "rows_alone":
        return [Call(((s, p),)) for s in ids for p in range(b.lengths[s])]
    raise ValueError(name)


TRAINING = ("packed", "split_1", "split_half", "permuted", "padded_right", "padded_left")
INFERENCE = ("chunked_5", "decode")


def logical_index(b: Batch, call: Call) -> torch.Tensor:
    off = b.offsets
    return torch.tensor([off[s] + p if s >= 0 else -1 for s, p in call.keys], dtype=torch.int64)


def context(call: Call, prefix: dict | None = None) -> LayoutContext:
    sid = torch.tensor([s for s, _ in call.keys], dtype=torch.int64)
    pos = torch.tensor([p for _, p in call.keys], dtype=torch.int64)
    return LayoutContext(sid, pos, prefix or {})


# ---------------------------------------------------------------------------------------------------------
# operator cases


def rand(seed: int, shape, scale: float = 1.0, dtype=BF) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


@dataclass
class Case:
    """One operator's inputs: token-row tensors, integer rows, parameters and the argument order."""

    op: str
    rows: dict[str, torch.Tensor]  # logical [N, ...] bf16, differentiable
    ints: dict[str, torch.Tensor]  # logical [N] int64
    params: dict[str, torch.Tensor]  # bf16 parameters
    args: tuple  # ("row", name) | ("int", name) | ("param", name) | ("scalar", value)
    out_scale: float = 1.0
    pad_int: int = 0
    extra: dict = field(default_factory=dict)


def make_case(op: str, b: Batch, dims: dict, seed: int = 0) -> Case:
    n, h, v_, f = b.total, dims["hidden"], dims["vocab"], dims["inter"]
    hq, hkv, d = dims["heads"], dims["kv_heads"], dims["head_dim"]
    ids = torch.randint(0, v_, (n,), generator=torch.Generator().manual_seed(seed + 7))
    if op == "embedding":
        return Case(
            op, {}, {"ids": ids}, {"weight": rand(seed, (v_, h))}, (("int", "ids"), ("param", "weight"))
        )
    if op == "rms_norm":
        w = (1.0 + rand(seed + 1, (h,), 0.1, torch.float32)).to(BF)
        return Case(
            op,
            {"x": rand(seed, (n, h))},
            {},
            {"weight": w},
            (("row", "x"), ("param", "weight"), ("scalar", 1e-6)),
        )
    if op == "qk_norm":
        w = (1.0 + rand(seed + 1, (d,), 0.1, torch.float32)).to(BF)
        return Case(
            op,
            {"x": rand(seed, (n, hq, d))},
            {},
            {"weight": w},
            (("row", "x"), ("param", "weight"), ("scalar", 1e-6)),
        )
    if op in ("det_gemm", "lm_head"):
        nout = v_ if op == "lm_head" else dims.get("out", h)
        w = rand(seed + 1, (nout, h), h**-0.5)
        return Case(op, {"x": rand(seed, (n, h))}, {}, {"weight": w}, (("row", "x"), ("param", "weight")))
    if op == "rope":
        return Case(op, {"x": rand(seed, (n, hq, d))}, {}, {}, (("row", "x"), ("scalar", 1e6)))
    if op == "attention":
        rows = {
            "q": rand(seed, (n, hq, d)),
            "k": rand(seed + 1, (n, hkv, d)),
            "v": rand(seed + 2, (n, hkv, d)),
        }
        return Case(op, rows, {}, {}, (("row", "q"), ("row", "k"), ("row", "v"), ("scalar", d**-0.5)))
    if op == "silu":
        return Case(op, {"x": rand(seed, (n, f), 2.0)}, {}, {}, (("row", "x"),))
    if op == "swiglu":
        return Case(
            op,
            {"gate": rand(seed, (n, f), 2.0), "up": rand(seed + 1, (n, f))},
            {},
            {},
            (("row", "gate"), ("row", "up")),
        )
    if op == "logp":
        return Case(
            op, {"logits": rand(seed, (n, v_), 3.0)}, {"t": ids}, {}, (("row", "logits"), ("int", "t"))
        )
    if op == "linear_logp":
        w = rand(seed + 1, (v_, h), 2 * h**-0.5)
        return Case(
            op,
            {"x": rand(seed, (n, h))},
            {"t": ids},
            {"weight": w},
            (("row", "x"), ("param", "weight"), ("int", "t")),
        )
    raise ValueError(op)


@dataclass
class Result:
    out: torch.Tensor  # logical, restored
    grads: dict[str, torch.Tensor]  # token gradients, logical
    pgrads: dict[str, torch.Tensor]  # parameter gradients where the rule puts them


def _physical(t: torch.Tensor, idx: torch.Tensor, pad_seed: int) -> torch.Tensor:
    """Rows of logical ``t`` in physical order; pads get garbage (a function of the pad slot)."""
    out = t[idx.clamp(min=0)].clone()
    pads = idx < 0
    if pads.any():
        if t.dtype == torch.int64:
            out[pads] = 0
        else:
            out[pads] = rand(pad_seed, (int(pads.sum()), *t.shape[1:]), 1.0, t.dtype)
    return out


def upstream(case: Case, b: Batch, out_shape, dtype, seed: int = 99) -> torch.Tensor:
    """Logical upstream gradient: a pure function of the logical row."""
    return rand(seed, (b.total, *out_shape[1:]), 1.0, dtype)


def run(
    fn, case: Case, b: Batch, calls: list[Call], *, rule: str | None, backward: bool = True, around=None
) -> Result:
    """Run ``fn`` once per physical call; restore outputs and gradients to logical order.

    ``around``: a context-manager factory entered around each candidate call and each backward (used to watch
    the dispatched aten ops of the candidate alone).
    """
    around = around or contextlib.nullcontext
    params = {k: p.detach().clone().requires_grad_(backward) for k, p in case.params.items()}
    if backward and rule == "sample_blocks_main_grad":
        for p in params.values():
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32)
    out_l: torch.Tensor | None = None
    grads = {k: torch.zeros_like(t) for k, t in case.rows.items()}
    gout_l = None
    for ci, call in enumerate(calls):
        idx = logical_index(b, call)
        phys = {k: _physical(t, idx, 1000 + ci).requires_grad_(backward) for k, t in case.rows.items()}
        ints = {k: _physical(t, idx, 0) for k, t in case.ints.items()}
        prefix, seen = {}, set()
        if case.op == "attention":
            for s, p in call.keys:
                if s >= 0 and s not in seen:
                    seen.add(s)
                    if p > 0:
                        o = b.offsets[s]
                        prefix[s] = (case.rows["k"][o : o + p], case.rows["v"][o : o + p])
        ctx = context(call, prefix)
        args = []
        for kind, val in case.args:
            args.append(
                {"row": phys, "int": ints, "param": params}.get(kind, {}).get(val, val)
                if kind != "scalar"
                else val
            )
        with around():
            out = fn(*args, ctx)
        if out_l is None:
            out_l = torch.zeros((b.total, *out.shape[1:]), dtype=out.dtype)
            gout_l = upstream(case, b, out.shape, out.dtype)
        real = idx >= 0
        out_l[idx[real]] = out.detach()[real]
        if backward:
            g = torch.zeros_like(out)
            g[real] = gout_l[idx[real]]
            with around():
                out.backward(g)
            for k, t in phys.items():
                grads[k][idx[real]] = t.grad[real]
    pgrads = {}
    for k, p in params.items():
        if backward:
            pgrads[k] = p.main_grad if rule == "sample_blocks_main_grad" else p.grad
    return Result(out_l, grads if backward else {}, pgrads)


def run_reference(ref_fn, case: Case, b: Batch, gout: torch.Tensor) -> Result:
    """fp32 reference on the packed layout, fp32 leaves, the same upstream gradient."""
    call = layout(b, "packed")[0]
    rows = {k: t.detach().float().requires_grad_(True) for k, t in case.rows.items()}
    params = {k: t.detach().float().requires_grad_(True) for k, t in case.params.items()}
    args = [
        val if kind == "scalar" else {"row": rows, "int": case.ints, "param": params}[kind][val]
        for kind, val in case.args
    ]
    out = ref_fn(*args, context(call))
    assert out.dtype == torch.float32
    out.backward(gout.float())
    return Result(out.detach(), {k: t.grad for k, t in rows.items()}, {k: t.grad for k, t in params.items()})
