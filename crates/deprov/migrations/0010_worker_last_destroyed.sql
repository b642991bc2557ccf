-- When each worker's last destructive statement ended (a batch, a soft delete, a whole cascade, a
-- sweep, the SET NULL presets), on the state database's clock: the worker keeps the moment in
-- memory and writes it with its heartbeat and with each kill switch acknowledgement, as
-- clock_timestamp() minus the time since (src/queue/workers.rs). Read beside observed_at it answers
-- "did the switch take effect?": an acknowledgement is recorded only once no destructive statement
-- started on an older reading is still running (src/worker/presence.rs), so a worker's
-- last_destroyed_at written with that acknowledgement is the end of its last statement before it.
-- NULL: the worker has run no destructive statement since it started.
ALTER TABLE deprov.workers ADD COLUMN last_destroyed_at timestamptz;
