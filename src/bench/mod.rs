//! `deprov bench delete`: deprov's hard delete against the naive cascading `DELETE`, in the same run,
//! on the same data, under the same load (issue 3's benchmark).
//!
//! See [`run::run`] for the procedure and [`run::BenchReport`] for every printed figure.

pub mod replay;
mod paced;
mod report;
pub mod run;
pub mod workload;

pub use run::{BenchArgs, BenchReport, run};
