-- Budgets per principal and per key, several of each (one per period), each with its alert thresholds;
-- and the usage record's lists of the live spend counters a request was added to (record version 7).
--
-- A principal's one budget moves from its columns (0003) into principal_budgets, with the alert
-- thresholds that were kept as an 'alerts' routing entry by the principal's name (0008); those columns and
-- entries go. A budget row belongs to its principal or key and goes with it.

CREATE TABLE principal_budgets (
    principal_id TEXT NOT NULL REFERENCES principals (id) ON DELETE CASCADE,
    period TEXT NOT NULL,                -- 'day', 'month' or a fixed window such as '7d'; one budget each
    seq INTEGER NOT NULL,                -- the order the configuration lists them in
    tokens BIGINT CHECK (tokens > 0),
    cost DOUBLE PRECISION CHECK (cost > 0),
    alerts TEXT,                         -- JSON array of fractions of the budget to alert at; NULL: none
    PRIMARY KEY (principal_id, period)
);

CREATE TABLE key_budgets (
    key_id TEXT NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
    period TEXT NOT NULL,
    seq INTEGER NOT NULL,
    tokens BIGINT CHECK (tokens > 0),
    cost DOUBLE PRECISION CHECK (cost > 0),
    alerts TEXT,
    PRIMARY KEY (key_id, period)
);

INSERT INTO principal_budgets (principal_id, period, seq, tokens, cost, alerts)
SELECT p.id, p.budget_period, 0, p.budget_tokens, p.budget_cost,
       (SELECT r.body FROM routing_entries r WHERE r.kind = 'alerts' AND r.name = p.name)
FROM principals p
WHERE p.budget_period IS NOT NULL AND (p.budget_tokens IS NOT NULL OR p.budget_cost IS NOT NULL);

DELETE FROM routing_entries WHERE kind = 'alerts';

ALTER TABLE principals DROP COLUMN budget_period;
ALTER TABLE principals DROP COLUMN budget_tokens;
ALTER TABLE principals DROP COLUMN budget_cost;

-- JSON arrays of unsigned 64-bit counter keys: the principal's budgets' and the key's own. Rows written
-- before keep their one counter in budget_key (of a bucket table that no longer exists).
ALTER TABLE usage_records ADD COLUMN budget_keys TEXT;
ALTER TABLE usage_records ADD COLUMN key_budget_keys TEXT;
