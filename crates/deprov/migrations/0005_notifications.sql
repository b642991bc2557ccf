-- Failure and completion notifications: a transactional outbox.
--
-- A trigger on deprov.jobs writes one event row in the same transaction as every change of a job's
-- state to completed, failed or cancelled, whichever code path makes it (worker hand-back, operator
-- cancel, reconcile): the event commits with the state change or not at all, so nothing is lost on
-- crash. The dispatcher (src/notify) delivers rows and records the outcome here.

CREATE TABLE deprov.outbox (
    -- Also the `webhook-id` of every delivery attempt of the event (receivers deduplicate on it).
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    -- job.completed | job.failed | job.cancelled
    event_type      text NOT NULL,
    job_id          uuid NOT NULL,
    -- The whole JSON body sent (Standard Webhooks shape: type, timestamp, data), fixed at commit.
    payload         jsonb NOT NULL,
    -- pending: to deliver (or being delivered); delivered: a 2xx was received; dead: max_attempts or
    -- max_age reached (see `deprov notifications list --state dead`); skipped: its event type is not
    -- in [notifications] events.
    state           text NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'delivered', 'dead', 'skipped')),
    -- Delivery attempts started (a claim counts one).
    attempts        integer NOT NULL DEFAULT 0,
    -- Not claimable before this; a claim pushes it past the request timeout (the claim's lease).
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    -- The dispatcher that made the latest claim.
    claimed_by      text,
    -- HTTP status of the latest attempt (NULL: no response: refused, timed out).
    last_status     integer,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- When the event was delivered, went dead or was skipped.
    finished_at     timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_due ON deprov.outbox (next_attempt_at) WHERE state = 'pending';
CREATE INDEX outbox_job ON deprov.outbox (job_id);
CREATE INDEX outbox_state_created ON deprov.outbox (state, created_at);

CREATE FUNCTION deprov.outbox_job_event() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    utc constant text := 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"';
BEGIN
    INSERT INTO deprov.outbox (event_type, job_id, payload)
    VALUES ('job.' || NEW.state, NEW.id, jsonb_build_object(
        'type', 'job.' || NEW.state,
        'timestamp', to_char(coalesce(NEW.finished_at, now()) AT TIME ZONE 'UTC', utc),
        'data', jsonb_build_object(
            'job_id', NEW.id,
            'state', NEW.state,
            'tenant_id', NEW.tenant_id,
            'subject_kind', NEW.subject_kind,
            'subject', NEW.subject,
            'attempts', NEW.attempts,
            'error', NEW.last_error,
            'rows_deleted', coalesce((NEW.progress ->> 'rows_deleted')::numeric::bigint, 0),
            'note', NEW.progress ->> 'note',
            'created_at', to_char(NEW.created_at AT TIME ZONE 'UTC', utc),
            'finished_at', to_char(coalesce(NEW.finished_at, now()) AT TIME ZONE 'UTC', utc),
            'requests', coalesce((
                SELECT jsonb_agg(jsonb_build_object('id', r.id, 'source', r.source,
                                                    'external_id', r.external_id)
                                 ORDER BY r.received_at)
                FROM (SELECT id, source, external_id, received_at FROM deprov.deletion_requests
                      WHERE job_id = NEW.id ORDER BY received_at LIMIT 100) r), '[]'::jsonb))));
    RETURN NULL;
END $$;

-- Only a change of state fires it: a finished job whose other columns change again emits nothing.
CREATE TRIGGER jobs_outbox AFTER UPDATE OF state ON deprov.jobs
FOR EACH ROW
WHEN (NEW.state IN ('completed', 'failed', 'cancelled') AND OLD.state IS DISTINCT FROM NEW.state)
EXECUTE FUNCTION deprov.outbox_job_event();
