//! deprov's durable queue in PostgreSQL (schema `deprov`, see `migrations/`).
//!
//! - [`intake`]: records deletion requests under deterministic IDs and attaches them to jobs.
//! - [`ignored`]: verified webhook deliveries whose event type does not mean delete.
//! - [`jobs`]: job rows, leases (`FOR UPDATE SKIP LOCKED`), heartbeats, checkpoints and final states.
//! - [`kill_switch`]: stops for destructive work: global, per source, per tenant, versioned.
//! - [`workers`]: live worker processes and the kill switch version each acknowledged.
//! - [`audit`]: the append-only log of operator actions.
//! - [`operator`]: operators cancel and retry jobs.
//! - [`tokens`]: named operator tokens with roles, stored as SHA-256 digests.
//! - [`reconcile`]: what queued up during an incident, and its paced release.
//! - [`grace`]: the grace period: undo of a soft delete, reinstalls.
//! - [`sessions`]: sessions of the operator console.
//! - [`search`]: the console's reads: jobs by filter, a job's requests, the queue's age.
//!
//! Every function takes an executor or a connection; callers own transaction boundaries.

pub mod audit;
pub mod grace;
pub mod group_commit;
pub mod ignored;
pub mod intake;
pub mod jobs;
pub mod kill_switch;
pub mod operator;
pub mod reconcile;
pub mod record;
pub mod search;
pub mod sessions;
pub mod tokens;
pub mod workers;

pub use jobs::{Job, JobState};
