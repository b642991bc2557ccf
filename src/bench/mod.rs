//! `deprov-lab bench delete`: deprov's hard delete against the naive cascading `DELETE`, in the same run,
//! on the same data, under the same load.
//!
//! See [`run::run`] for the procedure and [`BenchReport`] for every printed figure; with
//! `--target-url`, [`target::run`] runs it on the user's own database instead ([`target::TargetReport`]).

// Runs on its own throwaway server, outside the service's pool rules (clippy.toml).
#![allow(clippy::disallowed_methods)]

mod args;
pub mod corpus;
mod delete_report;
mod error;
mod paced;
pub mod replay;
pub mod run;
pub mod side;
pub mod target;
mod target_db;
mod target_report;
pub mod workload;

pub use args::BenchArgs;
pub use delete_report::BenchReport;
pub use run::run;
