-- Usage records the control worker could not store as they came (see usage_record.bound_record and
-- usage.sink): the ones whose figures it clamped into their columns' bounds say which fields in clamped,
-- and the ones it could not store at all (undecodable, the wrong types, a value the database refused) are
-- set aside in usage_rejected for an operator to read (GET /admin/usage/rejected, gateway usage rejected).

-- Comma-separated names of the fields clamped (e.g. 'cost_nanos'); NULL when none was.
ALTER TABLE usage_records ADD COLUMN clamped TEXT;
CREATE INDEX usage_records_clamped ON usage_records (ts) WHERE clamped IS NOT NULL;

CREATE TABLE usage_rejected (
    id TEXT PRIMARY KEY,                 -- sha256 of the record as received: a replayed batch adds no row
    ts DOUBLE PRECISION NOT NULL,        -- unix seconds when it was set aside
    source TEXT NOT NULL,                -- where it came from: 'ring' (this host's workers) or 'cluster'
    reason TEXT NOT NULL,
    record TEXT NOT NULL                 -- the record as received (JSON; bytes that are not UTF-8 escaped)
);

CREATE INDEX usage_rejected_ts ON usage_rejected (ts);
