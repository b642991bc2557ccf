//! deprov-lab: deprov's demo and benchmarks, apart from the service (the `deprov` crate).
//!
//! [`cli`] is the `deprov-lab` command line (`demo`, `bench …`); [`bench`](mod@bench) holds the benchmarks:
//! deprov's hard delete against the cascading `DELETE` on the demo schema, on a copy of the user's
//! own database, over a corpus of generated schemas, and the incidents replayed through PgBouncer.
//! The demo itself is the `deprov-demo` crate; the throwaway servers are `deprov-testkit`'s.

pub mod bench;
pub mod cli;
