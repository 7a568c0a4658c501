"""The arguments of `ws1 chain` (docs/chain.md); no torch here, so `ws1 --help` stays fast.

The command's logic lives in `ws1_harness.run.chain`, imported only when the command runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ws1_harness.argtypes import positive_int


def add_chain_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    c = sub.add_parser(
        "chain",
        help="whole-model judgment: rollout vs trainer logprobs, accuracy, gradients (docs/chain.md)",
    )
    c.add_argument("--profile", required=True)
    c.add_argument(
        "--model", default="tiny", help="model of the manifest (default tiny; qwen3-8b: full widths)"
    )
    c.add_argument(
        "--layers", type=positive_int, help="run the first L layers (default: every layer of the model)"
    )
    c.add_argument("--tier", action="append", help="fixture tier (repeatable; default: every tier)")
    c.add_argument("--out", required=True, help="directory for chain-<profile>-<model>-L<layers>.json")
    c.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    c.add_argument("--device", choices=("cpu", "cuda"), help="default: where the profile's candidates run")
    c.add_argument(
        "--rollout-path",
        choices=("auto", "call", "step"),
        default="auto",
        help="the rollout engine's path: call (forward_call), step (the step ops; CUDA graphs on a GPU), "
        "auto (default: step on a GPU for a profile with step ops, else call)",
    )
    c.add_argument("--manifest", help="manifest YAML (default: the shipped one)")
    c.add_argument("--contract", help="contract JSON (default: the shipped one)")
    c.add_argument("--force", action="store_true", help="replace an existing result file")
    c.add_argument("--allow-in-checkout", action="store_true", help="allow writing inside the git checkout")


def run_cli(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Check `--out` before torch is imported, then run the chain: exit 0 pass, 1 a failed judgment."""
    from ws1_harness.cli_support import UsageError, out_dir, require_run_extra

    require_run_extra("chain")  # one line naming what is missing, never "internal error"
    tiers = args.tier or []
    repeated = sorted({t for t in tiers if tiers.count(t) > 1})
    if repeated:  # refused up front, as matrix and bench do (the run once did the tier, then failed)
        raise UsageError(f"ws1 chain: --tier {repeated[0]} given more than once")
    out_dir(args.out, "chain", allow_in_checkout=args.allow_in_checkout)
    from ws1_harness.run import chain

    return chain.run_cli(args, argv)
