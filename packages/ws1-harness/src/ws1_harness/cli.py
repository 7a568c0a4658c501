"""The `ws1` command line: matrix, merge, gate, report, bench.

Exit codes follow the gate: 0 pass, 1 red, 2 bad input, 3 pending only, 130 interrupted (Ctrl-C). Earlier
gates let expected failures surface as tracebacks (then string-matched them) and crashed on one unguarded
dictionary read. Here bad input anywhere (unknown file, malformed or truncated JSON, disagreeing shards, bad
arguments, an `--out` that cannot be written) exits 2 with exactly one line on stderr and never a traceback.
Every bad-input error derives from one base per package (`HarnessError` here), and the CLI catches the bases,
never class names. Any other exception is a bug in ws1: it is reported as one "internal error" line, exit 2,
with a hint to rerun with `WS1_TRACEBACK=1` for the traceback, so a crash can never read as a pass. A CI
script once died under `set -e` before printing its red summary; the gate prints its whole summary before it
exits non-zero. A reader that closes the pipe (`ws1 gate FILE | head -2`) silences the output, nothing more.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import traceback
from collections.abc import Sequence

from ws1_harness.argtypes import positive, positive_int
from ws1_harness.chain_args import add_chain_parser
from ws1_harness.cli_support import UsageError, out_dir, out_file, require_run_extra
from ws1_harness.console import EXIT_INTERRUPTED, emit, silence_stdout
from ws1_harness.errors import HarnessError
from ws1_harness.verdict.gate import EXIT_BAD_INPUT

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader left


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def _shard(value: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shard must be i/n, got {value!r}") from None
    if n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"shard must satisfy 0 <= i < n, got {value!r}")
    return i, n


def _attach_dash_values(argv: list[str]) -> list[str]:
    """`--shard -1/2` as `--shard=-1/2`: argparse took the value for an option ("expected one argument")."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in ("--shard", "--expect-commit") and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ws1", description="ws1 numerical gate: run the matrix, merge shards, gate, report."
    )
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    sub.required = True

    m = sub.add_parser(
        "matrix",
        help="run the matrix (profile x operator x tier x judgment) for one profile into an evidence file",
    )
    m.add_argument("--profile", required=True)
    m.add_argument(
        "--tier",
        action="append",
        help="tier to run (repeatable; default: short and primary; add --tier long)",
    )
    m.add_argument("--op", action="append", help="operator to run (repeatable; default: every operator)")
    m.add_argument("--shard", type=_shard, help="run every n-th unit starting at unit i (i/n, 0-based)")
    m.add_argument(
        "--out", required=True, help="directory for the evidence (outside the checkout, or git-ignored)"
    )
    m.add_argument("--candidates", help="module:attr of an extra candidate registry (tests, experiments)")
    m.add_argument("--allow-in-checkout", action="store_true", help="allow writing inside the git checkout")
    m.add_argument(
        "--force",
        action="store_true",
        help="replace an existing evidence file (kept until the new run completes) or interrupted run's cells",
    )
    m.add_argument(
        "--cell-timeout",
        type=positive,
        default=None,
        help="seconds one unit (an operator on one tier, its four judgments) may run before its cells are red "
        "timeout (default 900)",
    )
    m.add_argument(
        "--model",
        default="qwen3-8b",
        help="model widths (default qwen3-8b); other widths are labelled as their own tier, e.g. primary@tiny",
    )
    m.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where units execute: auto (the candidate's device; CUDA for device-agnostic profiles when present)",
    )
    m.add_argument(
        "--in-process",
        action="store_true",
        help="run units in this process (no worker, no time limit): for debugging only",
    )

    g = sub.add_parser("merge", help="merge finalised shard files into one evidence file")
    g.add_argument("shards", nargs="+")
    g.add_argument("--out", required=True, help="merged evidence file (.json)")
    g.add_argument("--allow-in-checkout", action="store_true", help="allow writing inside the git checkout")
    g.add_argument("--force", action="store_true", help="replace an existing --out file")

    t = sub.add_parser("gate", help="judge an evidence file: exit 0 pass, 1 red, 2 bad input, 3 pending only")
    t.add_argument("file")
    t.add_argument(
        "--allow-pending-arch", action="store_true", help="pending_arch cells do not fail the gate"
    )
    t.add_argument("--expect-commit", help="red unless the evidence comes from this commit")
    t.add_argument("--require-clean", action="store_true", help="red if the evidence came from a dirty tree")
    t.add_argument(
        "--full",
        action="store_true",
        help="require the complete cell set: every operator and tier of the manifest at full widths",
    )
    t.add_argument(
        "--require-chain",
        action="store_true",
        help="red unless every profile (or, in a ws1 chain file, the file) has a chain cell",
    )
    t.add_argument(
        "--expect",
        action="append",
        metavar="PROFILE@ARCH[:TIER+TIER]",
        help="red unless a shard holds this profile at this arch (repeatable; e.g. cuda_bf16@sm86-proxy); "
        "`:short+primary` names the tiers the run planned for it (the absent cells of other tiers are not "
        "expected, and the verdict line says so)",
    )
    t.add_argument("--contract", help="contract the evidence must name (default: the shipped one)")
    t.add_argument("--manifest", help="manifest the evidence must name (default: the shipped one)")

    r = sub.add_parser(
        "report", help="write the Markdown table and heatmap (and a per-arch one) beside the evidence"
    )
    r.add_argument("file")
    r.add_argument("--out", help="directory for the report (default: beside the file)")
    r.add_argument("--allow-in-checkout", action="store_true", help="allow writing inside the git checkout")
    r.add_argument(
        "--expect",
        action="append",
        metavar="PROFILE@ARCH[:TIER+TIER]",
        help="the run's plan, as ws1 gate takes it, so that the report's verdict is the gate's (repeatable)",
    )

    _add_bench_parser(sub)
    add_chain_parser(sub)
    return parser


def _add_bench_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`ws1 bench` (docs/bench.md): candidate vs stock peer timings, JSON + Markdown under --out."""
    b = sub.add_parser("bench", help="time a profile's candidates against their stock peers (docs/bench.md)")
    b.add_argument("--profile", required=True)
    b.add_argument(
        "--op",
        action="append",
        help="operator to time, or train_step / decode_step (repeatable; default: every operator, no step)",
    )
    b.add_argument("--shape", action="append", help="shape name to time (repeatable, e.g. down, lm_head)")
    b.add_argument(
        "--m", action="append", type=positive_int, help="rows M of a call (repeatable; default per op)"
    )
    b.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if available, else cpu")
    b.add_argument("--model", default="qwen3-8b", help="model widths from the manifest (default qwen3-8b)")
    b.add_argument("--out", required=True, help="directory for bench-<profile>-<device>.json and .md")
    b.add_argument("--force", action="store_true", help="overwrite existing output files")
    b.add_argument("--allow-in-checkout", action="store_true", help="allow writing inside the git checkout")
    b.add_argument("--candidates", help="module:attr of an extra candidate registry (tests, experiments)")
    b.add_argument("--warmup-ms", type=positive, default=25.0, help="timer warm-up per measurement (ms)")
    b.add_argument("--rep-ms", type=positive, default=100.0, help="timed repetitions per measurement (ms)")
    b.add_argument("--copy-mib", type=positive, help="copy-ceiling buffer (MiB; default 2048 CUDA, 64 CPU)")
    b.add_argument(
        "--mm-n", type=positive_int, help="mm-ceiling size n of bf16 n^3 (default 8192 CUDA, 512 CPU)"
    )
    b.add_argument(
        "--attn-seq", type=positive_int, default=1024, help="attention sample length S (default 1024)"
    )
    b.add_argument(
        "--layers", type=positive_int, help="train_step/decode_step: first L layers of the model (default 4)"
    )
    b.add_argument(
        "--tokens", type=positive_int, help="train_step: packed tokens of the training call (default 8192)"
    )
    b.add_argument(
        "--batch",
        action="append",
        type=positive_int,
        help="decode_step: batch (repeatable; default 1, 64, 256)",
    )
    b.add_argument("--cache", type=positive_int, help="decode_step: cached tokens per request (default 2048)")


def _cmd_matrix(args: argparse.Namespace) -> int:
    import importlib

    require_run_extra("matrix")
    out_dir(
        args.out, "matrix", allow_in_checkout=args.allow_in_checkout
    )  # before torch: a typo costs no time
    matrix = importlib.import_module("ws1_harness.run.matrix")  # lazy: needs torch and the kernels
    return int(matrix.run_matrix(args))


def _cmd_merge(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from ws1_harness.verdict.evidence import refuse_existing, write_evidence_json
    from ws1_harness.verdict.merge import merge

    command = "ws1 " + " ".join(shlex.quote(a) for a in argv)
    # before any work, never one of the shards, and no folder made inside the checkout before a refusal
    out = out_file(args.out, "merge", args.shards, allow_in_checkout=args.allow_in_checkout)
    if not args.force:
        refuse_existing(out, "an evidence file")  # a merge once replaced an unrelated 333 KB file silently
    doc = merge(args.shards, command=command)
    path = write_evidence_json(doc, out, allow_in_checkout=args.allow_in_checkout)
    emit(f"ws1 merge: {len(args.shards)} shards, {doc['counts']['total']} cells -> {path}")
    emit(f"next: ws1 gate {shlex.quote(str(path))}; ws1 report {shlex.quote(str(path))}")
    return 0


def _cmd_gate(args: argparse.Namespace) -> int:
    from ws1_harness.verdict.gate import gate

    result = gate(
        args.file,
        allow_pending_arch=args.allow_pending_arch,
        expect_commit=args.expect_commit,
        require_clean=args.require_clean,
        full=args.full,
        require_chain=args.require_chain,
        expect_profiles=tuple(args.expect or ()),
        contract=args.contract,
        manifest=args.manifest,
    )
    if result.exit_code == EXIT_BAD_INPUT:
        print(result.lines[0], file=sys.stderr)
    else:
        emit("\n".join(result.lines))  # a reader that left (`| head -2`) does not change the verdict
    return result.exit_code


def _cmd_report(args: argparse.Namespace) -> int:
    from ws1_harness.run.bench import is_bench_file, write_bench_report
    from ws1_harness.verdict.gate import GateReferenceError, load_reference, parse_expect, unknown_plan_tier
    from ws1_harness.verdict.report import arch_heatmap_path, write_report

    if args.out is not None:  # its shape now; write_report checks the checkout before it creates the folder
        out_dir(args.out, "report", create=False)
    if is_bench_file(args.file):
        emit(
            f"ws1 report: {write_bench_report(args.file, args.out, allow_in_checkout=args.allow_in_checkout)}"
        )
        return 0
    expects = tuple(args.expect or ())
    plans, problem = parse_expect(expects)
    if problem is None and plans:
        try:
            problem = unknown_plan_tier(plans, load_reference(None, None).manifest.tiers)
        except GateReferenceError as exc:
            problem = str(exc)
    if problem is not None:
        raise UsageError(f"ws1 report: {problem}")
    md, png = write_report(
        args.file, args.out, allow_in_checkout=args.allow_in_checkout, expect_profiles=expects
    )
    per_arch = arch_heatmap_path(png)  # written for a file of two or more arches, removed otherwise
    emit(f"ws1 report: {md} {png}" + (f" {per_arch}" if per_arch.is_file() else ""))
    return 0


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `ws1`. Returns the exit code (also used as the process exit status)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(_attach_dash_values(argv))
        if args.command == "matrix":
            return _cmd_matrix(args)
        if args.command == "merge":
            return _cmd_merge(args, argv)
        if args.command == "gate":
            return _cmd_gate(args)
        if args.command == "report":
            return _cmd_report(args)
        if args.command == "bench":
            require_run_extra("bench")
            from ws1_harness.run.bench.runner import run_cli

            return run_cli(args, argv)
        if args.command == "chain":
            from ws1_harness.chain_args import run_cli as run_chain

            return run_chain(args, argv)
        raise UsageError(f"ws1: unknown command {args.command!r}")  # pragma: no cover
    except SystemExit as exc:  # --help and friends
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_BAD_INPUT)
        return code
    except KeyboardInterrupt:
        print("ws1: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # a print outside `emit` lost its reader: quiet, and the shell's code for SIGPIPE
        silence_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as exc:  # noqa: BLE001 - the CLI contract: one line, exit 2, never a traceback
        if isinstance(exc, _input_errors()):
            print(_one_line(exc), file=sys.stderr)
            return EXIT_BAD_INPUT
        if os.environ.get("WS1_TRACEBACK") == "1":
            traceback.print_exc()
        if _out_of_memory(exc):
            print(
                f"ws1: out of memory: {type(exc).__name__}: {_one_line(exc)} (not a bug in ws1: the run needs "
                "more memory than this device has free; use a larger device, fewer --layers, or fewer commands "
                "at once)",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
        print(
            f"ws1: internal error: {type(exc).__name__}: {_one_line(exc)} "
            "(a bug in ws1; rerun with WS1_TRACEBACK=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT


def _out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is the host or a device running out of memory (torch's `OutOfMemoryError`, looked up only
    when the run side loaded torch). A 36-layer chain on an 80 GB card once ended in "internal error ... a bug in
    ws1", which sent the reader looking for a bug where the card was simply too small."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return isinstance(oom, type) and isinstance(exc, oom)


def _input_errors() -> tuple[type[BaseException], ...]:
    """The error bases of bad input in every ws1 package this process has loaded (never imports torch here)."""
    bases: list[type[BaseException]] = [HarnessError]
    for module, name in (
        ("ws1_contract.errors", "ContractError"),
        ("ws1_workload.errors", "WorkloadError"),
        ("ws1_kernels.errors", "KernelError"),
    ):
        loaded = sys.modules.get(module)
        if loaded is not None:
            bases.append(getattr(loaded, name))
    return tuple(bases)


def _entry() -> None:  # pragma: no cover
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    _entry()
