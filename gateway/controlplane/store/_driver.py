"""The database behind the store, reduced to one small interface, and its SQLite implementation.

``Driver.transaction(write=...)`` yields a ``Transaction`` with ``execute``, ``executemany``, ``query`` and
``insert_new`` (idempotent bulk inserts, which each database does its own fastest way).
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
from itertools import chain
from pathlib import Path
from typing import Any, Protocol

from gateway.errors import StoreConflict, StoreDataError, StoreError

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

    def insert_new(
        self,
        table: str,
        columns: Sequence[str],
        key: str,
        rows: Iterable[Sequence[Param]],
        *,
        returning: bool = False,
    ) -> list[Any]:
        """Insert the rows (values in ``columns`` order) whose ``key`` column is not stored yet, skipping the
        others (a row repeated within ``rows`` is stored once), in whatever way is cheapest for the driver.
        ``rows`` is read once, as it is used: a lazy iterable keeps the rows from all living at once.
        Returns the ``key`` columns of the rows it inserted, as tuples, when ``returning`` (what spend
        counters add), else []."""
        ...

    def query(self, sql: str, params: Sequence[Param] = ()) -> list[Row]: ...

    def notify(self, channel: str, payload: str) -> None:
        """Tell other processes watching the database, once the transaction commits (PostgreSQL's
        NOTIFY); a no-op where the database has no such thing."""
        ...


class Driver(Protocol):
    # "sqlite" or "postgresql": for the few places whose SQL differs (migrations, the usage table's
    # partitions and its unique key).
    dialect: str

    def transaction(self, *, write: bool) -> AbstractContextManager[Transaction]:
        """Commit on normal exit, roll back on an exception (which propagates).

        A read transaction sees one consistent state of the database from its first query on.
        """
        ...

    def close(self) -> None: ...


def _map_error(exc: sqlite3.Error) -> StoreError:
    if isinstance(exc, sqlite3.IntegrityError):
        return StoreConflict(f"store constraint violated: {exc}")
    if isinstance(exc, (sqlite3.DataError, sqlite3.InterfaceError, sqlite3.ProgrammingError)):
        return StoreDataError(f"store refused a value: {exc}")
    return StoreError(f"store error: {exc}")


# What sqlite3 raises, outside its own exception hierarchy, for a value it cannot bind (an int past 64
# bits: OverflowError; a type it has no adapter for, or a str with a lone surrogate: others).
_BIND_ERRORS = (OverflowError, TypeError, ValueError, UnicodeEncodeError)


# Rows per INSERT in ``insert_new``: one statement of many rows binds and steps once per statement rather
# than once per row. Measured for the 24 columns of a usage record (perf/README, "Control plane"): SQLite
# 3.2 -> 2.4 µs per row from 1 to 16 rows; 16 rows are 384 variables, far under SQLite's 32,766.
_ROWS_PER_INSERT = 16
_StatementKey = tuple[str, tuple[str, ...], str, int]  # table, columns, key, rows
_MAX_ROWID = 2**63 - 1  # SQLite's largest rowid: past it, new rows get rowids at random


def _insert_sql(table: str, columns: Sequence[str], key: str, rows: int) -> str:
    row = f"({', '.join(['?'] * len(columns))})"
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join([row] * rows)} "
        f"ON CONFLICT ({key}) DO NOTHING"
    )


class _SqliteTransaction:
    __slots__ = ("_conn", "_statements")

    def __init__(self, conn: sqlite3.Connection, statements: dict[_StatementKey, str]) -> None:
        self._conn = conn
        self._statements = statements  # the driver's, so that each statement's text is built once

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

    def insert_new(
        self,
        table: str,
        columns: Sequence[str],
        key: str,
        rows: Iterable[Sequence[Param]],
        *,
        returning: bool = False,
    ) -> list[Any]:
        width = len(columns)
        values = list(chain.from_iterable(rows))
        conn = self._conn
        try:
            if not returning:
                self._insert(table, columns, key, values)
                return []
            # Which rows were new: in the common case all of them, which the count of rows the statements
            # inserted tells without a RETURNING (one statement per 16 rows, its rows fetched: 0.75 µs a
            # usage row more than ``executemany``; a savepoint to undo the batch cost more). Otherwise
            # the rows above the largest rowid before the batch: SQLite gives a new row the largest rowid
            # plus one, and this transaction is the only writer. Only at the largest possible rowid does
            # it pick rowids at random: then statement by statement with RETURNING.
            top = conn.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] or 0
            inserted: list[Any] = []
            if top >= _MAX_ROWID:
                span = width * _ROWS_PER_INSERT
                for i in range(0, len(values), span):
                    part = values[i : i + span]
                    sql = self._statement(table, columns, key, len(part) // width) + f" RETURNING {key}"
                    inserted += conn.execute(sql, part).fetchall()
                return inserted
            before = conn.total_changes
            self._insert(table, columns, key, values)
            if conn.total_changes - before == len(values) // width:
                at = [columns.index(name.strip()) for name in key.split(",")]
                return [tuple(values[i + j] for j in at) for i in range(0, len(values), width)]
            return conn.execute(f"SELECT {key} FROM {table} WHERE rowid > ?", (top,)).fetchall()
        except sqlite3.Error as exc:
            raise _map_error(exc) from exc
        except _BIND_ERRORS as exc:
            raise StoreDataError(f"store refused a value: {type(exc).__name__}: {exc}") from exc

    def _insert(self, table: str, columns: Sequence[str], key: str, values: list[Param]) -> None:
        """``values`` (rows of ``columns``, one after another) in statements of ``_ROWS_PER_INSERT`` rows."""
        width = len(columns)
        span = width * _ROWS_PER_INSERT
        whole = len(values) - len(values) % span
        if whole:
            sql = self._statement(table, columns, key, _ROWS_PER_INSERT)
            self._conn.executemany(sql, [values[i : i + span] for i in range(0, whole, span)])
        if whole < len(values):
            sql = self._statement(table, columns, key, (len(values) - whole) // width)
            self._conn.execute(sql, values[whole:])

    def _statement(self, table: str, columns: Sequence[str], key: str, rows: int) -> str:
        at = (table, tuple(columns), key, rows)
        sql = self._statements.get(at)
        if sql is None:
            sql = self._statements[at] = _insert_sql(table, columns, key, rows)
        return sql

    def query(self, sql: str, params: Sequence[Param] = ()) -> list[Row]:
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise _map_error(exc) from exc

    def notify(self, channel: str, payload: str) -> None:
        pass  # one file, one host: the revision poll is all there is


class SqliteDriver:
    """One SQLite connection, usable from any thread one transaction at a time."""

    dialect = "sqlite"

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
        self._statements: dict[_StatementKey, str] = {}

    @contextmanager
    def transaction(self, *, write: bool) -> Iterator[Transaction]:
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.Error as exc:
                raise _map_error(exc) from exc
            try:
                yield _SqliteTransaction(self._conn, self._statements)
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
