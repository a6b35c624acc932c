-- The audit log: one row per configuration write made through the admin API (who, what, when, the state
-- before and after), written in the same transaction as the write itself.

CREATE TABLE audit_log (
    id TEXT PRIMARY KEY,
    ts DOUBLE PRECISION NOT NULL,        -- unix seconds
    actor TEXT NOT NULL,                 -- 'principal-name (key key-id)', or 'cli'
    action TEXT NOT NULL,                -- 'config.apply', 'key.create', 'key.revoke'
    target TEXT NOT NULL,                -- what it acted on: a key id, 'config'
    before_state TEXT,                   -- JSON or TOML text; NULL when there was nothing
    after_state TEXT
);

CREATE INDEX audit_log_ts ON audit_log (ts);
