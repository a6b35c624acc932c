-- Routing: model pools, frontend models' rules, backends' flow-control and probe settings, and the
-- deployment-wide fallback. Small documents that are always read whole, so they are kept as JSON in their
-- configuration-file form (gateway.controlplane.routing_config), validated by the file parser before any
-- write. Rebuilt wholesale by every apply, like the link tables.

CREATE TABLE routing_entries (
    kind TEXT NOT NULL,                  -- 'pool', 'rules' (of a frontend model), 'backend', 'setting'
    name TEXT NOT NULL,                  -- the pool, model, backend or setting it belongs to
    body TEXT NOT NULL,                  -- JSON
    PRIMARY KEY (kind, name)
);
