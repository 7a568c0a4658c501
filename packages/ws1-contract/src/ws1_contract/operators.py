"""The operator spec: one torch-free table of ws1's operators, read by every package.

The source is `manifests/operators.yaml` (this package ships a byte-identical copy in `data/`). It names each
operator's contract class, its inputs with their roles and symbolic shapes, its call signature, its output and
its bench shapes, and the built-in backends. The workload takes its chain nodes and op classes from it, the
kernels' registry its operator names and backends, the harness its adapters and bench shapes, and the gate the
operator classes it judges by: no second list exists to drift.

A plug-in (or a test) may add an operator at run time with `register_operator`; it is then everywhere a
built-in operator is, in this process. The workload fingerprint covers the shipped table only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from .canonical import sha256_fingerprint
from .errors import ContractError

SOURCE_NAME = "operators.yaml"
OP_CLASSES: tuple[str, ...] = ("elementwise", "reduction", "gemm", "attention", "logprob")
ROLES: tuple[str, ...] = ("float", "token_id", "target", "param")
DTYPES: tuple[str, ...] = ("bfloat16", "float32")
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_EXPR = re.compile(r"[A-Za-z0-9_+*() ]+")
_INIT_KEYS = frozenset({"scale", "fan_in", "offset", "order_probe", "no_grad"})


@dataclass(frozen=True)
class InputSpec:
    """One input of an operator: a per-token row (`float`, `token_id`, `target`) or a parameter (`param`).

    `shape` is symbolic: a row's shape for a per-token input, the whole tensor's for a parameter. The init fields
    say how the harness draws it (see the table's header)."""

    name: str
    role: str
    shape: tuple[str, ...] = ()
    scale: float = 1.0
    fan_in: str | None = None
    offset: float = 0.0
    order_probe: bool = False
    no_grad: bool = False

    @property
    def differentiable(self) -> bool:
        """A float input or a parameter whose gradient is judged."""
        return self.role in ("float", "param") and not self.no_grad


@dataclass(frozen=True)
class OperatorSpec:
    """One operator of the spec."""

    name: str
    op_class: str | None
    optional: bool = False
    layout_only: bool = False
    differentiable: bool = True
    inputs: tuple[InputSpec, ...] = ()
    call: tuple[str, ...] = ()
    output_shape: tuple[str, ...] = ()
    output_dtype: str = "bfloat16"
    bench: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @property
    def params(self) -> tuple[InputSpec, ...]:
        return tuple(i for i in self.inputs if i.role == "param")

    @property
    def token_inputs(self) -> tuple[InputSpec, ...]:
        return tuple(i for i in self.inputs if i.role != "param")

    @property
    def has_params(self) -> bool:
        """Whether the operator has a weight (its backends' parameter-gradient rule applies)."""
        return bool(self.params)


@dataclass(frozen=True)
class ProfileEntry:
    """A built-in backend: the module that exports its `BACKEND`, and whether it is the stock baseline."""

    name: str
    backend: str
    stock: bool = False


@dataclass(frozen=True)
class OperatorTable:
    """The parsed spec: symbols, scalars, operators in chain order, built-in profiles."""

    source: str
    document: Mapping[str, Any] = field(repr=False)
    fingerprint: str
    symbols: Mapping[str, str]
    scalars: Mapping[str, str]
    operators: Mapping[str, OperatorSpec]
    profiles: Mapping[str, ProfileEntry]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.operators)

    @property
    def candidate_operators(self) -> tuple[str, ...]:
        """Operators a backend implements (every one but the layout-only helpers)."""
        return tuple(n for n, s in self.operators.items() if not s.layout_only)

    @property
    def param_operators(self) -> frozenset[str]:
        return frozenset(n for n, s in self.operators.items() if s.has_params)

    @property
    def layout_only(self) -> frozenset[str]:
        return frozenset(n for n, s in self.operators.items() if s.layout_only)


def _fail(source: str, where: str, what: str) -> ContractError:
    return ContractError(what, f"{source}: {where}")


def _check_expr(source: str, where: str, value: Any, symbols: Mapping[str, str]) -> str:
    """A shape entry: a symbol, a non-negative integer, or an expression of them with +, * and parentheses."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _fail(source, where, f"a shape entry is a symbol, an integer or an expression, got {value!r}")
    text = str(value)
    if not _EXPR.fullmatch(text):
        raise _fail(source, where, f"bad shape expression {text!r} (symbols, integers, + * and parentheses)")
    unknown = [tok for tok in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text) if tok not in symbols]
    if unknown:
        raise _fail(source, where, f"unknown symbol {unknown[0]!r} (known: {', '.join(symbols)})")
    try:
        evaluate(text, dict.fromkeys(symbols, 1))
    except ContractError as exc:
        raise _fail(source, where, exc.message) from None
    return text


def evaluate(expr: str, widths: Mapping[str, int]) -> int:
    """The integer value of a shape expression under `widths` (symbol -> int). Only + * ( ) and integers."""
    tokens = re.findall(r"\d+|[A-Za-z_][A-Za-z0-9_]*|[+*()]|\S", str(expr))
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise ContractError(f"shape expression {expr!r} ends early")
        pos += 1
        return tokens[pos - 1]

    def atom() -> int:
        tok = take()
        if tok == "(":
            val = total()
            if take() != ")":
                raise ContractError(f"shape expression {expr!r}: unbalanced parenthesis")
            return val
        if tok.isdigit():
            return int(tok)
        if tok in widths:
            return int(widths[tok])
        raise ContractError(f"shape expression {expr!r}: unexpected {tok!r}")

    def product() -> int:
        val = atom()
        while peek() == "*":
            take()
            val *= atom()
        return val

    def total() -> int:
        val = product()
        while peek() == "+":
            take()
            val += product()
        return val

    value = total()
    if pos != len(tokens):
        raise ContractError(f"shape expression {expr!r}: unexpected {tokens[pos]!r}")
    return value


def _parse_input(source: str, where: str, d: Any, symbols: Mapping[str, str]) -> InputSpec:
    if not isinstance(d, Mapping):
        raise _fail(source, where, "an input is a mapping {name, role, shape, init}")
    extra = set(d) - {"name", "role", "shape", "init"}
    if extra:
        raise _fail(source, where, f"unknown key {sorted(extra)[0]!r}")
    name, role = d.get("name"), d.get("role")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _fail(source, where, f"bad input name {name!r}")
    if role not in ROLES:
        raise _fail(source, where, f"role must be one of {', '.join(ROLES)}, got {role!r}")
    shape = d.get("shape", [])
    if not isinstance(shape, list):
        raise _fail(source, f"{where}.shape", "a shape is a list")
    if role in ("token_id", "target") and shape:
        raise _fail(source, f"{where}.shape", f"a {role} input is one id per token: no shape")
    if role == "param" and not shape:
        raise _fail(source, f"{where}.shape", "a parameter needs its shape")
    dims = tuple(_check_expr(source, f"{where}.shape[{i}]", v, symbols) for i, v in enumerate(shape))
    init = d.get("init", {})
    if not isinstance(init, Mapping) or set(init) - _INIT_KEYS:
        raise _fail(source, f"{where}.init", f"init keys are {', '.join(sorted(_INIT_KEYS))}")
    if init and role not in ("float", "param"):
        raise _fail(source, f"{where}.init", f"a {role} input has no init")
    scale, offset = init.get("scale", 1.0), init.get("offset", 0.0)
    for key, val in (("scale", scale), ("offset", offset)):
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            raise _fail(source, f"{where}.init.{key}", f"a number, got {val!r}")
    fan_in = init.get("fan_in")
    if fan_in is not None and fan_in not in symbols:
        raise _fail(source, f"{where}.init.fan_in", f"unknown symbol {fan_in!r}")
    for key in ("order_probe", "no_grad"):
        if not isinstance(init.get(key, False), bool):
            raise _fail(source, f"{where}.init.{key}", "true or false")
    if init.get("order_probe") and (role != "param" or len(dims) != 2):
        raise _fail(source, f"{where}.init.order_probe", "only a [N, K] parameter meets order probes")
    return InputSpec(
        name=name,
        role=role,
        shape=dims,
        scale=float(scale),
        fan_in=fan_in,
        offset=float(offset),
        order_probe=bool(init.get("order_probe", False)),
        no_grad=bool(init.get("no_grad", False)),
    )


def parse_operator(
    source: str, name: str, d: Any, symbols: Mapping[str, str], scalars: Mapping[str, str]
) -> OperatorSpec:
    """One operator entry, checked: what a schema cannot say (call arguments exist, names are unique)."""
    where = f"operators.{name}"
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _fail(source, where, f"bad operator name {name!r}")
    if not isinstance(d, Mapping):
        raise _fail(source, where, "an operator is a mapping")
    known = {"op_class", "optional", "layout_only", "differentiable", "inputs", "call", "output", "bench"}
    extra = set(d) - known
    if extra:
        raise _fail(source, where, f"unknown key {sorted(extra)[0]!r}")
    for key in ("optional", "layout_only", "differentiable"):
        if key in d and not isinstance(d[key], bool):
            raise _fail(source, f"{where}.{key}", "true or false")
    layout_only = bool(d.get("layout_only", False))
    op_class = d.get("op_class")
    if layout_only:
        if op_class is not None or set(d) - {"op_class", "layout_only", "differentiable"}:
            raise _fail(source, where, "a layout-only operator has no class, inputs, call, output or bench")
        return OperatorSpec(name=name, op_class=None, layout_only=True, differentiable=False)
    if op_class not in OP_CLASSES:
        raise _fail(source, f"{where}.op_class", f"one of {', '.join(OP_CLASSES)}, got {op_class!r}")
    raw_inputs = d.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise _fail(source, f"{where}.inputs", "a non-empty list")
    inputs = tuple(_parse_input(source, f"{where}.inputs[{i}]", x, symbols) for i, x in enumerate(raw_inputs))
    names = [i.name for i in inputs]
    if len(set(names)) != len(names):
        raise _fail(source, f"{where}.inputs", "two inputs share a name")
    if sum(i.role == "param" for i in inputs) > 1:
        raise _fail(source, f"{where}.inputs", "at most one parameter (the weight)")
    call = d.get("call")
    if not isinstance(call, list) or not call:
        raise _fail(source, f"{where}.call", "a non-empty list of argument names")
    for i, arg in enumerate(call):
        if arg not in names and arg not in scalars:
            raise _fail(source, f"{where}.call[{i}]", f"{arg!r} is neither an input nor a scalar")
    if set(names) - set(call):
        raise _fail(source, f"{where}.call", f"input {sorted(set(names) - set(call))[0]!r} is never passed")
    out = d.get("output")
    if not isinstance(out, Mapping) or set(out) != {"shape", "dtype"}:
        raise _fail(source, f"{where}.output", "a mapping {shape, dtype}")
    if out["dtype"] not in DTYPES:
        raise _fail(source, f"{where}.output.dtype", f"one of {', '.join(DTYPES)}")
    if not isinstance(out["shape"], list):
        raise _fail(source, f"{where}.output.shape", "a list")
    out_shape = tuple(
        _check_expr(source, f"{where}.output.shape[{i}]", v, symbols) for i, v in enumerate(out["shape"])
    )
    bench = d.get("bench", {})
    if not isinstance(bench, Mapping):
        raise _fail(source, f"{where}.bench", "shape name -> dims")
    parsed_bench: dict[str, Mapping[str, str]] = {}
    for shape_name, dims in bench.items():
        if not isinstance(dims, Mapping) or not dims:
            raise _fail(source, f"{where}.bench.{shape_name}", "dims: a non-empty mapping")
        parsed_bench[str(shape_name)] = MappingProxyType(
            {
                str(k): _check_expr(source, f"{where}.bench.{shape_name}.{k}", v, symbols)
                for k, v in dims.items()
            }
        )
    return OperatorSpec(
        name=name,
        op_class=op_class,
        optional=bool(d.get("optional", False)),
        layout_only=False,
        differentiable=bool(d.get("differentiable", True)),
        inputs=inputs,
        call=tuple(call),
        output_shape=out_shape,
        output_dtype=out["dtype"],
        bench=MappingProxyType(parsed_bench),
    )


def parse_table(doc: Any, source: str) -> OperatorTable:
    """Check a parsed spec document and build the table; ContractError (one line) on the first problem."""
    if not isinstance(doc, Mapping):
        raise _fail(source, "$", "the operator spec is a mapping")
    extra = set(doc) - {"schema_version", "symbols", "scalars", "operators", "profiles"}
    if extra:
        raise _fail(source, "$", f"unknown key {sorted(extra)[0]!r}")
    if doc.get("schema_version") != 1:
        raise _fail(source, "schema_version", f"expected 1, got {doc.get('schema_version')!r}")
    symbols, scalars = doc.get("symbols"), doc.get("scalars")
    for key, table in (("symbols", symbols), ("scalars", scalars)):
        if not isinstance(table, Mapping) or not all(isinstance(v, str) for v in table.values()):
            raise _fail(source, key, "a mapping of name -> model-config field")
    assert isinstance(symbols, Mapping) and isinstance(scalars, Mapping)
    ops_doc = doc.get("operators")
    if not isinstance(ops_doc, Mapping) or not ops_doc:
        raise _fail(source, "operators", "a non-empty mapping")
    operators = {name: parse_operator(source, name, d, symbols, scalars) for name, d in ops_doc.items()}
    prof_doc = doc.get("profiles")
    if not isinstance(prof_doc, Mapping) or not prof_doc:
        raise _fail(source, "profiles", "a non-empty mapping")
    profiles = {}
    for name, p in prof_doc.items():
        where = f"profiles.{name}"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise _fail(source, where, f"bad profile name {name!r}")
        if (
            not isinstance(p, Mapping)
            or set(p) - {"backend", "stock"}
            or not isinstance(p.get("backend"), str)
        ):
            raise _fail(source, where, "a mapping {backend: <module>, stock: <bool>}")
        if not isinstance(p.get("stock", False), bool):
            raise _fail(source, f"{where}.stock", "true or false")
        profiles[name] = ProfileEntry(name=name, backend=p["backend"], stock=bool(p.get("stock", False)))
    return OperatorTable(
        source=source,
        document=MappingProxyType(dict(doc)),
        fingerprint=sha256_fingerprint(doc),
        symbols=MappingProxyType(dict(symbols)),
        scalars=MappingProxyType(dict(scalars)),
        operators=MappingProxyType(operators),
        profiles=MappingProxyType(profiles),
    )


def packaged_path() -> Path:
    return Path(__file__).resolve().parent / "data" / SOURCE_NAME


def read_table(path: str | Path | None = None) -> OperatorTable:
    """Read and check a spec file (None: the shipped one)."""
    p = packaged_path() if path is None else Path(path)
    source = f"<packaged {SOURCE_NAME}>" if path is None else str(p)
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(source, "$", f"cannot read ({type(exc).__name__})") from None
    except yaml.YAMLError as exc:
        raise _fail(source, "$", f"invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    return parse_table(doc, source)


@lru_cache(maxsize=1)
def shipped_table() -> OperatorTable:
    """The shipped spec (read once per process)."""
    return read_table(None)


_PLUGIN_OPERATORS: dict[str, OperatorSpec] = {}


def register_operator(name: str, entry: Mapping[str, Any]) -> OperatorSpec:
    """Add an operator (the same mapping as one entry of `operators:`) to this process's table.

    It must not take a built-in name; registering the same name again replaces the earlier plug-in entry."""
    base = shipped_table()
    if name in base.operators:
        raise ContractError(f"{name!r} is a built-in operator", "register_operator")
    spec = parse_operator("register_operator", name, entry, base.symbols, base.scalars)
    _PLUGIN_OPERATORS[name] = spec
    return spec


def unregister_operator(name: str) -> None:
    """Drop a plug-in operator (tests clean up with it)."""
    _PLUGIN_OPERATORS.pop(name, None)


def plugin_operators() -> Mapping[str, OperatorSpec]:
    return MappingProxyType(dict(_PLUGIN_OPERATORS))


def operators() -> Mapping[str, OperatorSpec]:
    """Every operator of this process: the shipped ones in chain order, then the plug-in ones."""
    return MappingProxyType({**shipped_table().operators, **_PLUGIN_OPERATORS})


def operator(name: str) -> OperatorSpec:
    """One operator's spec; ContractError naming the known ones when it has none."""
    ops = operators()
    if name not in ops:
        raise ContractError(f"unknown operator {name!r} (known: {', '.join(ops)})", "operator spec")
    return ops[name]


def widths(model: Any) -> dict[str, int]:
    """symbol -> width, from a model config (duck-typed: the fields the table's symbols name)."""
    return {sym: int(getattr(model, attr)) for sym, attr in shipped_table().symbols.items()}


def scalar(name: str, model: Any) -> float:
    """The value of a call scalar under a model config."""
    attr = shipped_table().scalars[name]
    if attr == "inv_sqrt_head_dim":
        return 1.0 / math.sqrt(float(model.head_dim))
    return float(getattr(model, attr))


def workload_fingerprint(manifest_doc: Mapping[str, Any]) -> str:
    """The fingerprint of a workload: its manifest document together with the shipped operator spec, since
    the spec's op classes and inputs decide what the manifest's cells mean."""
    return sha256_fingerprint({"manifest": manifest_doc, "operators": dict(shipped_table().document)})
