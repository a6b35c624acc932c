-- The request id a client sent in x-request-id, kept beside the gateway's own (which stays the key:
-- clients reuse their ids across retries, and each try is a request of its own).

ALTER TABLE usage_records ADD COLUMN client_request_id TEXT;
