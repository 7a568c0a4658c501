"""The gate's re-judgment of `ws1 chain` cells from their own records (docs/gate.md, "Chain cells"). No torch.

A chain cell (ws1_harness.verdict.chain_record.ChainCell, in an evidence file's `chain_cells`) stores a status, the
judgments that failed and each judgment's `passed`; like a matrix cell's, none of them is taken on trust. Each
judgment is derived again from the figures it records, against the contract and manifest the gate is given:

- parity: one row per training layout of the manifest (no more, no fewer), each over at least one scored token,
  with equal raw bits and the contract's chain aggregates `max_abs_dlogp`, `approx_kl0`, `clipfrac0` exactly
  zero (a row that claims equal bits with a non-zero aggregate contradicts itself);
- logprob accuracy: each chain aggregate present and within the contract's chain threshold for the cell's dtype;
- gradient invariance: one row per training layout other than the packed one, each a raw-bits-equal flag per
  parameter, every flag true, the same parameters in every row;
- gradient accuracy: one row per parameter (the parameters gradient invariance flags), each passing iff its
  gradient is finite and its `rel_l2` and `rel_max_abs` are within the contract's chain gradient thresholds
  (`grad_rel_l2`, `grad_rel_max_abs`), which the cell must record as the contract's;
- op watch: gated unless the profile is a stock baseline (the manifest's `device: any` profile, not the cell's
  word); passes when it watched at least one node and found no problem.

The thresholds a cell records must be the contract's; its status must be green exactly when every gated
judgment passes, `failed` must list the others, and a red cell must carry its first divergence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ws1_harness.verdict.chain_record import JUDGMENTS, gradient_thresholds_record, thresholds_record
from ws1_harness.verdict.evidence import chain_label
from ws1_harness.verdict.rejudge import GateReference, GateReferenceError

#: the judgments gated for every profile; op_watch is gated unless the profile is a stock baseline
ALWAYS_GATED = ("parity", "logprob_accuracy", "gradient_invariance", "gradient_accuracy")
AGGREGATES = ("max_abs_dlogp", "approx_kl0", "clipfrac0")
GRADIENT_FIGURES = ("rel_l2", "rel_max_abs")


@dataclass(frozen=True)
class ChainRejudged:
    """What a chain cell's records imply: faults (records contradicting themselves, the contract or the
    manifest), the status and the failed gated judgments derived from the figures."""

    faults: tuple[str, ...]
    status: str
    failed: tuple[str, ...]


def contract_thresholds(ref: GateReference, dtype: str) -> dict[str, Any]:
    """The chain thresholds of the gate's contract, in the shape a chain cell records them."""
    return thresholds_record(_aggregates(ref, dtype))


def contract_gradient_thresholds(ref: GateReference, dtype: str) -> dict[str, Any]:
    """The chain gradient thresholds of the gate's contract, in the shape a chain cell records them."""
    return gradient_thresholds_record(_aggregates(ref, dtype))


def _aggregates(ref: GateReference, dtype: str) -> Any:
    from ws1_contract import ContractError

    try:
        return ref.contract.aggregates(dtype)
    except ContractError as exc:
        raise GateReferenceError(str(exc)) from None


def _within(row: Mapping[str, Any], th: Mapping[str, Any]) -> bool | None:
    """Each aggregate within the contract's threshold; None when the row has no aggregates."""
    if any(row.get(a) is None for a in AGGREGATES):
        return None
    return all(row[a] <= th[a] for a in AGGREGATES)


def _aggregate_faults(where: str, row: Mapping[str, Any], th: Mapping[str, Any], tokens: int) -> list[str]:
    out = []
    if row["tokens"] != tokens:
        out.append(f"{where}: compares {row['tokens']} tokens, the cell has {tokens} active tokens")
    within = _within(row, th)
    # the writer records the flag wherever it measured the aggregates: absent there, or present without them, the
    # row was edited
    if (within is not None or "within_contract" in row) and row.get("within_contract") != bool(within):
        out.append(
            f"{where}: within_contract={row.get('within_contract', 'absent')} but its aggregates say {bool(within)}"
        )
    return out


def _parity(
    detail: Mapping[str, Any], th: Mapping[str, Any], want: frozenset[str], tokens: int
) -> tuple[bool, list[str]]:
    faults: list[str] = []
    rows = detail["layouts"]
    if set(rows) != want:
        faults.append(
            f"parity: layouts {sorted(rows)} are not the manifest's training layouts {sorted(want)}"
        )
    passed = bool(rows)
    for name, row in rows.items():
        where = f"parity/{name}"
        faults += _aggregate_faults(where, row, th, tokens)
        zero = _within(row, th) is not None and all(row[a] == 0 for a in AGGREGATES)
        if row.get("bitwise_equal") is True and not zero:
            faults.append(f"{where}: records equal bits with a non-zero aggregate")
        ok = row["tokens"] >= 1 and row.get("bitwise_equal") is True and zero
        if row["passed"] != ok:
            faults.append(f"{where}: records passed={row['passed']} but its figures say {ok}")
        passed = passed and ok
    return passed, faults


def _accuracy(detail: Mapping[str, Any], th: Mapping[str, Any], tokens: int) -> tuple[bool, list[str]]:
    faults = _aggregate_faults("logprob_accuracy", detail, th, tokens)
    ok = detail["tokens"] >= 1 and bool(_within(detail, th))
    if detail["passed"] != ok:
        faults.append(f"logprob_accuracy: records passed={detail['passed']} but its aggregates say {ok}")
    return ok, faults


def _invariance(detail: Mapping[str, Any], want: frozenset[str]) -> tuple[bool, list[str], frozenset[str]]:
    faults: list[str] = []
    rows = detail["layouts"]
    if set(rows) != want:
        faults.append(
            f"gradient_invariance: layouts {sorted(rows)} are not the manifest's training layouts other than "
            f"the packed one {sorted(want)}"
        )
    names = [frozenset(r["bits_equal"]) for r in rows.values()]
    params = names[0] if names else frozenset()
    if any(n != params for n in names):
        faults.append("gradient_invariance: the layouts flag different parameters")
    ok = bool(rows) and bool(params) and all(all(r["bits_equal"].values()) for r in rows.values())
    return ok, faults, params


def _grad_accuracy(
    detail: Mapping[str, Any], ref: GateReference, gth: Mapping[str, Any]
) -> tuple[bool, list[str], frozenset[str]]:
    faults: list[str] = []
    if dict(detail.get("thresholds") or {}) != dict(gth):
        faults.append(
            f"gradient_accuracy: recorded thresholds are not the contract's chain gradient thresholds "
            f"({gth['dtype']})"
        )
    l2, mx = gth["grad_rel_l2"], gth["grad_rel_max_abs"]
    params = detail["parameters"]
    ok = bool(params) and l2 is not None and mx is not None
    for name, p in params.items():
        where = f"gradient_accuracy/{name}"
        if p["operator"] not in ref.manifest.operators:
            faults.append(f"{where}: operator {p['operator']!r} is not in the manifest")
        figures = [p.get(f) for f in GRADIENT_FIGURES]
        measured = p.get("finite") is True and all(isinstance(f, (int, float)) for f in figures)
        passed = bool(
            measured and l2 is not None and mx is not None and figures[0] <= l2 and figures[1] <= mx
        )
        if p["passed"] != passed:
            faults.append(f"{where}: records passed={p['passed']} but its figures say {passed}")
        ok = ok and passed
    failing = [name for name, p in params.items() if not p["passed"]]
    if detail.get("failed") != failing[:8] or detail.get("n_failed") != len(failing):
        faults.append(
            f"gradient_accuracy: records failed={detail.get('failed')} (n_failed={detail.get('n_failed')}) but its "
            f"parameters say {failing[:8]} ({len(failing)})"
        )
    return ok, faults, frozenset(params)


def rejudge_chain(raw: Mapping[str, Any], ref: GateReference) -> ChainRejudged:
    """Derive a chain cell's verdict from its figures alone (and the gate's contract and manifest)."""
    faults: list[str] = []
    man = ref.manifest
    base = raw["profile"].split("@", 1)[0]
    stock = base in man.stock_profiles
    if raw["stock"] != stock:
        faults.append(f"records stock={raw['stock']} but the manifest makes it {stock}")
    if raw["model"] not in man.model_layers:
        faults.append(f"model {raw['model']!r} is not in the manifest")
    elif raw["layers"] > man.model_layers[raw["model"]]:
        faults.append(
            f"{raw['layers']} layers but model {raw['model']!r} has {man.model_layers[raw['model']]}"
        )
    if raw["tier"] not in man.tiers:
        faults.append(f"tier {raw['tier']!r} is not in the manifest")
    if raw["dtype"] != ref.dtype:
        faults.append(f"dtype {raw['dtype']} is not the contract's execution dtype {ref.dtype}")
    try:
        th = contract_thresholds(ref, ref.dtype)
        gth = contract_gradient_thresholds(ref, ref.dtype)
    except GateReferenceError as exc:
        return ChainRejudged((*faults, str(exc)), "red", ("parity",))
    names = [j["name"] for j in raw["judgments"]]
    if tuple(names) != JUDGMENTS:
        faults.append(f"judgments {names} are not {list(JUDGMENTS)}")
    by_name = {j["name"]: j for j in raw["judgments"]}
    training = frozenset(lay.name for lay in man.layouts if lay.kind == "training")
    tokens = raw["active_tokens"]
    derived: dict[str, bool] = {}
    inv_params = acc_params = frozenset[str]()
    for name, j in by_name.items():
        detail = j["detail"]
        if name != "gradient_accuracy" and "thresholds" in detail and dict(detail["thresholds"]) != th:
            faults.append(
                f"{name}: recorded thresholds are not the contract's chain thresholds ({th['dtype']})"
            )
        if name == "parity":
            derived[name], more = _parity(detail, th, training, tokens)
        elif name == "logprob_accuracy":
            derived[name], more = _accuracy(detail, th, tokens)
        elif name == "gradient_invariance":
            derived[name], more, inv_params = _invariance(detail, training - {man.canonical})
        elif name == "gradient_accuracy":
            derived[name], more, acc_params = _grad_accuracy(detail, ref, gth)
        else:  # op_watch
            derived[name] = detail["nodes_watched"] >= 1 and not detail["problems"]
            more = []
        faults += more
        if j["passed"] != derived[name]:
            faults.append(f"{name}: records passed={j['passed']} but its figures say {derived[name]}")
        gated = name in ALWAYS_GATED or (name == "op_watch" and not stock)
        if j["judged"] != gated:
            faults.append(f"{name}: records judged={j['judged']} but the gate judges it: {gated}")
    if inv_params and acc_params and inv_params != acc_params:
        faults.append("gradient_invariance and gradient_accuracy name different parameters")
    gated_names = [n for n in JUDGMENTS if n in ALWAYS_GATED or (n == "op_watch" and not stock)]
    failed = tuple(n for n in gated_names if not derived.get(n, False))
    return ChainRejudged(tuple(faults), "red" if failed else "green", failed)


def chain_disagreement(raw: Mapping[str, Any], ref: GateReference) -> str | None:
    """Why a chain cell's stored verdict disagrees with what its records imply; None when they agree."""
    got = rejudge_chain(raw, ref)
    stored = f"stored {raw['status']}" + (f" ({', '.join(raw['failed'])})" if raw["failed"] else "")
    if got.faults:
        return (
            f"{stored} but its records contradict themselves, the contract or the manifest: {got.faults[0]}"
        )
    if raw["status"] != got.status or tuple(raw["failed"]) != got.failed:
        said = got.status + (f" ({', '.join(got.failed)})" if got.failed else "")
        return f"{stored} but its records say {said}"
    if (raw["first_divergence"] is None) != (got.status == "green"):
        return f"{stored} but {'records' if got.status == 'green' else 'lacks'} a first divergence"
    return None


def divergence_text(raw: Mapping[str, Any]) -> str:
    """`first divergence: <node> (<operator>, layer L, <phase>) at token (s, p)`, or the cell's note."""
    d = raw.get("first_divergence")
    if not d:
        return ""
    if not d.get("node"):
        return f"{d.get('judgment')}: {d.get('note', 'not localised')}"
    token = d.get("token")
    at = f" at token ({token[0]}, {token[1]})" if isinstance(token, list) and len(token) == 2 else ""
    return (
        f"{d.get('judgment')}: first divergence {d['node']} ({d.get('operator')}, layer {d.get('layer')}, "
        f"{d.get('phase')}){at}, {d.get('left')} vs {d.get('right')}"
    )


def missing_tiers(chain_cells: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per `ws1 chain` run whose file lacks a tier the run's own settings name.

    The cells of one run (profile, model, layers, seed and tier list alike) must be exactly the tiers it says it
    ran: otherwise a red tier's cell could be deleted (and the digest recomputed) and the rest would pass."""
    runs: dict[tuple[Any, ...], set[str]] = {}
    for c in chain_cells:
        settings = c.get("settings") or {}
        key = (
            c["profile"],
            c["model"],
            c["layers"],
            settings.get("seed"),
            tuple(settings.get("tiers") or ()),
        )
        runs.setdefault(key, set()).add(c["tier"])
    out = []
    for (profile, model, layers, _seed, tiers), have in sorted(runs.items(), key=lambda kv: str(kv[0])):
        lacking = [t for t in tiers if t not in have]
        if not tiers or lacking or not have <= set(tiers):
            out.append(
                f"chain {profile}/{model}/L{layers}: the run names tiers {list(tiers)}, the file holds "
                f"{sorted(have)}"
            )
    return out


def chain_gaps(doc: Mapping[str, Any], ref: GateReference) -> list[str]:
    """Chain cells short of the full model (another model's widths, or fewer layers): the reduced label."""
    short = sorted(
        {
            f"{c['model']} L{c['layers']}"
            for c in doc["chain_cells"]
            if c["model"] not in ref.manifest.full_models
            or c["layers"] < ref.manifest.model_layers.get(c["model"], c["layers"])
        }
    )
    return [f"chain {', '.join(short)}"] if short else []


__all__ = [
    "ChainRejudged",
    "chain_disagreement",
    "chain_gaps",
    "chain_label",
    "contract_gradient_thresholds",
    "contract_thresholds",
    "divergence_text",
    "missing_tiers",
    "rejudge_chain",
]
