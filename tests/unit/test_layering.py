"""The planes meet only at the snapshot: nothing in the data plane imports the control plane."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "gateway"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted((PACKAGE / "dataplane").rglob("*.py")), ids=lambda p: p.name)
def test_dataplane_never_imports_controlplane(path: Path) -> None:
    bad = {m for m in imported_modules(path) if m.startswith("gateway.controlplane")}
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "protocol").rglob("*.py")), ids=lambda p: p.name)
def test_protocol_code_is_sans_io(path: Path) -> None:
    io_modules = {"socket", "asyncio", "aiohttp", "httpx", "sqlite3", "psycopg", "granian", "subprocess"}
    bad = {m for m in imported_modules(path) if m.split(".")[0] in io_modules}
    assert not bad, f"{path.name} imports {bad}"
