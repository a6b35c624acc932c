-- Admin API sessions: a browser logs in with an admin key once and then carries a session cookie. Only a
-- keyed hash of the session token is stored, like API keys; a session dies with its key (revoked,
-- expired or removed) and at its own expiry.

CREATE TABLE admin_sessions (
    token_hash TEXT PRIMARY KEY,         -- 64 hex chars of the keyed blake3 digest of the cookie's token
    key_id TEXT NOT NULL,                -- the API key that logged in
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);

CREATE INDEX admin_sessions_expires_at ON admin_sessions (expires_at);
