#!/usr/bin/env python3
"""Generate the field tables of a JSON Schema as Markdown, and keep a document's copy of them current.

Why: a hand-written field table drifts from the schema it describes. This script renders one table per
object (the top level and every `$defs` entry) from the schema itself, and replaces the text between
`<!-- schema-table:begin -->` and `<!-- schema-table:end -->` in a Markdown file.

    python ci/schema_doc.py contracts/evidence.schema.json                      # print the tables
    python ci/schema_doc.py contracts/evidence.schema.json --write docs/evidence.md
    python ci/schema_doc.py contracts/evidence.schema.json --check docs/evidence.md   # exit 1 if stale

Standard library only. Exit 2 with one line on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

BEGIN = "<!-- schema-table:begin -->"
END = "<!-- schema-table:end -->"


def _type_of(node: dict[str, Any]) -> str:
    """A short human rendering of a property's type."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{name})"
    if "const" in node:
        return f"const `{json.dumps(node['const'])}`"
    if "enum" in node:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    if "oneOf" in node:
        return " or ".join(_type_of(n) for n in node["oneOf"])
    t = node.get("type", "any")
    text = " or ".join(t) if isinstance(t, list) else t
    if t == "array" and isinstance(node.get("items"), dict):
        text = f"array of {_type_of(node['items'])}"
    if t == "object" and "properties" in node and "title" in node:
        text = f"[object](#{node['title']})"
    if t == "object" and isinstance(node.get("additionalProperties"), dict):
        text = f"object of {_type_of(node['additionalProperties'])}"
    if "pattern" in node:
        text += f" matching `{node['pattern']}`"
    if "minimum" in node:
        text += f", >= {node['minimum']}"
    return text


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _titled(node: dict[str, Any]) -> dict[str, Any]:
    """Give inline object properties a title (their field name) so the parent table can link to them."""
    props = {
        name: ({**sub, "title": name} if sub.get("type") == "object" and "properties" in sub else sub)
        for name, sub in node.get("properties", {}).items()
    }
    return {**node, "properties": props} if props else node


def _table(title: str, node: dict[str, Any]) -> list[str]:
    node = _titled(node)
    props = node.get("properties", {})
    required = set(node.get("required", []))
    closed = node.get("additionalProperties") is False
    lines = [f"### {title}", ""]
    if node.get("description"):
        lines += [node["description"], ""]
    if not props:
        lines += [f"Type: {_cell(_type_of(node))}.", ""]
        return lines
    lines += [
        f"Additional properties: {'refused' if closed else 'allowed'}.",
        "",
        "| field | type | required | meaning |",
        "|---|---|---|---|",
    ]
    for name, sub in props.items():
        lines.append(
            f"| `{name}` | {_cell(_type_of(sub))} | {'yes' if name in required else 'no'} | "
            f"{_cell(sub.get('description', ''))} |"
        )
    lines.append("")
    for name, sub in props.items():
        if sub.get("type") == "object" and "properties" in sub:
            lines += _table(name, sub)
    return lines


def render(schema: dict[str, Any]) -> str:
    lines = ["_Generated from the schema by `ci/schema_doc.py`; do not edit by hand._", ""]
    lines += _table("top level", schema)
    for name, node in schema.get("$defs", {}).items():
        lines += _table(name, node)
    return "\n".join(lines).rstrip() + "\n"


def splice(doc_text: str, tables: str, where: str) -> str:
    if BEGIN not in doc_text or END not in doc_text:
        raise ValueError(f"{where}: markers {BEGIN} / {END} not found")
    head, rest = doc_text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{tables}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("schema")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="MARKDOWN")
    group.add_argument("--check", metavar="MARKDOWN")
    args = parser.parse_args(argv)
    try:
        schema = json.loads(Path(args.schema).read_text(encoding="utf-8"))
        tables = render(schema)
        target = args.write or args.check
        if target is None:
            sys.stdout.write(tables)
            return 0
        current = Path(target).read_text(encoding="utf-8")
        updated = splice(current, tables, target)
    except (OSError, ValueError) as exc:
        print(f"schema_doc: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    if args.write:
        if updated != current:
            Path(target).write_text(updated, encoding="utf-8")
        return 0
    if updated != current:
        print(
            f"schema_doc: {target} is stale; run: python ci/schema_doc.py {args.schema} --write {target}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
