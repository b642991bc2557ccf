-- Idle workers that LISTEN on deprov_jobs claim a job as soon as one may be claimed, instead of at
-- their next poll ([worker] poll_interval): a job created queued, or moved back to queued (a kill
-- switch released, a retry handed back, an operator's retry). NOTIFY is delivered at commit, and
-- PostgreSQL sends one notification per channel and payload per transaction, however many rows
-- (PostgreSQL docs, NOTIFY). Workers without a LISTEN connection (behind a transaction pooler)
-- poll as before; a notification that finds nothing due costs one claim query.
CREATE FUNCTION deprov.wake_workers() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('deprov_jobs', '');
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_wake_insert AFTER INSERT ON deprov.jobs
FOR EACH ROW
WHEN (NEW.state = 'queued')
EXECUTE FUNCTION deprov.wake_workers();

CREATE TRIGGER jobs_wake_queued AFTER UPDATE OF state ON deprov.jobs
FOR EACH ROW
WHEN (NEW.state = 'queued' AND OLD.state IS DISTINCT FROM NEW.state)
EXECUTE FUNCTION deprov.wake_workers();
