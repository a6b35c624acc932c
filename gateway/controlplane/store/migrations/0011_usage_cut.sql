-- How an answer that had started ended short (NULL: it ended as the backend ended it): 'client' when the
-- client went away first, 'upstream' when the backend's stream broke off. Older rows have none.

ALTER TABLE usage_records ADD COLUMN cut TEXT;
