-- deprov's own state: deletion requests, jobs (the queue), and the kill switch.
-- Everything lives in schema "deprov" so it can share a database with the application.
CREATE SCHEMA IF NOT EXISTS deprov;

-- One row per deletion job. A job is the unit the worker leases; several requests may attach to it.
CREATE TABLE deprov.jobs (
    id               uuid PRIMARY KEY,
    -- What the job deletes: a tenant key, or a Vercel installation id resolved by the worker.
    subject_kind     text NOT NULL CHECK (subject_kind IN ('tenant', 'vercel_installation')),
    subject          text NOT NULL,
    -- The tenant key once known (equal to subject for subject_kind = 'tenant').
    tenant_id        text,
    state            text NOT NULL CHECK (state IN ('queued', 'held', 'running', 'completed', 'failed')),
    step             text NOT NULL DEFAULT 'soft_delete'
                     CHECK (step IN ('resolve', 'soft_delete', 'hard_delete', 'done')),
    attempts         integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL CHECK (max_attempts > 0),
    last_error       text,
    run_after        timestamptz NOT NULL DEFAULT now(),
    lease_owner      text,
    lease_expires_at timestamptz,
    heartbeat_at     timestamptz,
    -- Where the hard delete resumes: {"plan": hash, "step": n, "last_key": [...]}.
    checkpoint       jsonb,
    progress         jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CHECK (state <> 'running' OR (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL))
);

-- At most one active job per subject: retries and different requests for the same tenant attach to it.
CREATE UNIQUE INDEX jobs_one_active_per_subject
    ON deprov.jobs (subject_kind, subject) WHERE state IN ('queued', 'held', 'running');
CREATE INDEX jobs_claimable ON deprov.jobs (run_after, created_at) WHERE state = 'queued';
CREATE INDEX jobs_leases ON deprov.jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX jobs_by_state ON deprov.jobs (state, created_at);

-- Every deletion request received, under its deterministic id (UUIDv5). Never deleted by deprov.
CREATE TABLE deprov.deletion_requests (
    id                  uuid PRIMARY KEY,
    source              text NOT NULL,
    dedup_basis         text NOT NULL
                        CHECK (dedup_basis IN ('external_id', 'idempotency_key', 'tenant_id', 'installation_id')),
    dedup_key           text NOT NULL,
    subject_kind        text NOT NULL CHECK (subject_kind IN ('tenant', 'vercel_installation')),
    subject             text NOT NULL,
    external_id         text,
    reason              text,
    -- sha256 of the request's meaningful content; a reused Idempotency-Key with another body is refused.
    fingerprint         text NOT NULL,
    job_id              uuid NOT NULL REFERENCES deprov.jobs (id),
    received_at         timestamptz NOT NULL DEFAULT now(),
    received_while_held boolean NOT NULL DEFAULT false,
    duplicates          integer NOT NULL DEFAULT 0,
    last_duplicate_at   timestamptz
);
CREATE INDEX deletion_requests_job ON deprov.deletion_requests (job_id);

-- The global kill switch: one row. While engaged no destructive statement starts.
CREATE TABLE deprov.kill_switch (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    engaged    boolean NOT NULL DEFAULT false,
    reason     text,
    changed_by text,
    version    bigint NOT NULL DEFAULT 0,
    changed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO deprov.kill_switch DEFAULT VALUES;
