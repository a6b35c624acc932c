-- How many targets a request tried before its answer (1 when the first one answered): failovers.

ALTER TABLE usage_records ADD COLUMN attempts INTEGER;
