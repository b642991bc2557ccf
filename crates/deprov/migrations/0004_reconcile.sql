-- Reconcile, grace period and undo.

-- When the worker was about to run the job's first hard-delete statement (set once, by the worker
-- holding the lease, before that statement). From then on the soft delete cannot be undone: an
-- undo or a reinstall is refused and says so.
ALTER TABLE deprov.jobs ADD COLUMN hard_delete_started_at timestamptz;
-- When the soft delete was undone (`deprov jobs undo`, a reinstall): the undo statements committed
-- on the target and the job was cancelled.
ALTER TABLE deprov.jobs ADD COLUMN undone_at timestamptz;

-- Reinstalls and reconcile find a tenant's jobs by the requests' subject and by the resolved tenant.
CREATE INDEX deletion_requests_subject ON deprov.deletion_requests (subject_kind, subject);
CREATE INDEX jobs_tenant ON deprov.jobs (tenant_id) WHERE tenant_id IS NOT NULL;
