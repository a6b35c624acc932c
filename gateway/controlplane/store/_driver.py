"""The database behind the store, reduced to one small interface, and its SQLite implementation.

``Driver.transaction(write=...)`` yields a ``Transaction`` with ``execute``, ``executemany`` and ``query``.
SQL is written once, portable, with ``?`` placeholders; a PostgreSQL driver rewrites them to ``%s``
and maps psycopg's exceptions the way ``SqliteDriver`` maps sqlite3's, so callers never change.

``SqliteDriver`` opens one connection in WAL mode with a busy timeout (the CLI writes while the
long-running control worker reads) and enforces foreign keys. Write transactions take the write lock
up front (``BEGIN IMMEDIATE``) so that a concurrent writer waits for the busy timeout instead of failing
half-way. This is the only module that touches ``sqlite3``: every ``sqlite3.Error`` becomes a
``StoreError`` here.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

from gateway.errors import StoreConflict, StoreError

__all__ = ["Driver", "Param", "SqliteDriver", "Transaction"]

Param = str | int | float | None
Row = tuple[Any, ...]

# sqlite3 binds an exact int, float or str as it is, but sends anything else, None included, through its
# adapter registry; a miss there looks ``__adapt__`` up on a class and formats the AttributeError it then
# drops, about 0.2 µs per NULL (a usage row has two or three). An adapter that hands None back unchanged
# turns that into one dict hit; it binds NULL as before. (Process-wide, as sqlite3's registry is.)
sqlite3.register_adapter(type(None), lambda value: value)


class Transaction(Protocol):
    def execute(self, sql: str, params: Sequence[Param] = ()) -> int:
        """Run one statement; returns the number of rows it changed."""
        ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Param]]) -> None: ...

    def query(self, sql: str, params: Sequence[Param] = ()) -> list[Row]: ...

    def notify(self, channel: str, payload: str) -> None:
        """Tell other processes watching the database, once the transaction commits (PostgreSQL's
        NOTIFY); a no-op where the database has no such thing."""
        ...


class Driver(Protocol):
    def transaction(self, *, write: bool) -> AbstractContextManager[Transaction]:
        """Commit on normal exit, roll back on an exception (which propagates).

        A read transaction sees one consistent state of the database from its first query on.
        """
        ...

    def close(self) -> None: ...


def _map_error(exc: sqlite3.Error) -> StoreError:
    if isinstance(exc, sqlite3.IntegrityError):
        return StoreConflict(f"store constraint violated: {exc}")
    return StoreError(f"store error: {exc}")


class _SqliteTransaction:
    __slots__ = ("_conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Param] = ()) -> int:
        try:
            return self._conn.execute(sql, params).rowcount
        except sqlite3.Error as exc:
            raise _map_error(exc) from exc

    def executemany(self, sql: str, rows: Iterable[Sequence[Param]]) -> None:
        try:
            self._conn.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise _map_error(exc) from exc

    def query(self, sql: str, params: Sequence[Param] = ()) -> list[Row]:
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise _map_error(exc) from exc

    def notify(self, channel: str, payload: str) -> None:
        pass  # one file, one host: the revision poll is all there is


class SqliteDriver:
    """One SQLite connection, usable from any thread one transaction at a time."""

    def __init__(self, path: Path, *, busy_timeout: float = 10.0) -> None:
        try:
            # isolation_level=None: no implicit transactions; we issue BEGIN/COMMIT ourselves.
            self._conn = sqlite3.connect(
                path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            self._conn.execute("PRAGMA journal_mode = WAL")
            # NORMAL is durable across application crashes in WAL mode; only power loss may drop the
            # last commits, which an operator can re-apply.
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._conn.execute("PRAGMA foreign_keys = ON")
            try:
                self._conn.execute("SELECT floor(1.5)")
            except sqlite3.OperationalError:  # an SQLite built without its math functions
                self._conn.create_function("floor", 1, math.floor, deterministic=True)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite store {path}: {exc}") from exc
        self._lock = threading.Lock()

    @contextmanager
    def transaction(self, *, write: bool) -> Iterator[Transaction]:
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.Error as exc:
                raise _map_error(exc) from exc
            try:
                yield _SqliteTransaction(self._conn)
            except BaseException:
                self._conn.rollback()
                raise
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._conn.rollback()
                raise _map_error(exc) from exc

    def close(self) -> None:
        with self._lock:
            self._conn.close()
