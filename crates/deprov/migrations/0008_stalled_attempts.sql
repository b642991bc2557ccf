-- A job fails on attempts that advanced nothing, not on every claim: a job whose runs keep
-- deleting (its checkpoint moves on) but keep being cut short (a worker killed, a connection
-- dropped, a lock timeout after some batches) is not failed part-way.
--
-- stalled_attempts counts the claims since the job last advanced (src/queue/jobs.rs): every claim
-- adds one, and the heartbeat that records an advance (the soft delete committed, a checkpoint
-- further on, more rows deleted) sets it back to 0 in the same UPDATE, so a run that is killed
-- after it advanced has already cleared it. A run ends `failed` when it fails with the count at
-- max_attempts; a claim that finds the count above it (its runs all died without reporting back)
-- fails the job at once. attempts stays the total of claims.
ALTER TABLE deprov.jobs ADD COLUMN stalled_attempts integer NOT NULL DEFAULT 0;
-- Active jobs keep the count they had: none gets more runs without progress than it had left.
UPDATE deprov.jobs SET stalled_attempts = attempts WHERE state IN ('queued', 'held', 'running');
