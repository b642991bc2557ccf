//! deprov's durable queue in PostgreSQL (schema `deprov`, see `migrations/`).
//!
//! - [`intake`]: records deletion requests under deterministic IDs and attaches them to jobs.
//! - [`ignored`]: verified webhook deliveries whose event type does not mean delete.
//! - [`jobs`]: job rows, leases (`FOR UPDATE SKIP LOCKED`), heartbeats, checkpoints and final states.
//! - [`kill_switch`]: the global stop for all destructive work.
//!
//! Every function takes an executor or a connection; callers own transaction boundaries.

pub mod ignored;
pub mod intake;
pub mod jobs;
pub mod kill_switch;

pub use jobs::{Job, JobState};
