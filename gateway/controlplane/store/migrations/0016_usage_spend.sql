-- Spend kept per budget window (see gateway/controlplane/store/_spend.py): what budgets and shares read,
-- instead of summing usage_records over each window, whose cost grew with the table.
--
-- One row per (owner, period, window, held): owner is a principal's id, or 'key:' and a key's id; period a
-- budget period of that owner ('day', 'month', '6h', ...); held 0 for every stored record of the owner
-- that ended in [window_start, window_end), and a live counter's key (the unsigned 64-bit key as signed,
-- never 0) for those of them whose record names that counter (budget_keys of a principal's record,
-- key_budget_keys of a key's). Updated in the transaction that stores the records, with the records
-- actually inserted only; dropped with the window's records when retention purges them, and with the
-- budget when a configuration takes it away.
CREATE TABLE usage_spend (
    owner TEXT NOT NULL,
    period TEXT NOT NULL,
    window_start DOUBLE PRECISION NOT NULL,
    held BIGINT NOT NULL,
    window_end DOUBLE PRECISION NOT NULL,
    tokens BIGINT NOT NULL,
    cost_nanos BIGINT NOT NULL,
    PRIMARY KEY (owner, period, window_start, held)
);

-- Retention drops the windows that ended before what it purged.
CREATE INDEX usage_spend_end ON usage_spend (window_end);
