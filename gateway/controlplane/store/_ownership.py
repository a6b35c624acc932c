"""One owner for each configuration entry, and what an apply changes. Sans-I/O.

Every entry of the configuration (a backend, provider model, frontend model, pool, role, principal,
file-managed key, prompt class, body log, and the routing fallback) has exactly one owner:

- ``file:<absolute path>``: a config file declared it (``gateway serve --config``, its SIGHUP reloads,
  ``gateway apply FILE``). Applying that file again sets the entries it declares and removes those it
  owned and no longer declares; entries of other owners stay. A file that declares an entry owned by
  someone else takes it over (the audit entry says so).
- ``store``: created through the admin API or UI (or a whole-document ``PUT /admin/config``). Such an
  apply may add, change and remove store-owned entries only: changing or removing a file-owned entry is
  refused with ``OwnershipConflict`` naming the file, whose next reload would undo it anyway.

``merge`` computes the whole configuration an apply leads to and the owners after it; ``diff`` names the
entries added, removed and changed (never their values: credentials stay out of the audit log).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gateway.controlplane.config.specs import BackendSpec, ConfigDoc, KeySpec
from gateway.errors import OwnershipConflict

__all__ = ["KINDS", "STORE_OWNER", "describe_owner", "diff", "merge"]

STORE_OWNER = "store"
# The sections of ConfigDoc with named entries, plus "routing" for the fallback (one entry, "fallback").
KINDS = (
    "backends",
    "provider_models",
    "models",
    "pools",
    "roles",
    "principals",
    "keys",
    "prompt_classes",
    "body_logs",
)
Owners = Mapping[tuple[str, str], str]


def describe_owner(owner: str) -> str:
    return f"the config file {owner[5:]}" if owner.startswith("file:") else "the store (admin API or UI)"


def _public(entry: Any) -> Any:
    """An entry as compared by a store-owned apply: credentials and key secrets are write-only, so a
    document read back through the API (which never shows them) still equals what the file set."""
    if isinstance(entry, BackendSpec):
        return replace(entry, api_key=None)
    if isinstance(entry, KeySpec):
        return replace(entry, secret=None)
    return entry


def _refuse(kind: str, name: str, owner: str, what: str) -> OwnershipConflict:
    return OwnershipConflict(
        f"{kind}/{name} is owned by {describe_owner(owner)}: it cannot be {what} through the API; "
        "edit that file and reload it (SIGHUP or `gateway apply`)"
    )


def merge(
    current: ConfigDoc, owners: Owners, doc: ConfigDoc, owner: str
) -> tuple[ConfigDoc, dict[tuple[str, str], str]]:
    """The configuration after ``owner`` applies ``doc`` over ``current``, and every entry's owner then
    (store-owned entries omitted). Raises ``OwnershipConflict`` for a store apply touching a file's entry."""
    by_file = owner != STORE_OWNER
    new_owners: dict[tuple[str, str], str] = {}
    sections: dict[str, tuple[Any, ...]] = {}
    for kind in KINDS:
        declared = {e.name: e for e in getattr(doc, kind)}
        out: list[Any] = []
        for e in getattr(current, kind):
            held = owners.get((kind, e.name), STORE_OWNER)
            if held == owner:
                continue  # the document decides about its own: kept if it declares them, else removed
            if by_file:
                if e.name not in declared:
                    out.append(e)  # the store's or another file's entry, untouched
                    if held != STORE_OWNER:
                        new_owners[(kind, e.name)] = held
                continue  # declared: this file takes it over
            mine = declared.get(e.name)
            if mine is None:
                raise _refuse(kind, e.name, held, "removed")
            if _public(mine) != _public(e) or (
                isinstance(mine, BackendSpec) and mine.api_key is not None and mine.api_key != e.api_key
            ):
                raise _refuse(kind, e.name, held, "changed")
            out.append(e)
            new_owners[(kind, e.name)] = held
            del declared[e.name]
        for e in declared.values():
            out.append(e)
            if by_file:
                new_owners[(kind, e.name)] = owner
        sections[kind] = tuple(out)
    held_fallback: str | None = None
    if current.fallback is not None:
        held_fallback = owners.get(("routing", "fallback"), STORE_OWNER)
    fallback, fallback_owner = doc.fallback, owner
    if by_file and doc.fallback is None and held_fallback is not None and held_fallback != owner:
        fallback, fallback_owner = current.fallback, held_fallback  # another owner's fallback: untouched
    elif not by_file and held_fallback is not None and held_fallback != STORE_OWNER:
        if doc.fallback != current.fallback:
            raise _refuse("routing", "fallback", held_fallback, "changed")
        fallback_owner = held_fallback
    if fallback is not None and fallback_owner != STORE_OWNER:
        new_owners[("routing", "fallback")] = fallback_owner
    return ConfigDoc(**sections, fallback=fallback), new_owners


def diff(
    before: ConfigDoc, after: ConfigDoc, owners_before: Owners, owners_after: Owners
) -> dict[str, dict[str, list[str]]]:
    """``{"added"|"removed"|"changed"|"owner_changed": {kind: [names]}}``, empty groups left out.

    ``changed`` compares whole entries, credentials included (the names say which, never the values)."""
    out: dict[str, dict[str, list[str]]] = {"added": {}, "removed": {}, "changed": {}, "owner_changed": {}}
    for kind in KINDS:
        old = {e.name: e for e in getattr(before, kind)}
        new = {e.name: e for e in getattr(after, kind)}
        for group, names in (
            ("added", sorted(new.keys() - old.keys())),
            ("removed", sorted(old.keys() - new.keys())),
            ("changed", sorted(n for n in new.keys() & old.keys() if new[n] != old[n])),
            (
                "owner_changed",
                sorted(
                    n
                    for n in new.keys() & old.keys()
                    if owners_before.get((kind, n), STORE_OWNER) != owners_after.get((kind, n), STORE_OWNER)
                ),
            ),
        ):
            if names:
                out[group][kind] = names
    if before.fallback != after.fallback:
        group = "added" if before.fallback is None else "removed" if after.fallback is None else "changed"
        out[group]["routing"] = ["fallback"]
    return {group: kinds for group, kinds in out.items() if kinds}
