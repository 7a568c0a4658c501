"""`ws1-contract`: validate, resolve and fingerprint the numerical contract from the command line.

Exit codes: 0 success; 2 bad input of any kind (missing file, bad JSON, schema or semantic violation, unknown
name, bad usage), reported as exactly one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from .console import quiet_broken_pipe
from .contract import Contract, load_contract
from .errors import ContractError

PROG = "ws1-contract"
EXIT_OK = 0
EXIT_BAD_INPUT = 2


class _UsageError(Exception):
    """argparse's complaint, turned into an exception so it prints as one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: error: {message} (see {PROG} --help)")


def _build_parser() -> _Parser:
    parser = _Parser(prog=PROG, description="Validate, resolve and fingerprint the ws1 tolerance contract.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser("validate", help="validate a contract (default: the shipped one)")
    validate.add_argument("file", nargs="?", default=None, metavar="FILE")

    resolve = commands.add_parser(
        "resolve", help="print the rule of one (judgment, op class, dtype) cell as JSON"
    )
    resolve.add_argument("--judgment", required=True)
    resolve.add_argument("--op-class", required=True, dest="op_class")
    resolve.add_argument("--dtype", required=True)
    resolve.add_argument("--arch", default=None)
    resolve.add_argument("--contract", default=None, metavar="FILE")

    fingerprint = commands.add_parser("fingerprint", help="print the contract's sha256 fingerprint")
    fingerprint.add_argument("file", nargs="?", default=None, metavar="FILE")
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "validate":
        contract: Contract = load_contract(args.file)
        print(
            f"{contract.source}: valid ({contract.contract_id} revision {contract.revision}, {contract.fingerprint})"
        )
    elif args.command == "resolve":
        contract = load_contract(args.contract)
        spec = contract.resolve(args.judgment, args.op_class, args.dtype, arch=args.arch)
        out = spec.to_json()
        out["arch"] = args.arch
        out["contract_fingerprint"] = contract.fingerprint
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print(load_contract(args.file).fingerprint)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `ws1-contract` and `python -m ws1_contract`; returns the exit code."""
    try:
        args = _build_parser().parse_args(argv)
        return _run(args)
    except _UsageError as exc:
        print(" ".join(str(exc).split()), file=sys.stderr)
        return EXIT_BAD_INPUT
    except ContractError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # the reader left (`| head -1`): quiet, never a traceback
        return quiet_broken_pipe()


if __name__ == "__main__":  # pragma: no cover - `python -m ws1_contract.cli`
    sys.exit(main())
