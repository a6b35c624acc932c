"""No two classes in ``gateway/`` share a name, and every ``GatewayError`` subclass is in ``errors.py``.

Two ``UpstreamTimeout``s (one a transport error, one the 504 a client gets) or two ``Decision``s (a bucket's
and a route's) make a reader, a grep and a traceback ask which one is meant; an import of the wrong one
type-checks when both have the same shape. Every class counts, private and nested ones too: the rule is
about names as a reader meets them. The errors a client can meet are read in one place: a class anywhere
else whose base is a ``GatewayError`` (by name, which the first rule makes unambiguous) fails the second
test. AST only; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gateway"


def class_names(root: Path) -> dict[str, list[str]]:
    """Class name -> where each class of that name is defined (``path:line``, relative to ``root``'s
    parent), for every class under ``root``."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root.parent)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(f"{where}:{node.lineno}")
    return found


def classes_outside(root: Path, module: Path, ancestor: str) -> list[str]:
    """Classes derived from ``ancestor`` (by base name, transitively) that are defined outside ``module``:
    ``name (path:line)`` each."""
    bases: dict[str, set[str]] = {}
    places: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root.parent)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                names = {ast.unparse(b).rpartition(".")[2] for b in node.bases}
                bases.setdefault(node.name, set()).update(names)
                if path != module:
                    places.setdefault(node.name, []).append(f"{where}:{node.lineno}")

    def derived(name: str, seen: frozenset[str] = frozenset()) -> bool:
        return name == ancestor or any(derived(b, seen | {name}) for b in bases.get(name, set()) - seen)

    return [
        f"{name} ({p})" for name in sorted(places) if name != ancestor and derived(name) for p in places[name]
    ]


def shared_names(root: Path) -> dict[str, list[str]]:
    return {name: places for name, places in class_names(root).items() if len(places) > 1}


def test_no_two_classes_share_a_name() -> None:
    shared = shared_names(PACKAGE)
    lines = [f"{name}: {', '.join(places)}" for name, places in sorted(shared.items())]
    assert not lines, "classes sharing a name (rename one of each):\n" + "\n".join(lines)


def test_every_gateway_error_is_in_errors_py() -> None:
    strays = classes_outside(PACKAGE, PACKAGE / "errors.py", "GatewayError")
    assert not strays, "GatewayError subclasses outside gateway/errors.py:\n" + "\n".join(strays)


def test_the_walker_finds_private_and_nested_classes_of_one_name(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("class _Pool:\n    pass\n\n\nclass Route:\n    pass\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    class _Pool:\n        pass\n\n\nclass Routes: ...\n")
    assert shared_names(pkg) == {"_Pool": ["pkg/a.py:1", "pkg/sub/b.py:2"]}


def test_the_walker_finds_errors_derived_through_other_classes(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    errors = pkg / "errors.py"
    errors.write_text("class GatewayError(Exception): ...\nclass BadRequest(GatewayError): ...\n")
    (pkg / "a.py").write_text(
        "from pkg import errors\nclass Late(errors.BadRequest): ...\nclass Fine(Exception): ...\n"
    )
    (pkg / "b.py").write_text("from pkg.a import Late\nclass Later(Late): ...\n")
    assert classes_outside(pkg, errors, "GatewayError") == ["Late (pkg/a.py:2)", "Later (pkg/b.py:2)"]
