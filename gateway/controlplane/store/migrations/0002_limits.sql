-- Rate limits: per principal (all its keys together), per key, and per principal and model name.
--
-- Each limit is a nullable BIGINT: NULL means unlimited. ADD COLUMN takes one column per statement and
-- no DEFAULT, which SQLite and PostgreSQL both accept; existing rows read as unlimited.

ALTER TABLE principals ADD COLUMN limit_rpm BIGINT CHECK (limit_rpm > 0);
ALTER TABLE principals ADD COLUMN limit_tpm BIGINT CHECK (limit_tpm > 0);
ALTER TABLE principals ADD COLUMN limit_concurrency BIGINT CHECK (limit_concurrency > 0);

ALTER TABLE api_keys ADD COLUMN limit_rpm BIGINT CHECK (limit_rpm > 0);
ALTER TABLE api_keys ADD COLUMN limit_tpm BIGINT CHECK (limit_tpm > 0);
ALTER TABLE api_keys ADD COLUMN limit_concurrency BIGINT CHECK (limit_concurrency > 0);

CREATE TABLE principal_model_limits (
    principal_id TEXT NOT NULL REFERENCES principals (id) ON DELETE CASCADE,
    model TEXT NOT NULL,                 -- a name clients call: frontend model, alias or provider model
    limit_rpm BIGINT CHECK (limit_rpm > 0),
    limit_tpm BIGINT CHECK (limit_tpm > 0),
    limit_concurrency BIGINT CHECK (limit_concurrency > 0),
    PRIMARY KEY (principal_id, model)
);
