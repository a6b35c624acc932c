"""Numbered schema migrations: ``gateway/controlplane/store/migrations/NNNN_name.sql``, applied in order.

Each migration runs in its own write transaction together with its row in ``schema_migrations``, so a
failed migration leaves nothing behind and two processes opening the store at once apply it once. The
files are portable SQL shared by every driver, except where a database needs its own:
``NNNN_name.postgresql.sql`` (or ``.sqlite.sql``) then stands in for ``NNNN_name.sql`` on that database
(the usage table's time partitions are PostgreSQL's alone). They are split into statements at a ``;``
that ends a line, after ``--`` comments are removed (so neither may appear inside a string literal).
Reads the migration files from the installed package; writes the database.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from importlib import resources

from gateway.controlplane.store._driver import Driver
from gateway.errors import StoreError

__all__ = ["Migration", "apply_migrations", "available_migrations", "split_statements"]

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)(?:\.(postgresql|sqlite))?\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def available_migrations(dialect: str = "sqlite") -> list[Migration]:
    """The packaged migrations for ``dialect`` ("sqlite" or "postgresql"), ordered by version; a gap or a
    duplicate version is a packaging bug."""
    folder = resources.files("gateway.controlplane.store").joinpath("migrations")
    generic: dict[int, Migration] = {}
    own: dict[int, Migration] = {}
    for entry in folder.iterdir():
        m = _NAME.match(entry.name)
        if m and m.group(3) in (None, dialect):
            mig = Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8"))
            into = generic if m.group(3) is None else own
            if mig.version in into:
                raise StoreError(f"two migrations numbered {mig.version:04d}")
            into[mig.version] = mig
    found = sorted({**generic, **own}.values(), key=lambda mig: mig.version)
    for expected, mig in enumerate(found, start=1):
        if mig.version != expected:
            raise StoreError(
                f"migrations are not numbered 1..n: expected {expected:04d}, found {mig.version:04d}"
            )
    return found


def split_statements(sql: str) -> list[str]:
    lines = [line.split("--", 1)[0].rstrip() for line in sql.splitlines()]
    statements: list[str] = []
    current: list[str] = []
    for line in lines:
        if not line:
            continue
        current.append(line)
        if line.endswith(";"):
            statements.append("\n".join(current)[:-1].strip())
            current = []
    tail = "\n".join(current).strip()
    if tail:
        statements.append(tail)
    return [s for s in statements if s]


def apply_migrations(driver: Driver, migrations: list[Migration] | None = None) -> list[int]:
    """Bring the schema up to date; returns the versions this call applied."""
    with driver.transaction(write=True) as tx:
        tx.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
        )
    applied: list[int] = []
    for mig in available_migrations(driver.dialect) if migrations is None else migrations:
        with driver.transaction(write=True) as tx:
            if tx.query("SELECT 1 FROM schema_migrations WHERE version = ?", (mig.version,)):
                continue
            for statement in split_statements(mig.sql):
                tx.execute(statement)
            tx.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (mig.version, mig.name, time.time()),
            )
        applied.append(mig.version)
    return applied
