-- Logged request and response bodies ([[body_logs]]), redacted by the control worker before they are
-- written. A body is 'json' (compact JSON text), 'text', 'binary' or 'withheld' (only its size kept) or
-- 'none'; a streamed answer is stored rebuilt as the API's whole answer, stream_events counting the events
-- it came from. expires_at is when retention purges the row (ts + the entry's retention_days).

CREATE TABLE request_bodies (
    request_id TEXT PRIMARY KEY,          -- the usage record's
    ts DOUBLE PRECISION NOT NULL,         -- unix seconds when the answer ended
    expires_at DOUBLE PRECISION NOT NULL,
    principal_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    model TEXT NOT NULL,                  -- the name the client called
    rule TEXT NOT NULL,                   -- the [[body_logs]] entry that logged it
    status INTEGER NOT NULL,
    path TEXT NOT NULL,
    request_kind TEXT NOT NULL,
    request_size BIGINT NOT NULL,         -- bytes the client sent
    request_truncated INTEGER NOT NULL,   -- 1 when cut at the entry's max_bytes
    request_body TEXT,
    response_kind TEXT NOT NULL,
    response_size BIGINT NOT NULL,        -- bytes relayed to the client
    response_truncated INTEGER NOT NULL,
    response_body TEXT,
    stream_events INTEGER,                -- NULL unless the answer was a stream
    redactions INTEGER NOT NULL           -- values and matches replaced
);

CREATE INDEX request_bodies_expires_at ON request_bodies (expires_at);
