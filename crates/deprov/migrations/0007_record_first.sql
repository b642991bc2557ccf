-- Intake's first statement for a group of deletion requests (src/queue/record/first.rs): reads which
-- requests are already stored and which a kill switch blocks, and — when none is stored — creates a
-- job for each subject without an active one and inserts the requests of the subjects whose job it
-- created. One row per request, in the order given.
--
-- It is a PL/pgSQL function so that PostgreSQL plans its statement once per server connection and
-- reuses the plan (PL/pgSQL caches the plans of the statements it runs: PostgreSQL docs §43.11.2,
-- "Plan Caching"). Sent as SQL text, the statement was planned at every group — deprov cannot keep
-- prepared statements through a transaction pooler — and planning cost about as much as running it
-- (pg_stat_statements: 0.52 ms of plan and 0.61 ms of execution per group of nine requests).
--
-- The function writes only under the caller's transaction and its SET LOCAL bounds; it commits
-- nothing itself. The deletion_requests.job_id foreign key is checked at the end of the statement,
-- when the jobs it created are visible.
CREATE FUNCTION deprov.record_first(
    p_ids uuid[], p_sources text[], p_bases text[], p_dedup_keys text[], p_kinds text[],
    p_subjects text[], p_external_ids text[], p_reasons text[], p_fingerprints text[],
    p_tenants text[], p_job_ids uuid[], p_first_of_subject boolean[], p_max_attempts integer)
RETURNS TABLE (request_id uuid, stored_fingerprint text, stored_job uuid, stored_state text,
               blocked boolean, created_state text, inserted boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH s AS (
        SELECT s.*,
               EXISTS (SELECT 1 FROM deprov.kill_switch WHERE engaged)
               OR EXISTS (SELECT 1 FROM deprov.kill_switch_scopes k
                          WHERE k.engaged
                            AND ((k.scope = 'source' AND k.key = s.source)
                                 OR (k.scope = 'tenant' AND k.key = s.tenant))) AS held
        FROM unnest(p_ids, p_sources, p_bases, p_dedup_keys, p_kinds, p_subjects, p_external_ids,
                    p_reasons, p_fingerprints, p_tenants, p_job_ids, p_first_of_subject)
             WITH ORDINALITY AS s(id, source, basis, dedup_key, kind, subject, external_id, reason,
                                  fingerprint, tenant, job_id, first_of_subject, n)),
    -- Probed by primary key for each request (LATERAL … OFFSET 0 is not flattened into a join):
    -- the cached generic plan does not know the group's size, and must not scan the table.
    stored AS (
        SELECT s.n, r.fingerprint, r.job_id, r.state
        FROM s CROSS JOIN LATERAL (
            SELECT r.fingerprint, r.job_id, j.state
            FROM deprov.deletion_requests r
            JOIN deprov.jobs j ON j.id = r.job_id
            WHERE r.id = s.id
            OFFSET 0) r),
    created AS (
        INSERT INTO deprov.jobs (id, subject_kind, subject, tenant_id, state, step, max_attempts)
        SELECT s.job_id, s.kind, s.subject, s.tenant,
               CASE WHEN s.held THEN 'held' ELSE 'queued' END,
               CASE WHEN s.kind = 'tenant' THEN 'soft_delete' ELSE 'resolve' END,
               p_max_attempts
        FROM s
        WHERE s.first_of_subject AND NOT EXISTS (SELECT 1 FROM stored)
        ORDER BY s.n
        ON CONFLICT (subject_kind, subject) WHERE state IN ('queued', 'held', 'running') DO NOTHING
        RETURNING id, state),
    inserted AS (
        INSERT INTO deprov.deletion_requests (id, source, dedup_basis, dedup_key, subject_kind,
            subject, external_id, reason, fingerprint, job_id, received_while_held)
        SELECT s.id, s.source, s.basis, s.dedup_key, s.kind, s.subject, s.external_id, s.reason,
               s.fingerprint, c.id, s.held
        FROM s JOIN created c ON c.id = s.job_id
        ORDER BY s.n
        ON CONFLICT (id) DO NOTHING
        RETURNING id)
    SELECT s.id, st.fingerprint, st.job_id, st.state, s.held, c.state, i.id IS NOT NULL
    FROM s
    LEFT JOIN stored st ON st.n = s.n
    LEFT JOIN created c ON c.id = s.job_id
    LEFT JOIN inserted i ON i.id = s.id
    ORDER BY s.n;
END
$$;
