"""Test support for the kernel tests: operator cases, the layouts of a small logical batch, and a runner that
executes one candidate call by call and restores outputs and gradients to logical order.

Nothing here is a second table or a second layout map. The op classes come from the manifest's operator table,
the parameter operators from the registry (itself checked against the manifest), tolerances from the contract;
layouts are the workload's (`build_layout` over a fixture of the test's lengths, the manifest's layout specs by
name), physical rows map to logical ones through the workload's `call_rows`, and physical inputs are gathered
with the harness's `gather_rows`. What stays here is what the kernel tests need and the matrix does not: cases
at chosen scales, a `chunked_<n>` of any chunk size, and `rows_alone` (every row its own call). Inputs are a pure
function of (seed, name, logical row); pads carry garbage values so a pad that leaks into a real row shows up.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from functools import cached_property

import torch

from ws1_harness.run.layouts_exec import PARAM_RULE_MAIN_GRAD, gather_rows
from ws1_kernels import LayoutContext, registry
from ws1_workload import Fixture, LayoutSpec, build_layout, call_rows, load_manifest, make_fixture

BF = torch.bfloat16
_MANIFEST = load_manifest(None)
# operator -> op class, from the manifest's one operator table (layout-only operators have no class)
OP_CLASS: dict[str, str] = {
    name: spec.op_class for name, spec in _MANIFEST.operators.items() if spec.op_class is not None
}
PARAM_OPS: frozenset[str] = registry.PARAM_OPERATORS


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
# logical batch and layouts (the workload's)


@dataclass(frozen=True)
class Batch:
    """A logical batch by its sample lengths and prompt lengths; the workload fixture of those lengths."""

    lengths: tuple[int, ...]
    prompt_lens: tuple[int, ...]

    @cached_property
    def fixture(self) -> Fixture:
        # token ids are never read (cases draw their own); the fixture carries the lengths the layouts need
        return make_fixture("kernels", self.lengths, self.prompt_lens, pad_id=0, token_id_limit=2)

    @property
    def offsets(self) -> tuple[int, ...]:
        return self.fixture.offsets

    @property
    def total(self) -> int:
        return self.fixture.total_tokens


@dataclass(frozen=True)
class Call:
    """One physical call by its rows' keys: (sample, position) per row, (-1, -1) for pads."""

    keys: tuple[tuple[int, int], ...]

    @property
    def sample_ids(self) -> torch.Tensor:
        return torch.tensor([s for s, _ in self.keys], dtype=torch.int64)

    @property
    def positions(self) -> torch.Tensor:
        return torch.tensor([p for _, p in self.keys], dtype=torch.int64)


def layout_spec(name: str) -> LayoutSpec:
    """The manifest's layout of that name; ``chunked_<n>`` is its chunked layout with chunk size n."""
    if name.startswith("chunked_"):
        base = _MANIFEST.layout("chunked")
        return LayoutSpec(name, base.kind, base.type, {**base.params, "chunk_size": int(name.split("_")[1])})
    return _MANIFEST.layout(name)


def layout(b: Batch, name: str) -> list[Call]:
    """The calls of layout ``name`` over ``b``, built by the workload; ``rows_alone``: every row its own call."""
    if name == "rows_alone":
        return [Call(((s, p),)) for s in range(len(b.lengths)) for p in range(b.lengths[s])]
    calls = build_layout(b.fixture, layout_spec(name)).calls
    return [Call(tuple(zip(c.sample_ids.tolist(), c.positions.tolist(), strict=True))) for c in calls]


TRAINING = tuple(spec.name for spec in _MANIFEST.layouts if spec.kind == "training")
INFERENCE = tuple(spec.name for spec in _MANIFEST.layouts if spec.kind == "inference")


def logical_index(b: Batch, call: Call) -> torch.Tensor:
    """The logical row of every physical row of ``call`` (-1 on pads): the workload's map."""
    return call_rows(call, b.offsets)  # type: ignore[arg-type]  # reads sample_ids and positions only


def context(call: Call, prefix: dict | None = None) -> LayoutContext:
    return LayoutContext(call.sample_ids, call.positions, prefix or {})


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
    return spec_case(op, b, dims, seed)


#: the test dims' names for the operator spec's symbols
_SPEC_DIMS = {"H": "hidden", "V": "vocab", "F": "inter", "Hq": "heads", "Hkv": "kv_heads", "D": "head_dim"}


def spec_case(op: str, b: Batch, dims: dict, seed: int = 0) -> Case:
    """The case of an operator with no branch above, read off the operator spec: its inputs by role and shape,
    its scalars, its call order. A new operator needs no edit here; the branches above keep the scales the
    existing kernels were tuned and tested at."""
    from types import SimpleNamespace

    from ws1_contract import operators as spec

    entry = spec.operators().get(op)
    if entry is None or entry.layout_only:
        raise ValueError(op)
    widths = {sym: int(dims[name]) for sym, name in _SPEC_DIMS.items()}
    model = SimpleNamespace(head_dim=widths["D"], rms_eps=1e-6, rope_theta=1e6)
    n = b.total
    rows: dict[str, torch.Tensor] = {}
    ints: dict[str, torch.Tensor] = {}
    params: dict[str, torch.Tensor] = {}
    kinds: dict[str, str] = {}
    for i, inp in enumerate(entry.inputs):
        shape = tuple(spec.evaluate(d, widths) for d in inp.shape)
        if inp.role == "param":
            scale = inp.scale * (widths[inp.fan_in] ** -0.5 if inp.fan_in else 1.0)
            params[inp.name] = (inp.offset + rand(seed + i, shape, scale, torch.float32)).to(BF)
            kinds[inp.name] = "param"
        elif inp.role == "float":
            rows[inp.name] = rand(seed + i, (n, *shape), inp.scale)
            kinds[inp.name] = "row"
        else:
            ints[inp.name] = torch.randint(
                0, widths["V"], (n,), generator=torch.Generator().manual_seed(seed + i)
            )
            kinds[inp.name] = "int"
    args = tuple((kinds[a], a) if a in kinds else ("scalar", spec.scalar(a, model)) for a in entry.call)
    return Case(op, rows, ints, params, args)


@dataclass
class Result:
    out: torch.Tensor  # logical, restored
    grads: dict[str, torch.Tensor]  # token gradients, logical
    pgrads: dict[str, torch.Tensor]  # parameter gradients where the rule puts them


def _physical(t: torch.Tensor, idx: torch.Tensor, pad_seed: int) -> torch.Tensor:
    """Rows of logical ``t`` in physical order (the harness's gather); float pads get garbage (a function of the
    pad slot), integer pads id 0."""
    n_pads = int((idx < 0).sum())
    pads = rand(pad_seed, (n_pads, *t.shape[1:]), 1.0, t.dtype) if n_pads and t.is_floating_point() else None
    return gather_rows(t, idx, pads)


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
    if backward and rule == PARAM_RULE_MAIN_GRAD:
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
            pgrads[k] = p.main_grad if rule == PARAM_RULE_MAIN_GRAD else p.grad
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


def sequential_dot(self, a, b, d, input_precision, max_num_imprecise_acc):  # noqa: ARG001
    """The interpreter's ``tl.dot`` as one accumulator: each k's products added in ascending k.

    numpy's matmul (what the interpreter calls) may give a row other bits depending on its slot in the tile; the
    GPU's MMA chain does not. The bitwise interpreter tests model the GPU's order with this dot.
    """
    from triton.runtime import interpreter as interp

    acc = d.data.copy()
    ad, bd = a.data.astype(acc.dtype), b.data.astype(acc.dtype)
    for k in range(ad.shape[-1]):
        acc = acc + ad[..., :, k : k + 1] * bd[..., k : k + 1, :]
    return interp.TensorHandle(acc, d.dtype.scalar)


# ---------------------------------------------------------------------------------------- attention on the device


def packed_attention_rows(
    lengths: tuple[int, ...], seed: int, heads: dict[str, int], d: int, device: str, q_scale: float = 2.0
) -> tuple[LayoutContext, dict[str, torch.Tensor]]:
    """A packed call of samples of ``lengths`` and its bf16 tensors ``name -> [T, heads[name], d]`` on ``device``
    (seeded normal values, ``q`` scaled by ``q_scale`` so that the softmax is not flat): the GPU attention tests'
    one fixture, so each compares its kernels on the same kind of call."""
    ids = torch.cat([torch.full((n,), s, dtype=torch.int64) for s, n in enumerate(lengths)])
    pos = torch.cat([torch.arange(n, dtype=torch.int64) for n in lengths])
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, h in heads.items():
        x = torch.randn((len(ids), h, d), generator=g)
        out[name] = (x * q_scale if name == "q" else x).to(BF).to(device)
    return LayoutContext(ids, pos), out


def assert_decode_after_prefix(
    attention, rows: dict[str, torch.Tensor], lengths: tuple[int, ...], scale: float
):  # type: ignore[no-untyped-def]
    """Each sample's last token decoded alone through ``attention(q, k, v, scale, ctx)``, its earlier keys as the
    kv prefix, must give the bits of the same token in the packed call."""
    ids = torch.cat([torch.full((n,), s, dtype=torch.int64) for s, n in enumerate(lengths)])
    pos = torch.cat([torch.arange(n, dtype=torch.int64) for n in lengths])
    packed = attention(rows["q"], rows["k"], rows["v"], scale, LayoutContext(ids, pos))
    ends = torch.tensor(lengths).cumsum(0) - 1
    prefix = {
        s: (rows["k"][e - n + 1 : e], rows["v"][e - n + 1 : e])
        for s, (e, n) in enumerate(zip(ends.tolist(), lengths, strict=True))
    }
    dctx = LayoutContext(torch.arange(len(lengths)), torch.tensor(lengths) - 1, prefix)
    dec = attention(rows["q"][ends], rows["k"][ends], rows["v"][ends], scale, dctx)
    assert_bitwise("decode", dec, packed[ends])


def interp_only() -> list:
    """The marks of a test module whose Triton kernels run on the CPU interpreter: the ``interp`` marker, and a skip
    unless ``TRITON_INTERPRET=1`` (the CPU nox session sets it). Call it after ``pytest.importorskip("triton")``."""
    import pytest

    from ws1_kernels.triton_ops import _launch

    return [
        pytest.mark.interp,
        pytest.mark.skipif(
            not _launch.interpreting(),
            reason="Triton kernels run on the CPU only under TRITON_INTERPRET=1 (the CPU nox session sets it)",
        ),
    ]


def sm90_attn_fwd(
    rows: dict[str, torch.Tensor],
    ctx: LayoutContext,
    block_rows: int | None,
    schedule: int,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of the Hopper attention forward (`torch.ops.ws1_sm90.attn_fwd`) over a packed call of
    `packed_attention_rows`: row blocks of ``block_rows`` query rows, or None for one token a CTA (the step path's
    shape), on ``schedule``; ``k`` and ``v`` replace the call's (a NaN tail past the keys). The Hopper attention
    tests' one way in, so each compares the kernel on the same kind of call."""
    from ws1_kernels.cuda import attention as generic
    from ws1_kernels.cuda_sm90 import attention as att

    q = rows["q"]
    group = q.shape[1] // rows["k"].shape[1]
    t = generic._tables(ctx, q.shape[0], q.device, (block_rows or 64) // group)
    return torch.ops.ws1_sm90.attn_fwd(
        q,
        rows["k"] if k is None else k,
        rows["v"] if v is None else v,
        t.key_base,
        t.n_keys,
        None if block_rows is None else t.blocks,
        block_rows or att.STEP_BLOCK_ROWS,
        q.shape[2] ** -0.5,
        schedule,
    )
