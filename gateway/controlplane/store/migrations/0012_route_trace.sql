-- The route trace of a request (record version 6): the routing rule that decided, each attempt as JSON
-- ([backend, provider model, outcome, ttfb ms, duration ms]), and the OpenTelemetry ids when sampled.
-- Older rows have none.

ALTER TABLE usage_records ADD COLUMN rule TEXT;
ALTER TABLE usage_records ADD COLUMN trace TEXT;
ALTER TABLE usage_records ADD COLUMN span TEXT;

-- `gateway requests show ID` and GET /admin/requests/ID look a request up by the id its client got, which
-- is the client's own x-request-id when it sent one.
CREATE INDEX usage_records_client_request_id ON usage_records (client_request_id)
    WHERE client_request_id IS NOT NULL;
