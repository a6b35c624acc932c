"""How the mock engine behaves in a tool-using conversation, the way a model would: offered tools and
asked something, it calls one; handed the tool's result, it answers in text. So a coding agent (Claude
Code, Codex) pointed at the demo runs one tool and then ends on its own. Sans-I/O: values in, values out.

Which tool: the first of the request's tools whose name is one of ``HARMLESS`` (case aside) in that order
(listing and reading before running a shell command), else the request's first tool. A forced choice (a
named tool, Anthropic's ``any``, OpenAI's ``required``) is obeyed even after a tool result, as a model
must; ``none`` never calls.

Arguments: every ``required`` property of the tool's JSON schema gets a value of its type, chosen by the
property's name where it has an obvious harmless one (``command`` -> ``ls``, ``file_path`` -> ``.``,
``pattern`` -> ``*``); enums take their first value, numbers their minimum or 1, booleans false, nested
objects their own required properties. Optional properties are left out, so the call is valid for the
schemas agents send as far as their required fields go.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = ["HARMLESS", "arguments_for", "choose_tool"]

HARMLESS: Final = (
    "ls",
    "list_dir",
    "list_directory",
    "glob",
    "bash",
    "shell",
    "exec_command",
    "local_shell",
    "read",
    "read_file",
)
# Strings by property name: what an agent's listing or reading tool is safe to run with.
_STRINGS: Final = {
    "command": "ls",
    "cmd": "ls",
    "file_path": ".",
    "path": ".",
    "dir_path": ".",
    "directory": ".",
    "pattern": "*",
    "glob": "*",
    "query": "mock",
}
_DEPTH: Final = 4


def choose_tool(tools: Sequence[tuple[str, Mapping[str, Any] | None]]) -> tuple[str, dict[str, Any]]:
    """The tool to call among ``(name, JSON schema)`` pairs (at least one), and its arguments."""
    first: dict[str, tuple[str, Mapping[str, Any] | None]] = {}
    for name, schema in tools:
        first.setdefault(name.lower(), (name, schema))
    for wanted in HARMLESS:
        if wanted in first:
            name, schema = first[wanted]
            return name, arguments_for(schema)
    name, schema = tools[0]
    return name, arguments_for(schema)


def arguments_for(schema: Mapping[str, Any] | None, depth: int = 0) -> dict[str, Any]:
    """Values for the required properties of an object schema (none for anything else)."""
    if not isinstance(schema, Mapping):
        return {}
    properties = schema.get("properties")
    required = schema.get("required")
    if not isinstance(properties, Mapping) or not isinstance(required, list):
        return {}
    out: dict[str, Any] = {}
    for key in required:
        if isinstance(key, str):
            prop = properties.get(key)
            out[key] = _value(key, prop if isinstance(prop, Mapping) else {}, depth)
    return out


def _value(name: str, schema: Mapping[str, Any], depth: int) -> Any:
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind is None:
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options and isinstance(options[0], Mapping):
                return _value(name, options[0], depth)
    if kind in ("integer", "number"):
        low = schema.get("minimum")
        return low if isinstance(low, int | float) and not isinstance(low, bool) else 1
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    if kind == "array":
        items = schema.get("items")
        items = items if isinstance(items, Mapping) else {}
        if name in ("command", "cmd") and items.get("type") == "string":
            return ["ls"]
        least = schema.get("minItems")
        count = least if isinstance(least, int) and not isinstance(least, bool) and least > 0 else 0
        return [_value(name, items, depth + 1) for _ in range(min(count, 3))]
    if kind == "object":
        return arguments_for(schema, depth + 1) if depth < _DEPTH else {}
    return _STRINGS.get(name.lower(), "mock")
