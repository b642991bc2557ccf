-- deprov.job_blocked_by in PL/pgSQL, same body and result. The worker calls it before every
-- destructive statement (src/queue/kill_switch.rs, check_job). As a LANGUAGE sql function it is not
-- inlined (its body has sub-selects), so PostgreSQL planned that body again at every call; PL/pgSQL
-- keeps the plan of its expression for the session (PostgreSQL docs §43.11.2, "Plan Caching").
-- STABLE: it reads with the snapshot of the statement that calls it (§38.7, "Function Volatility
-- Categories"), so check_job still reads every switch in one snapshot.
CREATE OR REPLACE FUNCTION deprov.job_blocked_by(job uuid) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce(
        (SELECT 'global' FROM deprov.kill_switch WHERE engaged),
        (SELECT 'tenant:' || s.key FROM deprov.jobs j
           JOIN deprov.kill_switch_scopes s ON s.scope = 'tenant' AND s.engaged AND s.key = j.tenant_id
          WHERE j.id = job),
        (SELECT 'source:' || s.key FROM deprov.deletion_requests r
           JOIN deprov.kill_switch_scopes s ON s.scope = 'source' AND s.engaged AND s.key = r.source
          WHERE r.job_id = job ORDER BY s.key LIMIT 1));
END
$$;
