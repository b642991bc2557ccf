-- Operators on incident night: scoped kill switches, their history, live workers and what each has
-- acknowledged, and the append-only audit log.

-- One change counter over every scope. Every change locks this row (UPDATE), so changes are
-- serialized and a snapshot that shows change N shows every change before it: a worker that has
-- observed version N has observed every scope as of N. The global switch's own columns (engaged,
-- reason, changed_by, version, changed_at) keep their meaning: `SELECT engaged FROM
-- deprov.kill_switch` still answers "is the global switch engaged".
ALTER TABLE deprov.kill_switch ADD COLUMN latest_version bigint NOT NULL DEFAULT 0;
UPDATE deprov.kill_switch SET latest_version = version;

-- Switches narrower than global: every job of one source (any of its requests came from it) or of
-- one tenant. A row is kept after release (engaged = false) so its release can be acknowledged.
CREATE TABLE deprov.kill_switch_scopes (
    scope      text NOT NULL CHECK (scope IN ('source', 'tenant')),
    key        text NOT NULL CHECK (key <> ''),
    engaged    boolean NOT NULL,
    reason     text NOT NULL,
    changed_by text NOT NULL,
    -- deprov.kill_switch.latest_version when this row last changed.
    version    bigint NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);
CREATE INDEX kill_switch_scopes_engaged ON deprov.kill_switch_scopes (scope, key) WHERE engaged;

-- Every change of every scope, under its version. Never updated or deleted.
CREATE TABLE deprov.kill_switch_history (
    version    bigint PRIMARY KEY,
    scope      text NOT NULL CHECK (scope IN ('global', 'source', 'tenant')),
    key        text,
    engaged    boolean NOT NULL,
    reason     text NOT NULL,
    actor      text NOT NULL,
    jobs_moved bigint NOT NULL DEFAULT 0,
    changed_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((scope = 'global') = (key IS NULL))
);
INSERT INTO deprov.kill_switch_history (version, scope, key, engaged, reason, actor, changed_at)
SELECT version, 'global', NULL, engaged, coalesce(reason, ''), coalesce(changed_by, 'unknown'), changed_at
FROM deprov.kill_switch WHERE version > 0;

-- Worker processes: a heartbeat defines "live", observed_version what each has acknowledged.
CREATE TABLE deprov.workers (
    id               text PRIMARY KEY,
    started_at       timestamptz NOT NULL DEFAULT now(),
    heartbeat_at     timestamptz NOT NULL DEFAULT now(),
    -- Live until then unless the next heartbeat extends it (now() + [worker] stale_after).
    live_until       timestamptz NOT NULL,
    -- The highest kill switch version this worker has read and acts on (see worker::presence).
    observed_version bigint NOT NULL DEFAULT 0,
    observed_at      timestamptz,
    -- Whether it holds a LISTEN connection (false: it learns of changes by polling).
    listening        boolean NOT NULL DEFAULT false,
    stopped_at       timestamptz
);

-- Which engaged switch blocks a job: 'global', 'tenant:<key>', 'source:<key>', or NULL.
CREATE FUNCTION deprov.job_blocked_by(job uuid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT 'global' FROM deprov.kill_switch WHERE engaged),
        (SELECT 'tenant:' || s.key FROM deprov.jobs j
           JOIN deprov.kill_switch_scopes s ON s.scope = 'tenant' AND s.engaged AND s.key = j.tenant_id
          WHERE j.id = job),
        (SELECT 'source:' || s.key FROM deprov.deletion_requests r
           JOIN deprov.kill_switch_scopes s ON s.scope = 'source' AND s.engaged AND s.key = r.source
          WHERE r.job_id = job ORDER BY s.key LIMIT 1))
$$;

-- Operator actions (kill switch changes, job cancel / retry / resume). Append-only: a trigger refuses
-- UPDATE, DELETE and TRUNCATE whoever runs them.
CREATE TABLE deprov.audit_log (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    actor   text NOT NULL,
    action  text NOT NULL,
    target  text,
    reason  text NOT NULL,
    details jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX audit_log_at ON deprov.audit_log (at DESC, id DESC);

CREATE FUNCTION deprov.audit_log_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'deprov.audit_log is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON deprov.audit_log
    FOR EACH ROW EXECUTE FUNCTION deprov.audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON deprov.audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION deprov.audit_log_append_only();

-- Operators cancel a job: a queued or held job at once (state 'cancelled'), a running one at its next
-- batch boundary (cancel_requested_at, read by the worker before every destructive statement).
ALTER TABLE deprov.jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE deprov.jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('queued', 'held', 'running', 'completed', 'failed', 'cancelled'));
ALTER TABLE deprov.jobs ADD COLUMN cancel_requested_at timestamptz;
