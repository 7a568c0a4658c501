"""Why the Hopper attention backward (csrc/sm90/attention_bwd_sm90.cu) computes as it does, shown on the CPU: a
float64 model of its rounding points on the GPU tests' own fixture (test_cuda_sm90_attention_bwd_gpu.py), judged
by the contract's gradient tolerance against the fp32 reference.

The kernel takes delta = sum_j p dP from its own p and dP, and feeds the gradient GEMMs p and dS as bf16 hi + lo.
The usual flash backward takes delta = rowsum(dO . O) from the forward's bf16 O (whose P V used bf16 P) and bf16
p and dS. The model shows the first within tolerance with a wide margin, and each of the usual choices past it (the
controls). The margins (worst error over tolerance below 0.5, above 1.2) keep the verdict off the host's BLAS. The
GPU tests judge the kernel itself on the same data.
"""

from __future__ import annotations

import torch
from kernels_support import packed_attention_rows, tolerance

from ws1_harness.run.adapters import build_adapters
from ws1_harness.run.tasks import UnitTask
from ws1_harness.run.unit import logical_inputs
from ws1_kernels import LayoutContext, reference
from ws1_workload import build_fixture, load_manifest

HQ, HKV, D = 32, 8, 128
SCALE = D**-0.5
LENGTHS = (1, 15, 16, 17, 63, 64, 65, 200)  # the GPU backward tests' call, seed 0


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).double()


def _model_worst(
    t: dict[str, torch.Tensor], lengths: tuple[int, ...], delta_from_output: bool, bf16_operands: bool
) -> dict[str, float]:
    """The worst |model - reference| / (atol + rtol |reference|) of dq, dk and dv on the packed call of samples of
    ``lengths`` (each its own keys from position 0; ``t``: bf16 q, k, v [T, heads, D] and dout); above 1 misses."""
    ids = torch.cat([torch.full((n,), s, dtype=torch.int64) for s, n in enumerate(lengths)])
    pos = torch.cat([torch.arange(n, dtype=torch.int64) for n in lengths])
    ctx = LayoutContext(ids, pos)
    q, k, v, do = (t[n].double() for n in ("q", "k", "v", "dout"))
    hq, hkv = q.shape[1], k.shape[1]
    ref = [x.float().requires_grad_(True) for x in (q, k, v)]
    with reference.fp32_math():
        reference.attention(*ref, SCALE, ctx).backward(do.float())
    grads = [torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)]
    start = 0
    for n in lengths:
        rows = slice(start, start + n)
        start += n
        visible = torch.ones(n, n, dtype=torch.bool).tril()
        for h in range(hq):
            g = h // (hq // hkv)
            qh, kh, vh, doh = q[rows, h], k[rows, g], v[rows, g], do[rows, h]
            s = (qh @ kh.T * SCALE).masked_fill(~visible, float("-inf"))
            m = s.max(1, keepdim=True).values
            e = torch.exp(s - m)
            lse = m + torch.log(e.sum(1, keepdim=True))
            p = torch.exp(s - lse)
            dp = doh @ vh.T
            if delta_from_output:  # the forward's O: bf16 P in P V, the output rounded to bf16
                o = _bf16(_bf16(e) @ vh / e.sum(1, keepdim=True))
                delta = (doh * o).sum(1, keepdim=True)
            else:
                delta = (p * dp).sum(1, keepdim=True)
            ds = p * (dp - delta)
            pa, dsa = (_bf16(p), _bf16(ds)) if bf16_operands else (p, ds)  # hi + lo is p, dS to ~2^-17
            grads[0][rows, h] += SCALE * dsa @ kh
            grads[1][rows, g] += SCALE * dsa.T @ qh
            grads[2][rows, g] += pa.T @ doh
    atol, rtol = tolerance("gradient_accuracy", "attention")
    out = {}
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref, strict=True):
        r = want.grad.double()
        out[name] = float(((_bf16(got) - r).abs() / (atol + rtol * r.abs())).max())
    return out


def _worst(delta_from_output: bool, bf16_operands: bool) -> dict[str, float]:
    """The model on the GPU backward tests' fixture."""
    _, t = packed_attention_rows(LENGTHS, 0, {"q": HQ, "k": HKV, "v": HKV, "dout": HQ}, D, "cpu")
    return _model_worst(t, LENGTHS, delta_from_output, bf16_operands)


def _gate_inputs(tier: str, q_scale: float) -> tuple[dict[str, torch.Tensor], tuple[int, ...]]:
    """The gate's own attention inputs of ``tier`` at full widths (the matrix's case, upstream masked to the
    completion tokens), ``q`` times ``q_scale`` (a power of two: exact in bf16)."""
    manifest = load_manifest()
    model = manifest.model("qwen3-8b")
    adapter = build_adapters(model)["attention"]
    task = UnitTask("portable_cpu", "attention", tier, model=model.name)
    fx = build_fixture(manifest, tier, model.name)
    li = logical_inputs(adapter, fx, task.case_id, model.pad_id, True, "cpu", task.param_case)
    assert li.upstream is not None
    t = {n: li.tokens[n] for n in ("q", "k", "v")}
    t["q"] = (t["q"].float() * q_scale).to(torch.bfloat16)
    t["dout"] = li.upstream
    lengths = tuple(s.length for s in sorted(fx.samples, key=lambda s: s.sample_id))
    return t, lengths


def test_delta_from_p_dp_and_split_operands_are_within_the_contract() -> None:
    worst = _worst(delta_from_output=False, bf16_operands=False)
    assert max(worst.values()) < 0.5, worst


def test_the_control_delta_from_the_bf16_output_misses() -> None:
    worst = _worst(delta_from_output=True, bf16_operands=False)
    assert worst["dk"] > 1.2, worst


def test_the_control_bf16_operands_miss() -> None:
    worst = _worst(delta_from_output=False, bf16_operands=True)
    assert max(worst["dk"], worst["dv"]) > 1.2, worst


# The gate's own inputs. Their scores are soft (q, k and v drawn at one scale): on them the usual flash choices
# stay within the contract at every tier (docs/cuda_sm90.md, "Two numerical choices"), so the gate cannot tell them
# from the accurate backward. Scores twice as sharp, q doubled, already separate them: the kind of case the workload
# needs for the gate to see the choice (a finding, not yet in the manifest).


def test_on_the_gate_inputs_with_sharper_scores_the_accurate_backward_is_within_the_contract() -> None:
    t, lengths = _gate_inputs("primary", 2.0)
    worst = _model_worst(t, lengths, delta_from_output=False, bf16_operands=False)
    assert max(worst.values()) < 0.5, worst


def test_the_control_on_the_same_inputs_delta_from_the_bf16_output_misses() -> None:
    t, lengths = _gate_inputs("primary", 2.0)
    worst = _model_worst(t, lengths, delta_from_output=True, bf16_operands=False)
    assert worst["dk"] > 1.2, worst
