"""Credential pools: which of a backend's API keys an attempt uses, and what each key's answers did to it.

A backend with ``credentials`` is tried with them in turn, starting one further on each request so that
the keys share the traffic. A key is passed over while it is disabled (it answered 401 or 403: the
provider no longer accepts it; reported once in the log and in the fleet view until a new snapshot brings
a different key under that name), cooling (it answered 429: for its ``Retry-After``, or its ``cool_down``
when the answer names none), or out of its own quota (requests and tokens per minute, on the host's shared
buckets, so exact across the host's workers; tokens are taken from the request's estimate). The state of
disabled and cooling keys is this worker's, published with its statistics about once a second.
I/O: none (shared-memory buckets only).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from email.utils import parsedate_to_datetime
from typing import Any

from gateway.native import BucketTable
from gateway.snapshot import Backend, Credential

__all__ = ["CredentialPools", "CredentialState", "retry_after"]

log = logging.getLogger("gateway.dataplane")

MAX_COOL_DOWN = 3600.0  # a Retry-After further out than this is taken as this


class CredentialState:
    __slots__ = ("answered", "cooling_until", "disabled", "failed", "last_error", "last_error_at", "secret")

    def __init__(self, secret: str) -> None:
        self.secret = secret  # what the state is about: a new key under the same name starts afresh
        self.answered = 0
        self.failed = 0
        self.disabled: str | None = None
        self.cooling_until = 0.0
        self.last_error = ""
        self.last_error_at = 0.0

    def as_dict(self, now: float) -> dict[str, Any]:
        state = "disabled" if self.disabled else "cooling" if self.cooling_until > now else "ok"
        return {
            "state": state,
            "answered": self.answered,
            "failed": self.failed,
            "cooling_for": round(self.cooling_until - now, 1) if state == "cooling" else None,
            "last_error": self.last_error or None,
            "last_error_at": self.last_error_at or None,
        }


def retry_after(headers: list[tuple[str, str]], default: float) -> float:
    """Seconds an answer's ``Retry-After`` asks for (delta-seconds or an HTTP date), else ``default``."""
    for name, value in headers:
        if name.lower() != "retry-after":
            continue
        try:
            seconds = float(value)
        except ValueError:
            try:
                seconds = parsedate_to_datetime(value).timestamp() - time.time()
            except (TypeError, ValueError):
                return default
        return min(max(seconds, 0.0), MAX_COOL_DOWN)
    return default


class CredentialPools:
    """One worker's view of every pool: the turn of each backend and the state of each credential."""

    def __init__(self, table: BucketTable | None = None) -> None:
        self.table = table  # None: quotas are not enforced (no shared buckets, as in unit tests)
        self.states: dict[str, CredentialState] = {}  # by scope ("c:<backend>/<name>")
        self._turn: dict[str, int] = {}

    def state(self, cred: Credential) -> CredentialState:
        st = self.states.get(cred.scope)
        if st is None or st.secret != cred.api_key:
            st = self.states[cred.scope] = CredentialState(cred.api_key)
        return st

    def usable(self, backend: Backend, tokens: int) -> Iterator[Credential]:
        """The backend's credentials that may be tried now, in this request's turn; each one's quota is
        taken as it is handed out (a key that is then not tried still counts: the quota is a ceiling)."""
        creds = backend.credentials
        start = self._turn.get(backend.name, 0)
        self._turn[backend.name] = (start + 1) % len(creds)
        now = time.time()
        for i in range(len(creds)):
            cred = creds[(start + i) % len(creds)]
            st = self.state(cred)
            if st.disabled or st.cooling_until > now or not self._quota(cred, tokens):
                continue
            yield cred

    def _quota(self, cred: Credential, tokens: int) -> bool:
        table = self.table
        if table is None:
            return True
        if cred.rpm is not None and not table.take(cred.rpm_key, cred.rpm / 60.0, cred.rpm, 1).admitted:
            return False
        if cred.tpm is not None:
            n = min(tokens, cred.tpm)  # a request larger than the whole quota waits for a full bucket
            if not table.take(cred.tpm_key, cred.tpm / 60.0, cred.tpm, n).admitted:
                return False
        return True

    def refused(
        self, backend: Backend, cred: Credential, status: int, headers: list[tuple[str, str]]
    ) -> None:
        """A 401/403 disables the key, a 429 cools it down."""
        st = self.state(cred)
        st.failed += 1
        st.last_error, st.last_error_at = f"HTTP {status}", time.time()
        if status == 429:
            st.cooling_until = time.time() + retry_after(headers, cred.cool_down)
            return
        if st.disabled is None:
            log.warning(
                "credential %s of backend %s answered HTTP %d: disabled until its key changes",
                cred.name,
                backend.name,
                status,
            )
        st.disabled = f"HTTP {status}"

    def answered(self, cred: Credential) -> None:
        self.state(cred).answered += 1

    def as_dict(self) -> dict[str, dict[str, Any]]:
        now = time.time()
        return {scope[2:]: st.as_dict(now) for scope, st in self.states.items()}
