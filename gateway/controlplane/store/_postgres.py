"""The store's PostgreSQL driver, behind the same ``Driver`` interface as SQLite.

A ``psycopg_pool.ConnectionPool`` of a few connections; each transaction borrows one. The portable SQL of
the store uses ``?`` placeholders, rewritten here to psycopg's ``%s`` (the store's SQL holds no literal
``?`` or ``%``). Write transactions first take one transaction-scoped advisory lock, so that writers
serialise the way SQLite's ``BEGIN IMMEDIATE`` makes them (two control planes applying a config, or
migrating, at once). Read transactions run at REPEATABLE READ, so that every query of one sees the same
state, as ``Driver`` promises. ``insert_new`` stages rows with COPY in a temporary table per connection
and inserts from there, so its statements never change with the rows. This is the only module that
touches psycopg: its exceptions become ``StoreError`` (``StoreConflict`` for constraint violations) here.

While the database is away the pool reconnects every second (psycopg_pool's own backoff doubles without a
cap), and callers fail fast: a thread of the driver's own waits on the pool to see the database back, and
meanwhile every transaction gets ``StoreError`` at once. So a database back from an outage of any length
takes writes within a few seconds, and a control worker's threads are not all held waiting meanwhile.
I/O: the database connections.
"""

from __future__ import annotations

import re
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

from gateway.controlplane.store._driver import Param, Transaction
from gateway.errors import StoreConflict, StoreDataError, StoreError

__all__ = ["PostgresDriver", "redact_url"]

Row = tuple[Any, ...]
# An arbitrary constant naming "the store's write lock" among the database's advisory locks.
_WRITE_LOCK = 0x67617465776179  # "gateway"
_PLACEHOLDER = re.compile(r"\?")
# Per connection, the tables whose staging table (``insert_new``) it holds, each with its columns' types.
_Staged = weakref.WeakKeyDictionary[psycopg.Connection[Any], dict[str, dict[str, int]]]
RECONNECT_FOREVER = 86400.0 * 365
# Seconds between the probe's waits on the pool while the database is away (the pool reconnects each second).
DOWN_RETRY = 0.5
# Seconds the LISTEN thread waits for a notification before it looks at its stop flag: how long closing the
# store (so stopping the control worker, so the gateway) waits for it. It was a second, and every stop of a
# gateway on PostgreSQL waited out half of one on average; a wake-up ten times a second costs nothing.
LISTEN_WAKE = 0.1


def _sql(sql: str) -> str:
    return _PLACEHOLDER.sub("%s", sql)


def redact_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


def _map_error(exc: psycopg.Error) -> StoreError:
    if isinstance(exc, psycopg.errors.IntegrityError):
        return StoreConflict(f"store constraint violated: {exc}")
    if isinstance(exc, psycopg.DataError):  # out of range, a NUL in text, ...; also psycopg's own dumpers
        return StoreDataError(f"store refused a value: {exc}".strip())
    return StoreError(f"store error: {exc}".strip())


class _PgTransaction:
    __slots__ = ("_cur", "_staged", "_used")

    def __init__(self, cur: psycopg.Cursor[Row], staged: _Staged) -> None:
        self._cur = cur
        self._staged = staged  # the staging tables each connection has, and their types (the driver's)
        self._used: set[str] = set()  # the tables whose staging table this transaction filled

    def execute(self, sql: str, params: Sequence[Param] = ()) -> int:
        try:
            self._cur.execute(_sql(sql), params)
        except psycopg.Error as exc:
            raise _map_error(exc) from exc
        return self._cur.rowcount

    def executemany(self, sql: str, rows: Iterable[Sequence[Param]]) -> None:
        batch = list(rows)
        if not batch:
            return
        try:
            self._cur.executemany(_sql(sql), batch)
        except psycopg.Error as exc:
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
        """COPY the rows into a temporary table of the connection's own, then one INSERT ... SELECT that
        skips the stored keys. No statement's text depends on the rows: a multi-row INSERT of bound values
        had psycopg re-parse its hundreds of placeholders in Python every time (it caches the conversion
        of queries of at most 50 parameters only), about 1 ms per 16 rows with the GIL held. The COPY is
        binary with the columns' types given, so psycopg's C code formats each value with the dumper of
        its column rather than looking one up by the value's Python type (0.4 against 1.6 µs per usage
        row). The staging table empties itself at commit (and a rollback takes its rows away); it lives
        as long as the connection."""
        cols = ", ".join(columns)
        staging = f"pg_temp.{table}_incoming"
        cur = self._cur
        try:
            conn = cur.connection
            made = self._staged.get(conn)
            types = None if made is None else made.get(table)
            if types is None:
                cur.execute(
                    f"CREATE TEMP TABLE IF NOT EXISTS {table}_incoming (LIKE {table}) ON COMMIT DELETE ROWS"
                )
                cur.execute(
                    "SELECT attname, atttypid FROM pg_attribute WHERE attrelid = %s::regclass "
                    "AND attnum > 0 AND NOT attisdropped",
                    (staging,),
                )
                types = {str(name): int(oid) for name, oid in cur.fetchall()}
                self._staged.setdefault(conn, {})[table] = types
            elif table in self._used:
                cur.execute(f"DELETE FROM {staging}")  # staged earlier in this transaction, inserted then
            self._used.add(table)
            with cur.copy(f"COPY {staging} ({cols}) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types([types[c] for c in columns])
                write = copy.write_row
                for row in rows:
                    write(row)
            insert = (
                f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {staging} ON CONFLICT ({key}) DO NOTHING"
            )
            if not returning:
                cur.execute(insert)
                return []
            cur.execute(f"{insert} RETURNING {key}")
            return cur.fetchall()
        except psycopg.Error as exc:
            raise _map_error(exc) from exc
        except (OverflowError, TypeError, ValueError, struct.error) as exc:  # a value no dumper can write
            raise StoreDataError(f"store refused a value: {type(exc).__name__}: {exc}") from exc

    def query(self, sql: str, params: Sequence[Param] = ()) -> list[Row]:
        try:
            self._cur.execute(_sql(sql), params)
            return self._cur.fetchall()
        except psycopg.Error as exc:
            raise _map_error(exc) from exc

    def notify(self, channel: str, payload: str) -> None:
        try:
            self._cur.execute("SELECT pg_notify(%s, %s)", (channel, payload))
        except psycopg.Error as exc:
            raise _map_error(exc) from exc


class _EverySecond(AttemptWithBackoff):
    """psycopg_pool retries a lost connection after 1 s, doubling without a cap: a database away for 20 s
    came back to a pool that waited 22 s more. Retrying every second instead costs one connection attempt
    a second per pooled connection while the database is away, and gets it back within a second."""

    DELAY_BACKOFF = 1.0


class _Pool(ConnectionPool):
    def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        # psycopg_pool 3.2/3.3 make the attempt here when none is given (a first try, or a refill).
        super()._add_connection(attempt or _EverySecond(timeout=self.reconnect_timeout), growing)


class PostgresDriver:
    """A small pool of connections to one PostgreSQL database."""

    dialect = "postgresql"

    def __init__(self, url: str, *, max_size: int = 4, timeout: float = 2.0) -> None:
        self.url = url
        self._timeout = timeout
        # While the database is away callers fail at once, and one thread of our own waits on the pool to
        # see it back, instead of every caller holding its thread for the pool's timeout.
        self._down: str | None = None
        self._down_lock = threading.Lock()
        self._prober: threading.Thread | None = None
        self._closed = False
        # The staging tables of ``insert_new`` each connection holds (created in a committed transaction)
        # with their columns' types; a rollback takes the connection out, since it may have undone a
        # creation.
        self._staged: _Staged = weakref.WeakKeyDictionary()
        try:
            # One plain connection first: a refused or misaddressed server fails at once with its own
            # message, where the pool would retry until its timeout.
            psycopg.connect(url, connect_timeout=max(1, int(timeout))).close()
            self._pool = _Pool(
                url,
                min_size=1,
                max_size=max_size,
                timeout=timeout,
                # Never give a connection up for good: an outage of any length ends with a full pool.
                reconnect_timeout=RECONNECT_FOREVER,
                kwargs={"autocommit": True, "connect_timeout": max(1, int(timeout))},
                # Checked when borrowed: after a database restart every pooled connection is dead, and
                # this replaces them instead of failing one transaction per connection.
                check=ConnectionPool.check_connection,
                open=False,
            )
            self._pool.open(wait=True, timeout=timeout)
        except (psycopg.Error, PoolTimeout) as exc:
            raise StoreError(f"cannot connect to PostgreSQL at {redact_url(url)}: {exc}") from exc

    def _borrow(self) -> psycopg.Connection[Any]:
        down = self._down
        if down is not None:
            raise StoreError(f"PostgreSQL unavailable at {redact_url(self.url)}: {down}")
        try:
            return self._pool.getconn(timeout=self._timeout)
        except (psycopg.Error, PoolTimeout) as exc:
            self._went_down(str(exc))
            raise StoreError(f"PostgreSQL unavailable at {redact_url(self.url)}: {exc}") from exc

    def _went_down(self, why: str) -> None:
        with self._down_lock:
            self._down = why
            if self._prober is None and not self._closed:
                self._prober = threading.Thread(target=self._probe, name="postgres-probe", daemon=True)
                self._prober.start()

    def _probe(self) -> None:
        """Until the pool hands out a connection again (it reconnects every second), then back to normal."""
        while not self._closed:
            try:
                conn = self._pool.getconn(timeout=self._timeout)
            except (psycopg.Error, PoolTimeout) as exc:
                self._down = str(exc)
                time.sleep(DOWN_RETRY)
                continue
            self._pool.putconn(conn)
            break
        with self._down_lock:
            self._down = None
            self._prober = None

    @contextmanager
    def transaction(self, *, write: bool) -> Iterator[Transaction]:
        conn = self._borrow()
        try:
            with conn.cursor() as cur:
                try:
                    if write:
                        cur.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
                    else:
                        cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                except psycopg.Error as exc:
                    raise _map_error(exc) from exc
                try:
                    yield _PgTransaction(cur, self._staged)
                except BaseException:
                    self._staged.pop(conn, None)
                    _rollback(conn)
                    raise
                try:
                    cur.execute("COMMIT")
                except psycopg.Error as exc:
                    self._staged.pop(conn, None)
                    _rollback(conn)
                    raise _map_error(exc) from exc
        finally:
            # The pool checks what it gets back: a connection left broken is discarded and replaced.
            self._pool.putconn(conn)

    def listen(self, channel: str, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(payload)`` from a background thread for every NOTIFY on ``channel``; returns a
        function that stops listening. The thread reconnects (every second) while the database is away;
        what it may miss then, the caller's periodic poll catches."""
        stop = threading.Event()
        holder: dict[str, psycopg.Connection[Any]] = {}

        def run() -> None:
            while not stop.is_set():
                try:
                    with psycopg.connect(self.url, autocommit=True, connect_timeout=2) as conn:
                        holder["conn"] = conn
                        conn.execute(f"LISTEN {channel}")  # a constant name
                        while not stop.is_set():
                            for note in conn.notifies(timeout=LISTEN_WAKE):
                                callback(note.payload)
                except psycopg.Error:
                    stop.wait(1.0)

        thread = threading.Thread(target=run, name=f"listen-{channel}", daemon=True)
        thread.start()

        def close() -> None:
            stop.set()
            thread.join(timeout=3)

        return close

    def close(self) -> None:
        self._closed = True
        self._pool.close()


def _rollback(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error:
        pass  # the connection is gone; the pool discards it
