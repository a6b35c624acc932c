"""Spend kept per budget window: counters that budgets and shares read in O(owners) rows, where summing
``usage_records`` over each window cost O(records) and grew with the table.

``usage_spend`` holds, per owner (a principal's id, or ``key:`` and a key's id), per period of one of its
budgets and per window of that period, the tokens and cost of every stored record of the owner that ended
in the window (``held`` 0), and, per live counter a record names (``held`` that counter's key), the part
of it that counter held: a host's base for a window is the total less what its own counter held
(``gateway.controlplane.usage.sink``). A window with identical bounds under two periods ("day", "1d")
has a row set under each; any of them answers.

``add_new`` runs in the transaction that stored the records, with the records *that transaction
inserted* only (a retried batch adds nothing), so the counters move exactly with the table, across any
number of control hosts sharing one PostgreSQL: each adds its deltas with ``INSERT ... ON CONFLICT DO
UPDATE``. A window is opened (its rows made) the first time a record of it is stored while its owner has
that budget, from the records already stored in it (one indexed sum, then never again); until then, and
for an owner without the budget, ``read`` sums the records as before. Retention drops the windows that
ended before what it purged (``drop_ended``); a configuration that takes a budget away drops its windows
(``drop_unbudgeted``), so that a budget given back later is opened afresh. Counters saturate at the
column's bound rather than overflow (a record's figures are at most 2**53 each).
I/O: the store's tables, through the transaction it is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.budget import KEY_OWNER, period_window
from gateway.controlplane.store._driver import Param, Transaction
from gateway.usage_record import UsageRecord, counter_key

__all__ = ["WindowSpend", "add_new", "budgeted", "drop_ended", "drop_unbudgeted", "from_groups", "read"]

_CHUNK = 500  # values per IN (...): well under every driver's parameter limit
_MAX = 2**63 - 1  # a BIGINT's bound
_TOTAL = 0  # ``held`` of a window's total: no live counter has key 0 (``bucket_key`` is nonzero)
_WindowAt = tuple[str, str, float]  # owner, period, window start


@dataclass(slots=True)
class WindowSpend:
    """What one owner (a principal's id or a key's id, as asked) spent in a window: in all, and the part
    of it each live counter held (by the counter's unsigned 64-bit key)."""

    owner_id: str
    tokens: int = 0
    cost_nanos: int = 0
    held: dict[int, tuple[int, int]] = field(default_factory=dict)

    def unheld(self, key: int) -> tuple[int, int]:
        """Tokens and cost that the live counter ``key`` did not hold."""
        tokens, cost = self.held.get(key, (0, 0))
        return self.tokens - tokens, self.cost_nanos - cost


@dataclass(slots=True)
class _Delta:
    end: float
    by_held: dict[int, list[int]] = field(default_factory=dict)  # held -> [tokens, cost]

    def add(self, held: int, tokens: int, cost: int) -> None:
        sums = self.by_held.get(held)
        if sums is None:
            self.by_held[held] = [tokens, cost]
        else:
            sums[0] += tokens
            sums[1] += cost


def budgeted(tx: Transaction, records: Sequence[UsageRecord]) -> dict[str, list[str]]:
    """The budget periods of the owners of ``records`` that have any: owner -> periods."""
    out: dict[str, list[str]] = {}
    principals = sorted({r.principal_id for r in records})
    keys = sorted({r.key_id for r in records})
    for table, column, ids, prefix in (
        ("principal_budgets", "principal_id", principals, ""),
        ("key_budgets", "key_id", keys, KEY_OWNER),
    ):
        for i in range(0, len(ids), _CHUNK):
            chunk = ids[i : i + _CHUNK]
            marks = ", ".join(["?"] * len(chunk))
            for owner, period in tx.query(
                f"SELECT {column}, period FROM {table} WHERE {column} IN ({marks})", chunk
            ):
                out.setdefault(prefix + str(owner), []).append(str(period))
    return out


def add_new(tx: Transaction, records: Iterable[UsageRecord], periods: dict[str, list[str]]) -> None:
    """Add records the transaction has just inserted to their owners' windows (``periods``: ``budgeted``),
    opening from the stored records the windows that have no rows yet."""
    deltas: dict[_WindowAt, _Delta] = {}
    principal_of: dict[str, str] = {}  # key owner -> a principal of its records, to narrow the opening
    # The records that spent something, summed by what decides where their spend goes (their principal,
    # their key and the counters each names), with the earliest and latest end among them: a batch's
    # records mostly share all four, so the windows are worked out once per group rather than per record
    # and period (a month's takes calendar arithmetic).
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for r in records:
        tokens, cost = r.total_tokens, r.cost_nanos
        if tokens <= 0 and cost <= 0:
            continue  # adds nothing; its window is opened by a record that does
        held, own, ts = r.budget_keys, r.key_budget_keys, r.ts
        at = (r.principal_id, r.key_id, tuple(held) if held else None, tuple(own) if own else None)
        group = groups.get(at)
        if group is None:
            groups[at] = [tokens, cost, ts, ts, [r]]
            continue
        group[0] += tokens
        group[1] += cost
        if ts < group[2]:
            group[2] = ts
        elif ts > group[3]:
            group[3] = ts
        group[4].append(r)
    # Per period, the last window found: a batch's records end close together.
    windows: dict[str, tuple[float, float]] = {}
    for (principal, key_id, held, own), (tokens, cost, first, last, members) in groups.items():
        key_owner = KEY_OWNER + key_id
        if key_owner in periods:
            principal_of.setdefault(key_owner, principal)
        for owner, counters in ((principal, held), (key_owner, own)):
            for period in periods.get(owner, ()):
                window = windows.get(period)
                if window is None or not window[0] <= first < window[1]:
                    window = windows[period] = period_window(period, first)
                if last < window[1]:  # every end in [first, last] is in this window
                    _add(deltas, (owner, period, window[0]), window[1], counters, tokens, cost)
                    continue
                for r in members:  # the group straddles a window's end: each record in its own
                    if not window[0] <= r.ts < window[1]:
                        window = windows[period] = period_window(period, r.ts)
                    _add(
                        deltas, (owner, period, window[0]), window[1], counters, r.total_tokens, r.cost_nanos
                    )
    if not deltas:
        return
    opened = _opened(tx, deltas)
    rows: list[Sequence[Param]] = []
    for (owner, period, start), delta in deltas.items():
        if (owner, period, start) not in opened:
            # Summed from the table, which holds this batch's records already: the delta is in it.
            principal = principal_of.get(owner, owner)
            delta = _summed(tx, owner, principal, start, delta.end)
        rows += [
            (owner, period, start, held, delta.end, min(tokens, _MAX), min(cost, _MAX))
            for held, (tokens, cost) in delta.by_held.items()
        ]
    tx.executemany(
        "INSERT INTO usage_spend (owner, period, window_start, held, window_end, tokens, cost_nanos) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (owner, period, window_start, held) DO UPDATE SET "
        f"tokens = CASE WHEN usage_spend.tokens > {_MAX} - excluded.tokens THEN {_MAX} "
        "ELSE usage_spend.tokens + excluded.tokens END, "
        f"cost_nanos = CASE WHEN usage_spend.cost_nanos > {_MAX} - excluded.cost_nanos THEN {_MAX} "
        "ELSE usage_spend.cost_nanos + excluded.cost_nanos END",
        rows,
    )


def _add(
    deltas: dict[_WindowAt, _Delta],
    at: _WindowAt,
    end: float,
    counters: tuple[int, ...] | None,
    tokens: int,
    cost: int,
) -> None:
    """Spend to a window's total and to the part each live counter named held (a counter named twice
    held it once)."""
    delta = deltas.get(at)
    if delta is None:
        delta = deltas[at] = _Delta(end)
    delta.add(_TOTAL, tokens, cost)
    if counters:
        for key in set(counters):
            if 0 < key < 2**64:
                delta.add(_signed(key), tokens, cost)


def _opened(tx: Transaction, deltas: dict[_WindowAt, _Delta]) -> set[_WindowAt]:
    """Which of the windows have rows: their owners' windows that end after the earliest start asked."""
    owners = sorted({owner for owner, _, _ in deltas})
    since = min(start for _, _, start in deltas)
    found: set[_WindowAt] = set()
    for i in range(0, len(owners), _CHUNK):
        chunk = owners[i : i + _CHUNK]
        rows = tx.query(
            f"SELECT owner, period, window_start FROM usage_spend WHERE held = {_TOTAL} "
            f"AND owner IN ({', '.join(['?'] * len(chunk))}) AND window_end > ?",
            [*chunk, since],
        )
        found.update((str(o), str(p), float(s)) for o, p, s in rows)
    return found


def _summed(tx: Transaction, owner: str, principal: str, start: float, end: float) -> _Delta:
    """A window's rows from the records stored in it (the principal's index narrows a key's search)."""
    if owner.startswith(KEY_OWNER):
        rows = tx.query(
            "SELECT key_budget_keys, SUM(total_tokens), SUM(cost_nanos) FROM usage_records "
            "WHERE principal_id = ? AND key_id = ? AND ts >= ? AND ts < ? GROUP BY key_budget_keys",
            (principal, owner[len(KEY_OWNER) :], start, end),
        )
    else:
        rows = tx.query(
            "SELECT budget_keys, SUM(total_tokens), SUM(cost_nanos) FROM usage_records "
            "WHERE principal_id = ? AND ts >= ? AND ts < ? GROUP BY budget_keys",
            (owner, start, end),
        )
    delta = _Delta(end)
    delta.add(_TOTAL, 0, 0)  # the window's total row, even empty: it marks the window opened
    for keys, tokens, cost in rows:
        delta.add(_TOTAL, int(tokens or 0), int(cost or 0))
        for key in _keys(keys):
            delta.add(_signed(key), int(tokens or 0), int(cost or 0))
    return delta


def read(
    tx: Transaction, owners: Sequence[str], start: float, end: float, prefix: str = ""
) -> tuple[dict[str, WindowSpend], list[str]]:
    """The spend of each owner (``prefix`` + id in the table) in the window [start, end) that has rows,
    by id; and the ids of those whose window has none (to be summed from the records)."""
    found: dict[str, WindowSpend] = {}
    chosen: dict[str, str] = {}  # id -> the period whose rows answer for it
    for i in range(0, len(owners), _CHUNK):
        chunk = [prefix + o for o in owners[i : i + _CHUNK]]
        rows = tx.query(
            "SELECT owner, period, held, tokens, cost_nanos FROM usage_spend WHERE "
            f"owner IN ({', '.join(['?'] * len(chunk))}) AND window_start = ? AND window_end = ? "
            "ORDER BY owner, period, held",
            [*chunk, start, end],
        )
        for owner, period, held, tokens, cost in rows:
            oid = str(owner)[len(prefix) :]
            if chosen.setdefault(oid, str(period)) != period:
                continue  # the same window under another period: the same figures
            spend = found.get(oid)
            if spend is None:
                spend = found[oid] = WindowSpend(oid)
            if held == _TOTAL:
                spend.tokens, spend.cost_nanos = int(tokens), int(cost)
            else:
                spend.held[int(held) % 2**64] = (int(tokens), int(cost))
    return found, [o for o in owners if o not in found]


def from_groups(rows: Iterable[Sequence[Any]]) -> dict[str, WindowSpend]:
    """Spend by owner from rows of ``(owner, key list as JSON text, tokens, cost)`` summed from records."""
    out: dict[str, WindowSpend] = {}
    parsed: dict[object, list[int]] = {None: []}
    for owner, keys, tokens, cost in rows:
        held = parsed.get(keys)
        if held is None:
            held = parsed[keys] = _keys(keys)
        oid = str(owner)
        spend = out.get(oid)
        if spend is None:
            spend = out[oid] = WindowSpend(oid)
        t, c = int(tokens or 0), int(cost or 0)
        spend.tokens += t
        spend.cost_nanos += c
        for key in held:
            was = spend.held.get(key, (0, 0))
            spend.held[key] = (was[0] + t, was[1] + c)
    return out


def drop_ended(tx: Transaction) -> None:
    """Drop the windows that ended by the time before which records were purged (``usage_retention``). A
    record stored late into one of them (one older than the retention) leaves it to be summed from the
    records, or opened afresh by the next such record."""
    tx.execute(
        "DELETE FROM usage_spend WHERE window_end <= (SELECT purged_before FROM usage_retention WHERE id = 1)"
    )


def drop_unbudgeted(tx: Transaction) -> None:
    """Drop the windows of periods their owner has no budget for any more."""
    tx.execute(
        "DELETE FROM usage_spend WHERE NOT EXISTS (SELECT 1 FROM principal_budgets b "
        "WHERE b.principal_id = usage_spend.owner AND b.period = usage_spend.period) "
        "AND NOT EXISTS (SELECT 1 FROM key_budgets k "
        f"WHERE '{KEY_OWNER}' || k.key_id = usage_spend.owner AND k.period = usage_spend.period)"
    )


def _keys(text: object) -> list[int]:
    """A record's list of live counter keys (JSON text), or none."""
    try:
        value = orjson.loads(text) if isinstance(text, str) else None
    except orjson.JSONDecodeError:
        return []
    if not isinstance(value, list):
        return []
    return list(dict.fromkeys(filter(counter_key, value)))


def _signed(key: int) -> int:
    return key - 2**64 if key >= 2**63 else key
