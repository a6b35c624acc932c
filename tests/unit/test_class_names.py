"""No two classes in ``gateway/`` share a name.

Two ``UpstreamTimeout``s (one a transport error, one the 504 a client gets) or two ``Decision``s (a bucket's
and a route's) make a reader, a grep and a traceback ask which one is meant; an import of the wrong one
type-checks when both have the same shape. Every class counts, private and nested ones too: the rule is
about names as a reader meets them. AST only; nothing is imported.
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


def shared_names(root: Path) -> dict[str, list[str]]:
    return {name: places for name, places in class_names(root).items() if len(places) > 1}


def test_no_two_classes_share_a_name() -> None:
    shared = shared_names(PACKAGE)
    lines = [f"{name}: {', '.join(places)}" for name, places in sorted(shared.items())]
    assert not lines, "classes sharing a name (rename one of each):\n" + "\n".join(lines)


def test_the_walker_finds_private_and_nested_classes_of_one_name(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("class _Pool:\n    pass\n\n\nclass Route:\n    pass\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    class _Pool:\n        pass\n\n\nclass Routes: ...\n")
    assert shared_names(pkg) == {"_Pool": ["pkg/a.py:1", "pkg/sub/b.py:2"]}
