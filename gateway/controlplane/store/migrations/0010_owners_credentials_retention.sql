-- Who owns each configuration entry, sealed backend credentials, and usage retention.
--
-- config_owners: one row per entry a config file declared (kind is the file's section: 'backends',
-- 'principals', ... and 'routing' for the fallback); owner is 'file:<absolute path>'. An entry without
-- a row is owned by the store (created through the admin API or UI, or by a whole-document apply).
CREATE TABLE config_owners (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    owner TEXT NOT NULL,
    PRIMARY KEY (kind, name)
);

-- backends.api_key now holds the credential sealed with the secrets key ('v1:<key id>:...', see
-- gateway/controlplane/credentials.py); rows written before this migration are sealed when the store is
-- next opened. api_key_file names the file the credential was read from at apply time, as api_key_env
-- names the variable; the fingerprint tells credentials apart without showing them.
ALTER TABLE backends ADD COLUMN api_key_file TEXT;
ALTER TABLE backends ADD COLUMN api_key_fingerprint TEXT;

-- The newest time before which usage records were purged (0: never): summaries reaching further back
-- than this are incomplete, and say so.
CREATE TABLE usage_retention (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    purged_before DOUBLE PRECISION NOT NULL,
    purged_rows BIGINT NOT NULL
);

INSERT INTO usage_retention (id, purged_before, purged_rows) VALUES (1, 0, 0);
