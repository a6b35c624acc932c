"""No import cycle in ``gateway/``, and the command line on top: nothing imports ``gateway.commands`` but
``gateway/__main__.py``.

Every import counts, wherever it is written (inside a function, under ``if TYPE_CHECKING:``): a cycle
hidden in a function is still one that the first caller can trip over, and one kept to type checking is
still two modules that each need the other. Importing ``a.b.c`` runs ``a/__init__.py`` and
``a/b/__init__.py`` first, so a module depends on the packages above whatever it imports too, except on
its own packages: those are being imported already when it runs, which is what lets a package's
``__init__`` re-export its private modules (``store/__init__.py`` over ``store/_store.py``, which
imports ``store/_driver.py``) without that being a cycle. AST only; nothing is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gateway"


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module under the package directory ``root``."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imports_of(module: str, path: Path, modules: Iterable[str]) -> set[str]:
    """The modules of ``modules`` that importing ``module`` (at ``path``) runs, directly."""
    known = set(modules)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            targets.add(base)
            # ``from pkg import sub`` imports the submodule ``pkg.sub`` when there is one.
            targets.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known)
    out: set[str] = set()
    for target in targets:
        resolved = resolve(target)
        if resolved is None:
            continue  # not one of ours
        out.update(m for m in (resolved, *_ancestors(resolved)) if m in known)
    # Its own packages are being imported when it runs, and it does not import itself.
    return out - {module, *_ancestors(module)}


def import_graph(root: Path) -> dict[str, set[str]]:
    files = module_files(root)
    return {m: imports_of(m, p, files) for m, p in files.items()}


def components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan): each is a set of modules that
    all import one another, directly or not."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each component, as the modules in import order, the first repeated at the end."""
    return [_cycle_in(graph, component) for component in components(graph)]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth first, inside the component)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def test_gateway_has_no_import_cycle() -> None:
    graph = import_graph(PACKAGE)
    lines = []
    for component in components(graph):
        cycle = _cycle_in(graph, component)
        rest = sorted(component - set(cycle))
        lines.append(" -> ".join(cycle) + (f" (and through {', '.join(rest)})" if rest else ""))
    assert not lines, "import cycles:\n" + "\n".join(lines)


def test_only_main_imports_the_command_line() -> None:
    graph = import_graph(PACKAGE)
    importers = {
        m
        for m, targets in graph.items()
        if any(t == "gateway.commands" or t.startswith("gateway.commands.") for t in targets)
        and m != "gateway.commands"
        and not m.startswith("gateway.commands.")
    }
    assert importers == {"gateway.__main__"}, f"gateway.commands is imported by {sorted(importers)}"


# -- the walker itself, on a made-up package -------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_the_walker_sees_function_level_relative_and_type_checking_imports(tmp_path: Path) -> None:
    pkg = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "def f():\n    from pkg.b import x\n",
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\nx = 1\n",
            "pkg/c.py": "from .a import f\n",
            "pkg/d.py": "import pkg.a\n",
        },
    )
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_a_package_init_counts_for_whoever_imports_its_modules(tmp_path: Path) -> None:
    pkg = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/ext.py": "from pkg.sub.inner import y\n",
            "pkg/sub/__init__.py": "from pkg.sub.other import z\nfrom pkg.sub.inner import y\n",
            "pkg/sub/inner.py": "from pkg.sub.sibling import w\ny = 1\n",  # its own package: no cycle
            "pkg/sub/sibling.py": "w = 1\n",
            "pkg/sub/other.py": "def g():\n    import pkg.ext\nz = 1\n",
        },
    )
    assert cycles(import_graph(pkg)) == [["pkg.ext", "pkg.sub", "pkg.sub.other", "pkg.ext"]]
