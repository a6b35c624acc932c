"""Backend credentials in the store: sealed with the vault (``gateway.controlplane.credentials``) on the way
in, opened on the way out for the snapshot, listed only as where each came from and a fingerprint, and
re-sealed when the secrets key rotates. A credential that no longer opens (a lost secrets key) reads as
``CREDENTIAL_UNREADABLE``: the snapshot builder skips it like any bad row, and an apply that does not
give its backend a new one keeps it sealed as it is. I/O: the transaction it is handed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.controlplane.config.specs import BackendSpec
from gateway.controlplane.credentials import Vault, is_sealed
from gateway.controlplane.store._audit import AuditEntry, write_audit
from gateway.controlplane.store._columns import to_json
from gateway.controlplane.store._driver import Param, Transaction
from gateway.controlplane.store._revision import bump_revision
from gateway.errors import CredentialError

__all__ = [
    "CREDENTIAL_UNREADABLE",
    "BackendCredential",
    "open_credential",
    "read_backend_credentials",
    "reseal_credentials",
    "seal_backends",
]


@dataclass(frozen=True, slots=True)
class BackendCredential:
    """What may be shown about a backend's credential: where it came from and a fingerprint."""

    source: str  # "inline" | "env:NAME" | "file:/path"
    fingerprint: str  # first 8 hex of a keyed hash of the credential


class _Unreadable:
    def __repr__(self) -> str:
        return "<credential that does not open>"


CREDENTIAL_UNREADABLE: Any = _Unreadable()


def open_credential(vault: Vault | None, name: str, sealed: str) -> str:
    """Backend ``name``'s credential in the clear; ``CredentialError`` naming the backend if it does not
    open."""
    if vault is None:
        raise CredentialError(f"backend {name!r}: its credential needs the secrets key")
    try:
        return vault.open(sealed, name)
    except CredentialError as exc:
        raise CredentialError(f"backend {name!r}: {exc.message}") from None


def _opens_to(vault: Vault | None, name: str, sealed: str, plaintext: str) -> bool:
    try:
        return open_credential(vault, name, sealed) == plaintext
    except CredentialError:
        return False


def seal_backends(
    tx: Transaction, vault: Vault | None, backends: Sequence[BackendSpec]
) -> dict[str, tuple[Param, Param]]:
    """Each backend's ``(sealed credential, fingerprint)``; an unchanged credential keeps its sealed
    value, so that an apply that changes nothing rewrites nothing."""
    stored = {r[0]: (r[1], r[2]) for r in tx.query("SELECT name, api_key, api_key_fingerprint FROM backends")}
    out: dict[str, tuple[Param, Param]] = {}
    for b in backends:
        if b.api_key is None:
            out[b.name] = (None, None)
            continue
        if vault is None:
            raise CredentialError(
                "backend credentials need the secrets key, which this store was opened without"
            )
        old = stored.get(b.name)
        if b.api_key is CREDENTIAL_UNREADABLE and old is not None:
            out[b.name] = (old[0], old[1])  # kept sealed as it is: see _document._stored_credential
        elif old is not None and isinstance(old[0], str) and _opens_to(vault, b.name, old[0], b.api_key):
            out[b.name] = (old[0], old[1])
        else:
            out[b.name] = (vault.seal(b.api_key, b.name), vault.fingerprint(b.api_key))
    return out


def read_backend_credentials(tx: Transaction) -> dict[str, BackendCredential]:
    """Where each backend's credential came from, and its fingerprint; never the credential."""
    rows = tx.query(
        "SELECT name, api_key_env, api_key_file, api_key_fingerprint FROM backends WHERE api_key IS NOT NULL"
    )
    return {
        r[0]: BackendCredential(
            f"env:{r[1]}" if r[1] else f"file:{r[2]}" if r[2] else "inline", str(r[3] or "")
        )
        for r in rows
    }


def reseal_credentials(tx: Transaction, current: Vault | None, vault: Vault, actor: str, action: str) -> int:
    """Re-seal every backend credential with ``vault``'s current key (opening it with ``current``), with
    its audit entry; also seals rows stored in the clear by versions before encryption at rest. Returns
    how many were re-sealed; bumps the revision when any was."""
    rows = tx.query("SELECT name, api_key FROM backends WHERE api_key IS NOT NULL ORDER BY name")
    updates: list[tuple[Param, ...]] = []
    for name, value in rows:
        if not isinstance(value, str) or (action != "secrets.rotate" and is_sealed(value)):
            continue
        if action == "secrets.rotate" and vault.sealed_with_current(value):
            continue
        plain = open_credential(current, name, value) if is_sealed(value) else value
        updates.append((vault.seal(plain, name), vault.fingerprint(plain), name))
    if not updates:
        return 0
    tx.executemany("UPDATE backends SET api_key = ?, api_key_fingerprint = ? WHERE name = ?", updates)
    detail = {"key_id": vault.current_id, "backends": [str(u[2]) for u in updates]}
    write_audit(tx, AuditEntry(actor, action, "backends", None, to_json(detail)))
    bump_revision(tx)
    return len(updates)
