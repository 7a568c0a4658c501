"""The operator spec (`manifests/operators.yaml`, `ws1_contract.operators`): the one table of operators.

Each check of the loader is fed a broken entry and must refuse it with one line naming where; the shipped table
must load and say what every package takes from it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ws1_contract import ContractError
from ws1_contract import operators as spec


def _doc() -> dict[str, Any]:
    return copy.deepcopy(dict(spec.shipped_table().document))


def test_the_shipped_spec_lists_the_chain_in_order() -> None:
    table = spec.shipped_table()
    assert table.names[:3] == ("embedding", "rms_norm", "qk_norm") and table.names[-1] == "pack"
    assert table.layout_only == {"pack"}
    assert table.param_operators == {"embedding", "rms_norm", "qk_norm", "det_gemm", "lm_head", "linear_logp"}
    assert table.operators["attention"].call == ("q", "k", "v", "scale")
    assert table.operators["linear_logp"].optional and not table.operators["logp"].optional


def test_a_parameter_draw_is_read_from_the_spec() -> None:
    weight = spec.shipped_table().operators["det_gemm"].params[0]
    assert (weight.shape, weight.fan_in, weight.order_probe) == (("H", "F"), "F", True)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda d: d["operators"]["silu"]["inputs"][0].update(role="weights"), "role must be"),
        (lambda d: d["operators"]["silu"].update(call=["x", "gamma"]), "neither an input nor a scalar"),
        (lambda d: d["operators"]["swiglu"].update(call=["gate"]), "never passed"),
        (lambda d: d["operators"]["silu"]["inputs"][0].update(shape=["Q"]), "unknown symbol 'Q'"),
        (lambda d: d["operators"]["silu"]["inputs"][0].update(shape=["F-1"]), "bad shape expression"),
        (lambda d: d["operators"]["silu"]["inputs"][0].update(shape=["(F"]), "ends early"),
        (
            lambda d: d["operators"]["rms_norm"]["inputs"][1]["init"].update(order_probe=True),
            "order probes",
        ),
        (lambda d: d["operators"]["pack"].update(call=["x"]), "layout-only"),
        (lambda d: d["operators"]["swiglu"]["inputs"][1].update(name="gate"), "share a name"),
        (
            lambda d: d["operators"]["det_gemm"]["inputs"].append(
                {"name": "w2", "role": "param", "shape": ["H"]}
            ),
            "at most one parameter",
        ),
        (lambda d: d["operators"]["silu"].update(flavour="x"), "unknown key 'flavour'"),
        (lambda d: d["operators"]["silu"]["output"].update(dtype="float16"), "output.dtype"),
        (lambda d: d["operators"]["silu"].update(op_class="convolution"), "op_class"),
        (lambda d: d["operators"]["logp"]["inputs"][1].update(shape=["V"]), "no shape"),
        (lambda d: d["profiles"]["native_torch"].update(stock="yes"), "stock"),
        (lambda d: d.update(schema_version=2), "schema_version"),
    ],
    ids=[
        "role",
        "call-arg",
        "unpassed-input",
        "symbol",
        "minus",
        "paren",
        "order-probe-1d",
        "layout-only-call",
        "dup-input",
        "two-params",
        "unknown-key",
        "dtype",
        "op-class",
        "id-shape",
        "stock-flag",
        "schema-version",
    ],
)
def test_a_broken_entry_is_refused_in_one_line(edit, needle: str) -> None:
    doc = _doc()
    edit(doc)
    with pytest.raises(ContractError) as info:
        spec.parse_table(doc, "ops.yaml")
    text = str(info.value)
    assert "\n" not in text and text.startswith("ops.yaml: ") and needle in text, text


def test_the_unbroken_copy_parses() -> None:
    """The control of the test above: the same copy, unedited, is accepted."""
    assert spec.parse_table(_doc(), "ops.yaml").names == spec.shipped_table().names


@pytest.mark.parametrize(
    ("expr", "value"), [("H", 4096), ("(Hq+2*Hkv)*D", 6144), ("2*F", 24576), ("Hq*D+1", 4097), ("7", 7)]
)
def test_shape_expressions_evaluate(expr: str, value: int) -> None:
    widths = {"H": 4096, "Hq": 32, "Hkv": 8, "D": 128, "F": 12288}
    assert spec.evaluate(expr, widths) == value


@pytest.mark.parametrize("expr", ["H*", "(H", "H)", "H H", "Z"])
def test_a_malformed_expression_raises(expr: str) -> None:
    with pytest.raises(ContractError):
        spec.evaluate(expr, {"H": 2})


def test_a_registered_operator_is_everywhere_a_builtin_is() -> None:
    entry = {
        "op_class": "elementwise",
        "inputs": [{"name": "x", "role": "float", "shape": ["H"]}],
        "call": ["x"],
        "output": {"shape": ["H"], "dtype": "bfloat16"},
    }
    try:
        spec.register_operator("toy_double", entry)
        assert spec.operators()["toy_double"].op_class == "elementwise"
        assert tuple(spec.operators())[-1] == "toy_double"
        assert "toy_double" not in spec.shipped_table().operators  # the shipped table is untouched
    finally:
        spec.unregister_operator("toy_double")
    assert "toy_double" not in spec.operators()


def test_a_plugin_cannot_take_a_builtin_name() -> None:
    with pytest.raises(ContractError, match="built-in"):
        spec.register_operator("silu", {})


def test_the_workload_fingerprint_covers_the_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    manifest_doc = {"revision": 1}
    before = spec.workload_fingerprint(manifest_doc)
    doc = _doc()
    doc["operators"]["silu"]["op_class"] = "reduction"
    monkeypatch.setattr(spec, "shipped_table", lambda: spec.parse_table(doc, "edited"))
    assert spec.workload_fingerprint(manifest_doc) != before
