-- Signed webhook senders: a subject kind resolved by a source's lookup statement, and a record of
-- verified deliveries that start nothing.
-- 1. A third subject kind: 'lookup' = "{source}:{value}", resolved by the worker with that source's
--    tenant_lookup statement (as 'vercel_installation' is with [vercel] tenant_lookup).
ALTER TABLE deprov.jobs DROP CONSTRAINT jobs_subject_kind_check;
ALTER TABLE deprov.jobs ADD CONSTRAINT jobs_subject_kind_check
    CHECK (subject_kind IN ('tenant', 'vercel_installation', 'lookup'));
ALTER TABLE deprov.deletion_requests DROP CONSTRAINT deletion_requests_subject_kind_check;
ALTER TABLE deprov.deletion_requests ADD CONSTRAINT deletion_requests_subject_kind_check
    CHECK (subject_kind IN ('tenant', 'vercel_installation', 'lookup'));

-- 2. Verified deliveries whose event type does not mean "delete": acknowledged, recorded here, and
--    nothing started. The id is the same deterministic UUIDv5 a deletion request would get, so a
--    retried delivery counts as a duplicate instead of a second row.
CREATE TABLE deprov.ignored_deliveries (
    id                uuid PRIMARY KEY,
    source            text NOT NULL,
    event_type        text,
    dedup_key         text NOT NULL,
    received_at       timestamptz NOT NULL DEFAULT now(),
    duplicates        integer NOT NULL DEFAULT 0,
    last_duplicate_at timestamptz
);
