-- The control plane's configuration store: backends, provider and frontend models, roles, principals,
-- API keys, and the one-row revision counter the control worker polls.
--
-- Portable SQL: the same file is applied by SQLite and by PostgreSQL. Only TEXT, INTEGER, BIGINT and
-- DOUBLE PRECISION columns; ids are generated in Python; no AUTOINCREMENT, no SQLite-only syntax.
-- Statements are split on ';' at the end of a line, so no string literal may contain one.

CREATE TABLE config_revision (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    revision BIGINT NOT NULL
);

INSERT INTO config_revision (id, revision) VALUES (1, 0);

CREATE TABLE backends (
    name TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    protocol TEXT NOT NULL,
    api_key TEXT,                        -- literal key, or the value api_key_env held at apply time
    api_key_env TEXT,                    -- the variable's name, kept so that export can write it back
    connect_timeout DOUBLE PRECISION NOT NULL,
    first_byte_timeout DOUBLE PRECISION NOT NULL,
    read_timeout DOUBLE PRECISION NOT NULL
);

CREATE TABLE provider_models (
    name TEXT PRIMARY KEY
);

CREATE TABLE provider_model_backends (
    provider_model TEXT NOT NULL REFERENCES provider_models (name) ON DELETE CASCADE,
    seq INTEGER NOT NULL,                -- order of preference within the provider model
    backend TEXT NOT NULL REFERENCES backends (name) ON DELETE CASCADE,
    upstream_model TEXT NOT NULL,
    PRIMARY KEY (provider_model, seq)
);

CREATE TABLE models (
    name TEXT PRIMARY KEY
);

CREATE TABLE model_chain (
    model TEXT NOT NULL REFERENCES models (name) ON DELETE CASCADE,
    seq INTEGER NOT NULL,                -- fallback order
    provider_model TEXT NOT NULL REFERENCES provider_models (name) ON DELETE CASCADE,
    PRIMARY KEY (model, seq)
);

CREATE TABLE model_aliases (
    alias TEXT PRIMARY KEY,
    model TEXT NOT NULL REFERENCES models (name) ON DELETE CASCADE
);

CREATE TABLE roles (
    name TEXT PRIMARY KEY
);

CREATE TABLE role_permissions (
    role TEXT NOT NULL REFERENCES roles (name) ON DELETE CASCADE,
    permission TEXT NOT NULL,
    PRIMARY KEY (role, permission)
);

CREATE TABLE principals (
    id TEXT PRIMARY KEY,                 -- stable across applies: principals are matched by name
    name TEXT NOT NULL UNIQUE
);

CREATE TABLE principal_roles (
    principal_id TEXT NOT NULL REFERENCES principals (id) ON DELETE CASCADE,
    role TEXT NOT NULL REFERENCES roles (name) ON DELETE CASCADE,
    PRIMARY KEY (principal_id, role)
);

CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    name TEXT UNIQUE,                    -- optional for CLI-created keys; required for keys from a file
    principal_id TEXT NOT NULL REFERENCES principals (id) ON DELETE CASCADE,
    key_hash TEXT NOT NULL UNIQUE,       -- 64 lowercase hex chars of the keyed blake3 digest; never the secret
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION,         -- unix seconds; NULL: never
    revoked_at DOUBLE PRECISION,         -- unix seconds; NULL: active
    managed_by TEXT NOT NULL             -- 'file': desired state of the config file; 'cli': kept by apply
);

CREATE INDEX api_keys_principal_id ON api_keys (principal_id);
