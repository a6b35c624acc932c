-- The usage table partitioned by time (PostgreSQL only; see gateway/controlplane/store/_partitions.py):
-- declarative range partitions by ts, one per UTC day, which the control worker creates days ahead, and a
-- default partition as a safety net for a record no day's partition holds; retention drops whole
-- partitions instead of deleting rows, and an insert touches one partition's indexes.
--
-- The table as it was becomes the partition of everything before the next midnight (or after its newest
-- record, if later): its rows stay where they are and its indexes become the partitions' (one new one,
-- the key below, is built for it). A partitioned table's unique key must hold the partition key, so the
-- key is (request_id, ts): a record is written once, with one end time, so a replayed batch still inserts
-- nothing twice.
ALTER TABLE usage_records RENAME TO usage_records_before;
ALTER TABLE usage_records_before DROP CONSTRAINT usage_records_pkey;
ALTER INDEX usage_records_ts RENAME TO usage_records_before_ts;
ALTER INDEX usage_records_principal_ts RENAME TO usage_records_before_principal_ts;
ALTER INDEX usage_records_client_request_id RENAME TO usage_records_before_client_request_id;
ALTER INDEX usage_records_clamped RENAME TO usage_records_before_clamped;

CREATE TABLE usage_records (LIKE usage_records_before INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (ts);
ALTER TABLE usage_records ADD PRIMARY KEY (request_id, ts);
CREATE INDEX usage_records_ts ON usage_records (ts);
CREATE INDEX usage_records_principal_ts ON usage_records (principal_id, ts);
CREATE INDEX usage_records_client_request_id ON usage_records (client_request_id)
    WHERE client_request_id IS NOT NULL;
CREATE INDEX usage_records_clamped ON usage_records (ts) WHERE clamped IS NOT NULL;

-- One line: statements are split at a semicolon that ends a line.
DO $$ BEGIN EXECUTE 'ALTER TABLE usage_records ATTACH PARTITION usage_records_before FOR VALUES FROM (MINVALUE) TO (' || greatest(floor(extract(epoch FROM now()) / 86400) + 1, (SELECT floor(COALESCE(max(ts), 0) / 86400) + 1 FROM usage_records_before)) * 86400 || ')'; END $$;

CREATE TABLE usage_records_default PARTITION OF usage_records DEFAULT;
