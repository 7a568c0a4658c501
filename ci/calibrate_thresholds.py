"""Measure the accuracy errors of correct bf16 implementations and derive the contract's accuracy thresholds.

    python ci/calibrate_thresholds.py [--profile portable_cpu --profile native_torch] [--model tiny]
        [--tier short --tier primary --tier long] [--seeds 4] [--out docs/evidence/calibration-cpu]
        [--write-contract contracts/tolerance.json]

Why: thresholds taken from published figures could not fail: with upstream gradients divided by the active-token
count, a gradient 1.5x too large passed under an absolute threshold of 0.1. Here every accuracy threshold of the
bf16 rows is derived from what correct implementations really do on the manifest's fixtures (hard cases
included), so a planted error of 10 % turns red.

What it does, per profile, operator, tier and seed: run the candidate on the canonical (packed) layout and the
fp32 reference on the same bf16 inputs (the harness's own code: `logical_inputs`, `run_layout`,
`run_reference`), and record the element-wise error `e = |candidate - reference|` of the output and of every
token and parameter gradient, pooled per (judgment, op class). Seeds are case ids: seed k draws every input,
weight and upstream gradient from `calibration/seed<k>/...` (token ids and hard rows are the manifest's).

The rule (stated, not fitted):
- `rtol` is fixed by the judged tensors' format: `RTOL_BF16` = 2^-6 (four times the 2^-8 half-ulp a single
  correct bf16 rounding costs) for bf16 tensors; `RTOL_FP32_LOGPROB` = 2^-20 for the fp32 logprob values (a few
  fp32 ulps: the value is the product of an fp32 logsumexp).
- `atol` = `MULTIPLE` (4) x the P99.9 of e over the group's elements whose reference magnitude |r| is at most
  `ATOL_SCALE` (1: the scale inputs and upstream gradients are drawn at), all profiles pooled, rounded up to two
  significant digits. Those are the elements the atol term judges; above |r| = 1 the rtol term alone exceeds a
  correct rounding, and letting the larger elements set atol would make it as loose as their rounding errors
  (the rms_norm gradient of a zero row is of order 1/sqrt(eps) = 1000, its rounding errors of order 4). The
  forward logprob values (fp32, of order log V) are judged on all their elements: their error is absolute.
- Excluded: `EXCLUDED` lists candidates that are not correct bf16 implementations in this sense, with why
  (native_torch.linear_logp rounds its logits to bf16 before the logprob: the very fault the gate must catch).
A candidate of a calibrated profile must pass every element it produced: an element passes iff its excess
`e - rtol |r|` is at most atol, so the script tracks each profile's largest excess and reports
`headroom = max excess / atol` per group (<= 1: every measured element passes).

Output: `<out>/calibration.json` (per group: elements, active tokens, seeds, percentiles, the chosen thresholds,
headroom per profile, and the P99.9 of every (profile, operator, tensor)); `--write-contract` writes the
thresholds and calibration records into the contract (bump its revision by hand).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ws1_harness.run.adapters import build_adapters
from ws1_harness.run.layouts_exec import run_layout, run_reference
from ws1_harness.run.unit import logical_inputs
from ws1_kernels import reference, registry
from ws1_workload import build_fixture, build_layout, load_manifest

MULTIPLE = 4.0
PERCENTILE = 99.9
RTOL_BF16 = 2.0**-6
RTOL_FP32_LOGPROB = 2.0**-20
ATOL_SCALE = 1.0
EXCLUDED: dict[tuple[str, str], str] = {
    ("native_torch", "linear_logp"): "rounds its logits to bf16 before the logprob (F.linear in bf16)",
}
# log-spaced histogram of the errors: 64 bins per octave from 2^-64 to 2^32 (percentiles to about 1 %)
_BINS_PER_OCTAVE = 64
_LOW, _HIGH = -64, 32


def rtol_for(judgment: str, op_class: str) -> float:
    """The fixed relative part of a group's threshold (see the module docstring)."""
    return RTOL_FP32_LOGPROB if (judgment, op_class) == ("forward_accuracy", "logprob") else RTOL_BF16


class Group:
    """The pooled errors of one (judgment, op class): histograms (all elements, and those with |r| <= the atol
    scale), and each tensor's largest errors."""

    def __init__(self, rtol: float, atol_all: bool = False) -> None:
        self.rtol = rtol
        self.hist = torch.zeros((_HIGH - _LOW) * _BINS_PER_OCTAVE + 2, dtype=torch.float64)
        self.small = torch.zeros_like(self.hist)
        self.atol_all = atol_all
        self.n = 0
        self.max = 0.0
        self.max_excess: dict[str, float] = {}
        self.per_tensor: dict[str, dict[str, Any]] = {}

    def add(self, profile: str, name: str, cand: torch.Tensor, ref: torch.Tensor) -> None:
        # on the tensors' device: at the full vocabulary a weight gradient has 622M elements, and histogramming
        # them on the host took most of a GPU run's time; only the histograms come back
        e = (cand.detach().double() - ref.detach().double()).abs().flatten()
        r = ref.detach().double().abs().flatten()
        if not bool(torch.isfinite(e).all()):
            raise SystemExit(f"calibrate: {profile} {name}: non-finite error; not a correct implementation")
        self.n += e.numel()
        self.max = max(self.max, float(e.max()))
        self.hist += _histogram(e)
        self.small += _histogram(e if self.atol_all else e[r <= ATOL_SCALE])
        excess = float((e - self.rtol * r).max())
        self.max_excess[profile] = max(self.max_excess.get(profile, -math.inf), excess)
        stats = self.per_tensor.setdefault(
            f"{profile}:{name}", {"elements": 0, "max": 0.0, "max_excess": -math.inf, "hist": None}
        )
        stats["elements"] += e.numel()
        stats["max"] = max(stats["max"], float(e.max()))
        stats["max_excess"] = max(stats["max_excess"], excess)
        stats["hist"] = _histogram(e) if stats["hist"] is None else stats["hist"] + _histogram(e)

    def percentile(self, q: float, hist: torch.Tensor | None = None) -> float:
        h = self.hist if hist is None else hist
        total = float(h.sum())
        rank = total * q / 100.0
        cum = torch.cumsum(h, 0)
        i = int(torch.searchsorted(cum, torch.tensor(rank, dtype=torch.float64)))
        return _upper_edge(i)


def _histogram(e: torch.Tensor) -> torch.Tensor:
    """Counts per log bin; bin 0 holds exact zeros (and errors below 2^-64), the last bin anything above 2^32."""
    out = torch.zeros((_HIGH - _LOW) * _BINS_PER_OCTAVE + 2, dtype=torch.float64, device=e.device)
    pos = e[e > 0]
    zero = e.numel() - pos.numel()
    idx = ((torch.log2(pos) - _LOW) * _BINS_PER_OCTAVE).floor().long() + 1
    idx = idx.clamp(0, out.numel() - 1)
    out.index_add_(0, idx, torch.ones_like(idx, dtype=torch.float64))
    out[0] += zero
    return out.cpu()  # counts of 1.0 summed in float64: exact in any order


def _upper_edge(i: int) -> float:
    if i <= 0:
        return 0.0
    return 2.0 ** (_LOW + i / _BINS_PER_OCTAVE)


def _round_up(x: float) -> float:
    """Two significant digits, rounded up (a threshold never below the measured multiple)."""
    if x <= 0:
        return 0.0
    scale = 10 ** (math.floor(math.log10(x)) - 1)
    return float(f"{math.ceil(x / scale - 1e-9) * scale:.2g}")


def measure(
    profiles: list[str], model: str, tiers: list[str], seeds: int, device: str = "cpu"
) -> tuple[dict[tuple[str, str], Group], dict[str, int]]:
    manifest = load_manifest()
    adapters = build_adapters(manifest.model(model))
    canon_spec = next(s for s in manifest.layouts if s.type == "packed")
    groups: dict[tuple[str, str], Group] = {}

    def group(judgment: str, cls: str) -> Group:
        key = (judgment, cls)
        if key not in groups:
            groups[key] = Group(rtol_for(judgment, cls), atol_all=key == ("forward_accuracy", "logprob"))
        return groups[key]

    tokens = {"active": 0, "total": 0}
    for tier in tiers:
        fx = build_fixture(manifest, tier, model)
        layout = build_layout(fx, canon_spec)
        tokens["active"] += int(fx.active.sum()) * seeds
        tokens["total"] += fx.total_tokens * seeds
        for op, spec in manifest.operators.items():
            if spec.layout_only:
                continue
            adapter = adapters[op]
            train = spec.differentiable and bool(adapter.grad_inputs or adapter.params)
            for seed in range(seeds):
                case = f"calibration/seed{seed}/{op}/{tier}/{model}"
                inputs = logical_inputs(
                    adapter,
                    fx,
                    case,
                    manifest.pad_id,
                    train,
                    device,
                    param_case=f"calibration/seed{seed}/{op}/{model}",
                )
                ref = run_reference(getattr(reference, op), adapter, layout, inputs, train=train)
                for profile in profiles:
                    if (profile, op) in EXCLUDED:
                        continue
                    cand = registry.resolve(profile, op, device=device)
                    t0 = time.perf_counter()
                    run = run_layout(
                        cand.fn,
                        adapter,
                        layout,
                        inputs,
                        case_id=case,
                        pad_id=manifest.pad_id,
                        train=train,
                        param_rule=cand.param_grad_rule,
                        watch_ops=False,
                    )
                    if run.output_problem is not None or run.backward_error or run.backward_crash:
                        raise SystemExit(
                            f"calibrate: {profile} {op} {tier}: the candidate did not run cleanly"
                        )
                    cls = spec.op_class
                    group("forward_accuracy", cls).add(profile, f"{op}.output", run.output, ref.output)
                    if train:
                        for name, g in run.token_grads.items():
                            group("gradient_accuracy", cls).add(
                                profile, f"{op}.d_{name}", g, ref.token_grads[name]
                            )
                        for name, g in run.param_grads.items():
                            group("gradient_accuracy", cls).add(
                                profile, f"{op}.d_{name}", g, ref.param_grads[name]
                            )
                    print(
                        f"calibrate: {profile:>13} {op:>11} {tier:>7} seed {seed}: "
                        f"{time.perf_counter() - t0:.1f}s",
                        file=sys.stderr,
                    )
    return groups, tokens


def summarise(
    groups: dict[tuple[str, str], Group], tokens: dict[str, int], seeds: int, profiles: list[str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for (judgment, cls), g in sorted(groups.items()):
        p999 = g.percentile(PERCENTILE)
        p999_small = g.percentile(PERCENTILE, g.small)
        rtol = rtol_for(judgment, cls)
        atol = _round_up(MULTIPLE * p999_small)
        headroom = {p: (x / atol if atol > 0 else math.inf) for p, x in g.max_excess.items()}
        per_tensor = {
            key: {
                "elements": s["elements"],
                "p99.9": g.percentile(PERCENTILE, s["hist"]),
                "max": s["max"],
                "max_excess": s["max_excess"],
            }
            for key, s in sorted(g.per_tensor.items())
        }
        out[f"{judgment}/{cls}/bf16"] = {
            "judgment": judgment,
            "op_class": cls,
            "dtype": "bf16",
            "elements": g.n,
            "active_tokens": tokens["active"],
            "tokens": tokens["total"],
            "seeds": seeds,
            "profiles": profiles,
            "p50": g.percentile(50.0),
            "p99": g.percentile(99.0),
            "p99.9": p999,
            "atol_elements": int(g.small.sum()),
            "atol_elements_p99.9": p999_small,
            "max": g.max,
            "multiple": MULTIPLE,
            "atol": atol,
            "rtol": rtol,
            "max_excess": g.max_excess,
            "headroom": headroom,
            "per_tensor": per_tensor,
        }
    return out


def write_contract(path: Path, summary: dict[str, Any], source: str, date: str) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    for entry in summary.values():
        cell = doc["judgments"][entry["judgment"]][entry["op_class"]][entry["dtype"]]
        cell["atol"] = entry["atol"]
        cell["rtol"] = entry["rtol"]
        cell["calibration"] = {
            "status": "calibrated",
            "source": source,
            "date": date,
            "active_tokens": entry["active_tokens"],
            "seeds": entry["seeds"],
        }
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def combine(files: list[Path], contract: Path) -> int:
    """Write into `contract` one threshold per group that holds on every calibrated device: the largest atol
    of the calibration files (each = the rule above on that device's correct implementations), their common
    rtol, and a calibration record naming every file. A threshold must not turn a correct kernel red on any
    machine it is judged on, so a group takes the loosest device's figure, never an average."""
    runs = [(f, json.loads(f.read_text(encoding="utf-8"))) for f in files]
    keys = sorted({k for _, r in runs for k in r["groups"]})
    summary: dict[str, Any] = {}
    for key in keys:
        entries = [(f, r, r["groups"][key]) for f, r in runs if key in r["groups"]]
        rtols = {e["rtol"] for _, _, e in entries}
        if len(rtols) != 1:
            raise SystemExit(
                f"calibrate: {key}: the files disagree on rtol ({sorted(rtols)}): one rule, one rtol"
            )
        first = entries[0][2]
        summary[key] = {
            "judgment": first["judgment"],
            "op_class": first["op_class"],
            "dtype": first["dtype"],
            "atol": max(e["atol"] for _, _, e in entries),
            "rtol": first["rtol"],
            "active_tokens": sum(e["active_tokens"] for _, _, e in entries),
            "seeds": max(e["seeds"] for _, _, e in entries),
        }
        figures = ", ".join(f"{r.get('device_name', r['device'])} {e['atol']:g}" for _, r, e in entries)
        print(f"{key:40} atol={summary[key]['atol']:g} ({figures})")
    source = "; ".join(
        f"{r['command']} -> {f.as_posix()} ({r.get('device_name', r['device'])})" for f, r in runs
    )
    source += (
        "; per group the largest atol of these files, each = 4 x P99.9 of |c - r| over elements with |r| <= 1 "
        "(forward logprob: all elements), rtol fixed by the tensor format"
    )
    write_contract(contract, summary, source, max(r["date"] for _, r in runs))
    print(f"calibrate: wrote thresholds into {contract}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--combine"]:
        # --combine A.json B.json ... --write-contract contracts/tolerance.json
        *files, flag, contract = argv[1:]
        if flag != "--write-contract" or not files:
            raise SystemExit(
                "usage: calibrate_thresholds.py --combine A.json [B.json ...] --write-contract FILE"
            )
        return combine([Path(f) for f in files], Path(contract))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="append", dest="profiles")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--tier", action="append", dest="tiers")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("docs/evidence/calibration-cpu"))
    ap.add_argument("--write-contract", type=Path)
    ap.add_argument("--device", default="cpu", help="cpu or cuda: where candidates and the reference run")
    args = ap.parse_args(argv)
    profiles = args.profiles or ["portable_cpu", "native_torch"]
    tiers = args.tiers or ["short", "primary", "long"]
    torch.set_num_threads(max(1, torch.get_num_threads()))
    start = time.perf_counter()
    groups, tokens = measure(profiles, args.model, tiers, args.seeds, args.device)
    summary = summarise(groups, tokens, args.seeds, profiles)
    date = datetime.date.today().isoformat()
    command = (
        "python ci/calibrate_thresholds.py "
        + " ".join(f"--profile {p}" for p in profiles)
        + f" --model {args.model} "
        + " ".join(f"--tier {t}" for t in tiers)
        + f" --seeds {args.seeds}"
        + (f" --device {args.device}" if args.device != "cpu" else "")
    )
    record = {
        "command": command,
        "date": date,
        "torch": torch.__version__,
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "excluded": {f"{p}.{op}": why for (p, op), why in EXCLUDED.items()},
        "rule": {
            "atol": (
                f"{MULTIPLE:g} x P{PERCENTILE:g} of |candidate - reference| over the group's elements with "
                f"|reference| <= {ATOL_SCALE:g} (forward logprob: all elements), two digits, rounded up"
            ),
            "rtol": {"bf16 tensors": RTOL_BF16, "forward logprob (fp32 values)": RTOL_FP32_LOGPROB},
        },
        "wall_s": round(time.perf_counter() - start, 1),
        "groups": summary,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / "calibration.json"
    target.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"calibrate: wrote {target}", file=sys.stderr)
    for key, e in summary.items():
        print(
            f"{key:40} n={e['elements']:>10} p99.9={e['p99.9']:.3g} max={e['max']:.3g} "
            f"atol={e['atol']:.3g} rtol={e['rtol']:.3g} headroom={ {k: round(v, 3) for k, v in e['headroom'].items()} }"
        )
    if args.write_contract is not None:
        source = f"{command}; docs/evidence/calibration-cpu/calibration.json (CPU, {args.model} widths)"
        write_contract(args.write_contract, summary, source, date)
        print(f"calibrate: wrote thresholds into {args.write_contract}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
