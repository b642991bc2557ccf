//! deprov deletes a SaaS tenant's data safely.
//!
//! Requests arrive over HTTP ([`http`]) and are recorded under deterministic IDs in a deduplicated
//! PostgreSQL queue ([`queue`]). A [`worker`] leases jobs, soft-deletes the tenant, then hard-deletes it
//! with the [`engine`]: leaves of the foreign-key graph first, in short, checkpointed batches with
//! server-side `lock_timeout` and `statement_timeout`. A kill switch stops all destruction at once.
//! Database access goes through isolated, bounded pools ([`db`]); all dynamic SQL through [`sql`];
//! Prometheus metrics through [`telemetry`]. The operator's configured SQL is checked against the
//! target database at start ([`sqlcheck`]).
//! Signed senders (Standard Webhooks, Stripe, GitHub, Shopify, Slack, Vercel) are verified by
//! [`sources`].
//! Finished jobs are announced to an HTTP callback through an outbox ([`notify`]).
//! The demo, the benchmarks and the throwaway servers of the tests are crates of their own
//! (`deprov-demo`, the root package `deprov-lab`, `deprov-testkit`).

pub mod app;
pub mod cli;
pub mod config;
pub mod db;
pub mod engine;
pub mod http;
pub mod ids;
pub mod notify;
pub mod queue;
pub mod readiness;
pub mod sources;
pub mod sql;
pub mod sqlcheck;
pub mod sqlstate;
pub mod telemetry;
pub mod worker;

#[cfg(test)]
mod layout_tests;
