//! The engine and worker against real PostgreSQL: equality with the cascade, blockers, the kill
//! switch, retries, and resume after the worker is killed.

// Tests set up and inspect databases directly (clippy.toml's rules are the service's).
#![allow(clippy::disallowed_methods)]

mod absorb;
mod absorb_root;
mod attempts;
mod batch_bound;
mod blocks;
mod cascade_check;
mod covered;
mod crash_resume;
mod cycles;
mod deferred_commit;
mod deferred_stop;
mod demo_env;
mod demo_equivalence;
mod duty_cycle;
mod first_batches;
mod grace;
mod harness;
mod held_chains;
mod incarnation;
mod index_pass;
mod job_wake;
mod join_table;
mod key_prefix;
mod keyless;
mod kill_switch_ack;
mod late_lookup;
mod notify;
mod operator_jobs;
mod parent_lookahead;
mod plan_report;
mod precheck_reads;
mod reconcile;
mod row_order;
mod schema_edges;
mod skew;
mod stalled;
mod statement_errors;
mod sweep_kill;
mod tenant_keys;
mod tree_overrun;
mod tree_paths;
mod whole_cascade;
mod worker_jobs;
