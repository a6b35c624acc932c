"""API keys: generation and the keyed blake3 hash that is all the store ever keeps of a secret.

The hashing key is a 32-byte host secret (see ``gateway.config.load_hash_key``); both planes hash with it,
so a stolen database alone cannot be used to check guesses. No I/O here.
"""

from __future__ import annotations

import secrets

from blake3 import blake3

KEY_PREFIX = "sk-gw-"

__all__ = ["KEY_PREFIX", "generate_secret", "hash_secret"]


def generate_secret() -> str:
    """A new API key: a fixed prefix (so scanners recognise it) and 192 bits of randomness."""
    return KEY_PREFIX + secrets.token_urlsafe(24)


def hash_secret(secret: str | bytes, hash_key: bytes) -> bytes:
    """The 32-byte keyed blake3 digest of a key, as stored and as looked up on the request path."""
    data = secret.encode() if isinstance(secret, str) else secret
    return blake3(data, key=hash_key).digest()
