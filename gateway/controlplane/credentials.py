"""Backend credentials at rest: the secrets key, AES-GCM sealing, fingerprints, and key rotation.

The store never holds a provider's API key in the clear: ``Vault.seal`` turns it into
``v1:<key id>:<base64 nonce+ciphertext>`` (AES-256-GCM, the backend's name as associated data, so a
sealed value copied onto another backend's row does not open). The key lives outside the store:
``GATEWAY_SECRETS_KEY`` (64 hex characters; every control plane of a cluster sharing one database must
have the same), or else ``DATA_DIR/secrets.key``, created once with mode 0600 and refused when group or
others may read it. The key id (the first 8 hex of the key's SHA-256) names the key that sealed a value,
so a rotation can be finished after a crash and a running control worker notices a rotated key file and
re-reads it (``Vault.open``).

Fingerprints (the first 8 hex of a keyed blake3 hash, keyed with the API-key hash key) tell credentials
apart in listings without revealing them; they stay the same across rotations of the secrets key.

I/O: the key file(s) under the data directory (``load_vault``, ``rotate_key_file``); the rest is pure.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gateway.errors import CredentialError
from gateway.keys import hash_secret

__all__ = [
    "KEY_FILE",
    "NEW_KEY_FILE",
    "SECRETS_KEY_ENV",
    "Vault",
    "key_id",
    "load_vault",
    "rotate_key_file",
]

SECRETS_KEY_ENV = "GATEWAY_SECRETS_KEY"
KEY_FILE = "secrets.key"
NEW_KEY_FILE = "secrets.key.new"  # a rotation in progress: written before the store re-encrypts
_PREFIX = "v1"


def key_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:8]


class Vault:
    """Seals with the current key; opens with any key of the ring (re-read once on an unknown key id)."""

    def __init__(
        self,
        current: bytes,
        fingerprint_key: bytes,
        others: tuple[bytes, ...] = (),
        reload: Callable[[], tuple[bytes, tuple[bytes, ...]]] | None = None,
    ) -> None:
        self._set(current, others)
        self._fingerprint_key = fingerprint_key
        self._reload = reload

    def _set(self, current: bytes, others: tuple[bytes, ...]) -> None:
        for key in (current, *others):
            if len(key) != 32:
                raise CredentialError("a secrets key must be 32 bytes")
        self._current = current
        self._ring = {key_id(k): k for k in (*others, current)}

    @property
    def current_id(self) -> str:
        return key_id(self._current)

    def with_current(self, key: bytes) -> Vault:
        """The same vault sealing with ``key`` (and still opening what the old keys sealed)."""
        return Vault(key, self._fingerprint_key, tuple(self._ring.values()), self._reload)

    def seal(self, plaintext: str, context: str) -> str:
        nonce = secrets.token_bytes(12)
        sealed = AESGCM(self._current).encrypt(nonce, plaintext.encode(), context.encode())
        return f"{_PREFIX}:{self.current_id}:{base64.urlsafe_b64encode(nonce + sealed).decode()}"

    def open(self, sealed: str, context: str) -> str:
        prefix, _, rest = sealed.partition(":")
        kid, _, body = rest.partition(":")
        if prefix != _PREFIX or not body:
            raise CredentialError("not a sealed credential")
        key = self._ring.get(kid)
        if key is None and self._reload is not None:  # rotated by `gateway secrets rotate` meanwhile
            self._set(*self._reload())
            key = self._ring.get(kid)
        if key is None:
            raise CredentialError(f"sealed with secrets key {kid}, which is not at hand")
        try:
            raw = base64.urlsafe_b64decode(body)
            return AESGCM(key).decrypt(raw[:12], raw[12:], context.encode()).decode()
        except (InvalidTag, ValueError) as exc:
            raise CredentialError(f"a sealed credential does not open: {type(exc).__name__}") from None

    def sealed_with_current(self, sealed: str) -> bool:
        return sealed.split(":", 2)[1:2] == [self.current_id]

    def fingerprint(self, plaintext: str) -> str:
        return hash_secret("backend-credential:" + plaintext, self._fingerprint_key).hex()[:8]


def is_sealed(value: str) -> bool:
    return value.startswith(_PREFIX + ":")


def _env_key() -> bytes | None:
    raw = os.environ.get(SECRETS_KEY_ENV)
    if not raw:
        return None
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise CredentialError(f"{SECRETS_KEY_ENV} must be 64 hex characters (32 bytes)")
    return key


def _read_key_file(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CredentialError(f"cannot read the secrets key {path}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise CredentialError(
                f"{path} may be read by others (mode {stat.S_IMODE(mode):o}); chmod 600 {path}"
            )
        key = os.read(fd, 64)
    finally:
        os.close(fd)
    if len(key) != 32:
        raise CredentialError(f"{path} must hold exactly 32 bytes")
    return key


def _write_key_file(path: Path, key: bytes) -> None:
    """Write ``key`` to ``path`` (0600), durably, replacing nothing: callers rename it into place."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)


def _ring(data_dir: Path) -> tuple[bytes, tuple[bytes, ...]]:
    """(current key, other keys): the environment's key alone, or the key file and a pending new one."""
    env = _env_key()
    if env is not None:
        return env, ()
    current = _read_key_file(data_dir / KEY_FILE)
    pending = _read_key_file(data_dir / NEW_KEY_FILE)
    if current is None:
        if pending is not None:  # a rotation stopped after its commit, before its rename
            os.replace(data_dir / NEW_KEY_FILE, data_dir / KEY_FILE)
            return pending, ()
        data_dir.mkdir(parents=True, exist_ok=True)
        current = secrets.token_bytes(32)
        try:
            _write_key_file(data_dir / KEY_FILE, current)
        except FileExistsError:  # another process of this host created it first
            current = _read_key_file(data_dir / KEY_FILE)
            assert current is not None
    return current, () if pending is None else (pending,)


def load_vault(data_dir: Path, fingerprint_key: bytes) -> Vault:
    """The vault of this host: ``GATEWAY_SECRETS_KEY`` or ``DATA_DIR/secrets.key`` (created if absent)."""
    current, others = _ring(data_dir)
    return Vault(current, fingerprint_key, others, reload=lambda: _ring(data_dir))


def rotate_key_file(data_dir: Path, reencrypt: Callable[[bytes], int]) -> tuple[str, str, int]:
    """Replace ``secrets.key`` by a new key: write it as ``secrets.key.new``, have ``reencrypt(new)``
    re-seal every credential in one transaction, then rename the new file over the old. A crash at any
    point leaves a key that opens what the store holds (the vault reads both files). Returns
    ``(old id, new id, credentials re-sealed)``."""
    if _env_key() is not None:
        raise CredentialError(
            f"the secrets key comes from {SECRETS_KEY_ENV}: set the new one in "
            f"{SECRETS_KEY_ENV}_NEW for `gateway secrets rotate`, then replace {SECRETS_KEY_ENV} with it"
        )
    current, _ = _ring(data_dir)
    new_path = data_dir / NEW_KEY_FILE
    new = _read_key_file(new_path)  # an earlier rotation that stopped half-way is finished with its key
    if new is None:
        new = secrets.token_bytes(32)
        _write_key_file(new_path, new)
    count = reencrypt(new)
    os.replace(new_path, data_dir / KEY_FILE)
    return key_id(current), key_id(new), count


def new_env_key() -> bytes:
    """``GATEWAY_SECRETS_KEY_NEW``: the key a rotation under ``GATEWAY_SECRETS_KEY`` re-seals with."""
    raw = os.environ.get(SECRETS_KEY_ENV + "_NEW", "")
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise CredentialError(f"{SECRETS_KEY_ENV}_NEW must be 64 hex characters (32 bytes)")
    return key
