-- Prices per model, budgets per principal, and the usage records the proxy workers produce.
--
-- Prices are currency units per million tokens (NULL: not priced, costs nothing). A budget is a period
-- ('day', 'month' or a fixed window such as '7d') with a token limit, a cost limit, or both.

ALTER TABLE models ADD COLUMN price_input DOUBLE PRECISION;
ALTER TABLE models ADD COLUMN price_output DOUBLE PRECISION;
ALTER TABLE models ADD COLUMN price_cached_input DOUBLE PRECISION;

ALTER TABLE provider_models ADD COLUMN price_input DOUBLE PRECISION;
ALTER TABLE provider_models ADD COLUMN price_output DOUBLE PRECISION;
ALTER TABLE provider_models ADD COLUMN price_cached_input DOUBLE PRECISION;

ALTER TABLE principals ADD COLUMN budget_period TEXT;
ALTER TABLE principals ADD COLUMN budget_tokens BIGINT CHECK (budget_tokens > 0);
ALTER TABLE principals ADD COLUMN budget_cost DOUBLE PRECISION CHECK (budget_cost > 0);

-- One row per request that was forwarded upstream, written once (the request id is the primary key, so
-- replaying a batch after a crash inserts nothing twice). No foreign keys: records outlive the principals,
-- keys and models they name.
CREATE TABLE usage_records (
    request_id TEXT PRIMARY KEY,
    ts DOUBLE PRECISION NOT NULL,        -- unix seconds when the response ended
    principal_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    model TEXT NOT NULL,                 -- the name the client called
    backend TEXT,                        -- the backend that answered; NULL when none did
    status INTEGER NOT NULL,             -- what the client got; 499 when it went away first
    prompt_tokens BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    cached_tokens BIGINT NOT NULL,
    total_tokens BIGINT NOT NULL,
    usage_source TEXT NOT NULL,          -- 'reported' by the engine, 'estimated' from the request, 'none'
    cost_nanos BIGINT NOT NULL,          -- 1e-9 currency units
    latency_ms DOUBLE PRECISION NOT NULL,
    ttfb_ms DOUBLE PRECISION,            -- until the response started; NULL when it never did
    budget_key BIGINT                    -- the live spend counter the worker added it to; NULL: none
);

CREATE INDEX usage_records_ts ON usage_records (ts);
CREATE INDEX usage_records_principal_ts ON usage_records (principal_id, ts);
