-- The usage tag of the routing rule that decided a request (NULL when no rule with a tag did), so usage
-- can be grouped by it. Older rows have none.

ALTER TABLE usage_records ADD COLUMN tag TEXT;
