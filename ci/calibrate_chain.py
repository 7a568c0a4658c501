"""Measure the whole-model accuracy of correct bf16 chains and derive the contract's chain thresholds.

    python ci/calibrate_chain.py --profile triton_cuda_bf16 [--profile native_torch] [--model qwen3-8b]
        [--layers L] [--tier long] [--seeds 4] [--device cuda] --out DIR [--write-contract contracts/tolerance.json]
    python ci/calibrate_chain.py --combine A.json [B.json ...] --write-contract contracts/tolerance.json

Why: the contract's chain thresholds (`chain.thresholds.bf16`) were provisional, taken from published figures. A
threshold that a correct chain exceeds turns every green profile red; one far above what a correct chain does
lets a real fault through. Here each is derived from what correct bf16 chains really do on the manifest's fixtures.

What it does, per profile, seed and tier (the `ws1 chain` code: `Chain.run_rollout`, `Chain.train`,
`Chain.reference_logprobs`, `gradient_figures`): roll the tier's prompts out with the sampler seeded by the seed
(other completions per seed), train the packed layout on the produced tokens with an upstream gradient drawn from
`calibration/seed<k>/<case id>`, and compare with the fp32 reference: the chain aggregates `max_abs_dlogp`,
`approx_kl0`, `clipfrac0` of `d = trainer - fp32 reference chain` over the scored tokens (one value per run), and
per parameter gradient `grad_rel_l2 = norm2(g - g_ref) / norm2(g_ref)` and `grad_rel_max_abs = max|g - g_ref| /
max|g_ref|` against the fp32 reference drop-in (one value per run and parameter). No op watch, no other layouts:
parity and invariance are bitwise judgments with nothing to calibrate.

The rule (stated, not fitted): each threshold = a multiple of the largest value measured (all profiles, seeds,
tiers and parameters pooled), two significant digits rounded up, at most 1 (the contract's range). The multiple is
4 for the three logprob aggregates, which give one value per run (a handful in all, so the largest seen is far
from the tail), and 2 for the two gradient figures, which give one value per run and parameter (1596 at 36 layers
and four seeds, so the largest seen already is the tail); a wider gradient bound would pass a parameter gradient
10 % off, which a correct 36-layer chain never comes near (largest 4.9 %). max_abs_dlogp is then capped at the
largest |d| the contract's clip interval allows (``clip_cap``). The distribution (median, P99, max) and the
active-token count are recorded beside each threshold. `--write-contract` replaces
`chain.thresholds.bf16` with the figures and a calibration record (the command, device, seeds, active tokens) and
refuses, exit 2, when the run is short of the contract's rule for a `calibrated` record (>= 4096 active tokens,
>= 3 seeds); the written contract is validated (schema and semantics) before the file is replaced. `--combine`
recomputes each threshold from the largest value measured in several calibration files (each device's correct
chains must stay green).
Progress goes to stderr; the JSON to `<out>/chain-calibration.json`.
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

MULTIPLE = 4.0  # the logprob aggregates: one value per run
GRADIENT_MULTIPLE = 2.0  # the gradient figures: one value per run and parameter (docstring)
LOGPROB = ("max_abs_dlogp", "approx_kl0", "clipfrac0")
GRADIENT = ("grad_rel_l2", "grad_rel_max_abs")
DTYPE = "bf16"


def _round_up(x: float) -> float:
    """Two significant digits, rounded up (a threshold never below the measured multiple)."""
    if x <= 0:
        return 0.0
    scale = 10 ** (math.floor(math.log10(x)) - 1)
    return float(f"{math.ceil(x / scale - 1e-9) * scale:.2g}")


def distribution(values: list[float]) -> dict[str, Any]:
    """n, median, P99 (nearest rank) and max of a list of figures."""
    v = sorted(values)
    if not v:
        return {"n": 0, "median": None, "p99": None, "max": None}

    def rank(q: float) -> float:
        return v[min(len(v) - 1, max(0, math.ceil(q / 100 * len(v)) - 1))]

    return {"n": len(v), "median": rank(50), "p99": rank(99), "max": v[-1]}


def multiple(key: str) -> float:
    return GRADIENT_MULTIPLE if key in GRADIENT else MULTIPLE


def threshold(values: list[float], key: str = "max_abs_dlogp") -> float:
    return threshold_of_max(max(values), key) if values else 0.0


def threshold_of_max(largest: float, key: str) -> float:
    return min(1.0, _round_up(multiple(key) * largest))


def measure(
    profiles: list[str],
    model: str,
    layers: int | None,
    tiers: list[str] | None,
    seeds: int,
    device: str | None,
    checkpoint: Any = None,
) -> dict[str, Any]:
    """Every (profile, seed, tier) run's figures, pooled per aggregate. ``checkpoint(partial)`` is called after
    each run with what is measured so far (a 36-layer run takes minutes: a run cut by a time limit keeps its
    finished seeds)."""
    from ws1_harness.run.chain import Chain, ChainSettings, gradient_figures, on_host, release_device_memory
    from ws1_kernels.integrations import qwen3, rollout

    pooled: dict[str, list[float]] = {k: [] for k in (*LOGPROB, *GRADIENT)}
    runs: list[dict[str, Any]] = []
    tokens = 0
    weights = None
    first = None
    for profile in profiles:
        settings = ChainSettings(
            profile=profile,
            model=model,
            layers=layers,
            tiers=tuple(tiers) if tiers else None,
            device=device,
        )
        chain = Chain(settings, weights=weights)
        weights = chain.weights
        first = first or chain
        say = chain.progress.line
        net = chain.model()
        for seed in range(seeds):
            for tier in chain.tiers:
                from ws1_workload import build_fixture

                t0 = time.perf_counter()
                fx0 = build_fixture(chain.manifest, tier, model)
                say(f"calibrate {profile} seed {seed} {tier}: rollout")
                ro = chain.run_rollout(net, fx0, sampler=rollout.GumbelSampler(seed))
                fx = ro.fixture
                up = chain.upstream(fx, case=f"calibration/seed{seed}/{fx.case_id}")
                say(f"calibrate {profile} seed {seed} {tier}: packed training and fp32 references")
                packed = chain.train(net, fx, chain.training[0], up)
                packed = on_host(packed)  # 36 layers: the fp32 reference and its gradients need the room
                qwen3.drop_param_grads(net)
                # the one fp32 reference chain: the drop-in on ws1_kernels.reference, forward and backward
                ref_run = chain.train(chain.reference_model(), fx, chain.training[0], up)
                acc = chain.aggregates(packed.logprobs, ref_run.logprobs.float().cpu(), fx, bitwise=False)
                if "max_abs_dlogp" not in acc:
                    raise SystemExit(f"calibrate_chain: {profile} seed {seed} {tier}: {acc.get('why')}")
                grads: dict[str, dict[str, Any]] = {}
                for name, g in packed.grads.items():
                    r = ref_run.grads.get(name)
                    if g is None or r is None:
                        raise SystemExit(f"calibrate_chain: {profile} {name}: no gradient arrived")
                    fig = gradient_figures(g.to(r.device), r)
                    if not fig["finite"] or fig["rel_l2"] is None or fig["rel_max_abs"] is None:
                        raise SystemExit(f"calibrate_chain: {profile} {name}: {fig.get('why', 'no figure')}")
                    grads[name] = {"grad_rel_l2": fig["rel_l2"], "grad_rel_max_abs": fig["rel_max_abs"]}
                    pooled["grad_rel_l2"].append(fig["rel_l2"])
                    pooled["grad_rel_max_abs"].append(fig["rel_max_abs"])
                del packed, ref_run
                release_device_memory()
                for k in LOGPROB:
                    pooled[k].append(float(acc[k]))
                if profile == profiles[0]:
                    tokens += acc["tokens"]
                worst = max(grads, key=lambda n: grads[n]["grad_rel_l2"])
                runs.append(
                    {
                        "profile": chain.profile_label,
                        "seed": seed,
                        "tier": tier,
                        "active_tokens": acc["tokens"],
                        "rollout_steps": len(ro.trace),
                        **{k: acc[k] for k in LOGPROB},
                        "worst_gradient": {"parameter": worst, **grads[worst]},
                        "gradients": grads,
                        "wall_s": round(time.perf_counter() - t0, 2),
                    }
                )
                say(
                    f"calibrate {profile} seed {seed} {tier}: max|d| {acc['max_abs_dlogp']:.3g}, kl0 "
                    f"{acc['approx_kl0']:.3g}, worst grad rel_l2 {grads[worst]['grad_rel_l2']:.3g} ({worst})"
                )
                if checkpoint is not None:
                    done = seed + 1 if tier == chain.tiers[-1] else seed
                    checkpoint(
                        {
                            "pooled": pooled,
                            "runs": runs,
                            "active_tokens": tokens,
                            "layers": chain.cfg.num_layers,
                            "tiers": list(chain.tiers),
                            "device": chain.device_record(),
                            "seeds_done": done if profile == profiles[0] else seeds,
                        }
                    )
        del net
    assert first is not None
    return {
        "pooled": pooled,
        "runs": runs,
        "active_tokens": tokens,
        "layers": first.cfg.num_layers,
        "tiers": list(first.tiers),
        "device": first.device_record(),
    }


def summarise(pooled: dict[str, list[float]]) -> dict[str, Any]:
    return {
        k: {**distribution(v), "multiple": multiple(k), "threshold": threshold(v, k)}
        for k, v in pooled.items()
    }


def _check_bounds(thresholds: dict[str, float]) -> list[str]:
    """What would make the contract's own consistency fail (reported, never hidden)."""
    out = []
    m = thresholds["max_abs_dlogp"]
    if math.exp(m) > 1.2 or math.exp(-m) < 0.8:
        out.append(
            f"max_abs_dlogp {m} by the rule lets a ratio leave the clip interval [0.8, 1.2] (--write-contract caps it)"
        )
    if thresholds["approx_kl0"] <= 0:
        out.append("approx_kl0 measured 0: a zero threshold accepts only identical logprobs")
    return out


def _round_down(x: float) -> float:
    """Two significant digits, rounded down (a cap never above the bound it stands for)."""
    scale = 10 ** (math.floor(math.log10(x)) - 1)
    return float(f"{math.floor(x / scale + 1e-9) * scale:.2g}")


def clip_cap(doc: dict[str, Any]) -> float:
    """The largest |d| that keeps exp(d) inside the contract's clip interval, two digits rounded down.

    A max_abs_dlogp bound above it would admit a token whose ratio leaves the interval, which clipfrac0 (0 for a
    correct bf16 chain) rejects anyway: the two thresholds would say different things about one token."""
    clip = doc["chain"]["clip_interval"]
    return _round_down(min(math.log(float(clip["high"])), -math.log(float(clip["low"]))))


def write_contract(
    path: Path,
    thresholds: dict[str, float],
    source: str,
    date: str,
    tokens: int,
    seeds: int,
    measured_max: float | None = None,
) -> None:
    """Replace chain.thresholds.bf16 by calibrated figures; validated before the file is replaced.

    max_abs_dlogp is capped at ``clip_cap`` (the cap is said in the record's source); a run whose largest
    measured |d| is already above the cap is refused: correct chains would then clip, and no threshold here
    could hold both the rule and the clip interval."""
    from ws1_contract import Contract, ContractError
    from ws1_contract import vocabulary as v

    doc = json.loads(path.read_text(encoding="utf-8"))
    cap = clip_cap(doc)
    if measured_max is not None and measured_max > cap:
        print(
            f"calibrate_chain: --write-contract: a correct chain measured max |d| {measured_max:.3g}, above "
            f"{cap:g}, the largest |d| the clip interval allows; contract unchanged",
            file=sys.stderr,
        )
        raise SystemExit(2)
    if thresholds["max_abs_dlogp"] > cap:
        thresholds = {**thresholds, "max_abs_dlogp": cap}
        source += (
            f"; max_abs_dlogp capped at {cap:g} (ln of the clip interval's bound, 2 digits rounded down): "
            f"the rule's figure would admit ratios that clipfrac0 rejects"
        )

    if tokens < v.MIN_CALIBRATION_TOKENS or seeds < v.MIN_CALIBRATION_SEEDS:
        print(
            f"calibrate_chain: --write-contract: {tokens} active tokens over {seeds} seeds is short of a calibrated "
            f"record (>= {v.MIN_CALIBRATION_TOKENS} tokens, >= {v.MIN_CALIBRATION_SEEDS} seeds); contract unchanged",
            file=sys.stderr,
        )
        raise SystemExit(2)
    entry = doc["chain"]["thresholds"][DTYPE]
    for k in (*LOGPROB, *GRADIENT):
        entry[k] = thresholds[k]
    entry["calibration"] = {
        "status": "calibrated",
        "source": source,
        "date": date,
        "active_tokens": tokens,
        "seeds": seeds,
    }
    try:
        Contract.from_document(doc, str(path))
    except ContractError as exc:
        print(
            f"calibrate_chain: the calibrated contract would be invalid: {exc}; contract unchanged",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"calibrate_chain: wrote chain thresholds into {path}", file=sys.stderr)


def combine(files: list[Path], contract: Path) -> int:
    """The loosest figure per threshold over several calibration files (one per device or model)."""
    runs = [(f, json.loads(f.read_text(encoding="utf-8"))) for f in files]
    # from the largest value measured, under this script's rule (a file written under an older rule is re-derived)
    th = {k: threshold_of_max(max(r["summary"][k]["max"] for _, r in runs), k) for k in (*LOGPROB, *GRADIENT)}
    tokens = sum(r["active_tokens"] for _, r in runs)
    seeds = max(r["seeds"] for _, r in runs)
    source = "; ".join(f"{r['command']} -> {f.as_posix()} ({r['device']['name']})" for f, r in runs)
    source += (
        f"; per threshold the largest value measured in these files x {MULTIPLE:g} (logprob aggregates) or "
        f"x {GRADIENT_MULTIPLE:g} (gradient figures), 2 digits rounded up"
    )
    for k, val in th.items():
        print(f"{k:18} {val:g}")
    for problem in _check_bounds(th):
        print(f"calibrate_chain: warning: {problem}", file=sys.stderr)
    worst = max(r["summary"]["max_abs_dlogp"].get("max") or 0.0 for _, r in runs)
    write_contract(contract, th, source, max(r["date"] for _, r in runs), tokens, seeds, worst)
    return 0


def record_of(args: argparse.Namespace, m: dict[str, Any], seeds: int, start: float) -> dict[str, Any]:
    """The calibration file's record of what ``measure`` returned (or has so far)."""
    import torch

    command = (
        "python ci/calibrate_chain.py "
        + " ".join(f"--profile {p}" for p in args.profiles)
        + f" --model {args.model} --layers {m['layers']} "
        + " ".join(f"--tier {t}" for t in m["tiers"])
        + f" --seeds {args.seeds}"
        + (f" --device {args.device}" if args.device else "")
    )
    return {
        "command": command,
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "device": m["device"],
        "model": args.model,
        "layers": m["layers"],
        "tiers": m["tiers"],
        "profiles": args.profiles,
        "seeds": seeds,
        "active_tokens": m["active_tokens"],
        "rule": f"threshold = {MULTIPLE:g} (logprob aggregates) or {GRADIENT_MULTIPLE:g} (gradient figures) x max "
        "over profiles, seeds, tiers (and parameters), 2 digits, rounded up, at most 1",
        "summary": summarise(m["pooled"]),
        "wall_s": round(time.perf_counter() - start, 1),
        "runs": m["runs"],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--combine"]:
        *files, flag, target = argv[1:]
        if flag != "--write-contract" or not files:
            print(
                "usage: calibrate_chain.py --combine A.json [B.json ...] --write-contract FILE",
                file=sys.stderr,
            )
            return 2
        return combine([Path(f) for f in files], Path(target))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="append", dest="profiles", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--tier", action="append", dest="tiers")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--device", choices=("cpu", "cuda"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--write-contract", type=Path)
    args = ap.parse_args(argv)
    if args.seeds < 1:
        print("calibrate_chain: --seeds must be >= 1", file=sys.stderr)
        return 2
    target = args.out / "chain-calibration.json"
    if target.exists():
        print(f"calibrate_chain: {target} exists (remove it first)", file=sys.stderr)
        return 2
    from ws1_harness.errors import HarnessError

    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    partial = args.out / "chain-calibration.partial.json"

    def checkpoint(m: dict[str, Any]) -> None:
        """What is measured so far, seeds counted only when finished for the first profile, marked partial;
        `--combine` accepts it like a full file (the contract's seeds and tokens rule still applies)."""
        rec = record_of(args, m, m["seeds_done"], start)
        rec["partial"] = True
        partial.write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")

    try:
        m = measure(args.profiles, args.model, args.layers, args.tiers, args.seeds, args.device, checkpoint)
    except HarnessError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    record = record_of(args, m, args.seeds, start)
    summary, command = record["summary"], record["command"]
    target.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    partial.unlink(missing_ok=True)
    print(
        f"calibrate_chain: wrote {target} ({m['active_tokens']} active tokens, {args.seeds} seeds)",
        file=sys.stderr,
    )
    for k, e in summary.items():
        print(
            f"{k:18} n={e['n']:>6} median={e['median']:.3g} p99={e['p99']:.3g} max={e['max']:.3g} "
            f"-> threshold {e['threshold']:g}"
        )
    th = {k: summary[k]["threshold"] for k in (*LOGPROB, *GRADIENT)}
    for problem in _check_bounds(th):
        print(f"calibrate_chain: warning: {problem}", file=sys.stderr)
    if args.write_contract is not None:
        source = f"{command} -> {target.as_posix()} ({m['device']['name']}, {args.model} L{m['layers']})"
        write_contract(
            args.write_contract,
            th,
            source,
            record["date"],
            m["active_tokens"],
            args.seeds,
            summary["max_abs_dlogp"]["max"],
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
