"""`ws1-workload`: describe the manifest (digests of every fixture and layout) and verify weight files.

Bad input (manifest, checkpoint, model name) prints one line to stderr and exits 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from ws1_contract import ContractError
from ws1_contract.console import quiet_broken_pipe

from .digest import fixture_digest, layout_digest
from .errors import WorkloadError
from .fixtures import build_fixture
from .layouts import build_layout
from .manifest import Manifest, load_manifest
from .weights import iter_synthetic_weights, tensor_sha256, verify_checkpoint

PROG = "ws1-workload"


def _describe(m: Manifest) -> dict[str, Any]:
    models = {}
    for name, cfg in m.models.items():
        pin = m.weights(name)
        models[name] = {
            "scale": cfg.scale,
            "num_layers": cfg.num_layers,
            "hidden": cfg.hidden,
            "num_heads": cfg.num_heads,
            "num_kv_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim,
            "intermediate": cfg.intermediate,
            "vocab": cfg.vocab,
            "synthetic_content_sha256": pin.content_sha256,
            "synthetic_subset_tensors": len(pin.subset_sha256 or {}),
            "checkpoint_sha256": pin.checkpoint_sha256,
        }
    tiers = {}
    for tier in m.tiers:
        fx = build_fixture(m, tier)
        layouts = {}
        for spec in m.layouts:
            lay = build_layout(fx, spec)
            layouts[spec.name] = {
                "kind": lay.kind,
                "type": lay.type,
                "calls": len(lay.calls),
                "rows": sum(c.num_rows for c in lay.calls),
                "digest": layout_digest(lay),
            }
        tiers[tier] = {
            "case_id": fx.case_id,
            "samples": fx.num_samples,
            "tokens": fx.total_tokens,
            "lengths": [s.length for s in fx.samples],
            "prompt_lens": [s.prompt_len for s in fx.samples],
            "completion_tokens": int(fx.active.sum()),
            "scored_positions": int(fx.scored.sum()),
            "digest": fixture_digest(fx),
            "layouts": layouts,
        }
    return {
        "manifest": m.source,
        "workload_id": m.workload_id,
        "revision": m.revision,
        "fingerprint": m.fingerprint,
        "models": models,
        "tiers": tiers,
        "operators": {n: op.op_class for n, op in m.operators.items()},
        # the built-in backends by name: what each runs (kernel ids, devices) is the registry's (`ws1 inventory`)
        "profiles": {n: {"backend": p.backend, "stock": p.stock} for n, p in m.profiles.items()},
    }


def _print_text(d: dict[str, Any]) -> None:
    print(f"workload {d['workload_id']}  revision {d['revision']}  fingerprint {d['fingerprint']}")
    print(f"manifest {d['manifest']}")
    for name, md in d["models"].items():
        pin = md["synthetic_content_sha256"] or f"subset of {md['synthetic_subset_tensors']} tensors"
        print(
            f"model {name} ({md['scale']}): layers {md['num_layers']} hidden {md['hidden']} heads "
            f"{md['num_heads']}/{md['num_kv_heads']} head_dim {md['head_dim']} intermediate {md['intermediate']} "
            f"vocab {md['vocab']}; synthetic weights {pin}; checkpoint {md['checkpoint_sha256']}"
        )
    for tier, td in d["tiers"].items():
        print(
            f"tier {tier}: case {td['case_id']}, {td['samples']} samples, {td['tokens']} tokens, lengths "
            f"{td['lengths']}, prompts {td['prompt_lens']}, {td['scored_positions']} scored; fixture {td['digest']}"
        )
        for lname, ld in td["layouts"].items():
            print(
                f"  layout {lname:<13} {ld['kind']:<9} {ld['type']:<8} {ld['calls']:>4} calls {ld['rows']:>5} rows  "
                f"{ld['digest']}"
            )
    print("operators: " + ", ".join(f"{n}={c}" for n, c in d["operators"].items()))
    for name, pd in d["profiles"].items():
        print(f"profile {name}: backend {pd['backend']}" + (" (stock baseline)" if pd["stock"] else ""))


def _cmd_describe(args: argparse.Namespace) -> int:
    d = _describe(load_manifest(args.manifest))
    if args.json:
        print(json.dumps(d, indent=1, sort_keys=True))
    else:
        _print_text(d)
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    m = load_manifest(args.manifest)
    rep = verify_checkpoint(args.path, m, args.model)
    print(
        f"ok: {rep.path}: model {rep.model}, {rep.num_tensors} tensors, content {rep.content_sha256} "
        f"matches the {rep.matched} pin"
    )
    return 0


def _cmd_hash_synthetic(args: argparse.Namespace) -> int:
    from .weights import ContentHasher

    m = load_manifest(args.manifest)
    h = ContentHasher()
    for name, tensor in iter_synthetic_weights(m, args.model, args.tensor or None):
        h.update(name, tensor)
        if args.per_tensor:
            print(f"{name} {tensor_sha256(name, tensor)}")
    print(f"{args.model} {'subset ' if args.tensor else ''}content {h.hexdigest()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("describe", help="summary and digests of every fixture and layout")
    d.add_argument("--manifest", default=None, help="manifest YAML (default: the packaged one)")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.set_defaults(func=_cmd_describe)
    v = sub.add_parser("verify-weights", help="check a safetensors checkpoint (file or shard directory)")
    v.add_argument("path")
    v.add_argument("--model", default="qwen3-8b")
    v.add_argument("--manifest", default=None)
    v.set_defaults(func=_cmd_verify)
    h = sub.add_parser(
        "hash-synthetic", help="content hash of the synthetic weights (to pin in the manifest)"
    )
    h.add_argument("--model", default="tiny")
    h.add_argument("--manifest", default=None)
    h.add_argument("--tensor", action="append", help="hash only these tensors (repeatable)")
    h.add_argument("--per-tensor", action="store_true", help="also print each tensor's record hash")
    h.set_defaults(func=_cmd_hash_synthetic)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (WorkloadError, ContractError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left (`| head -c 600`): quiet, never a traceback
        return quiet_broken_pipe()


if __name__ == "__main__":
    sys.exit(main())
