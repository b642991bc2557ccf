//! The demo's data side: a realistic multi-tenant SaaS schema with one large and many small tenants
//! ([`data`]), and checks that a tenant deletion equals a cascading `DELETE` and left every other
//! tenant's rows alone ([`verify`], [`ownership`]).
//!
//! Typical use (demo, tests, benchmarks):
//! 1. [`data::load`] into a fresh database;
//! 2. [`verify::clone_database`] it, and take [`ownership::other_tenants_digest`] for the tenant;
//! 3. delete the tenant with deprov in the original, and with [`verify::cascade_delete`] in the copy;
//! 4. [`verify::database_digest`] of both must be equal, and the other-tenants digest unchanged.

// Runs on its own throwaway server, outside the service's pool rules (clippy.toml).
#![allow(clippy::disallowed_methods)]

pub mod data;
pub mod ownership;
pub mod run;
pub mod verify;

#[cfg(test)]
mod tests;

pub use data::{DemoSize, DemoTenants, load};
pub use ownership::{orphaned_rows, other_tenants_digest};
pub use verify::{
    CascadeOutcome, DatabaseDigest, TableDigest, all_user_tables, cascade_delete,
    cascade_delete_key, clone_database, database_digest, differing_tables, drop_database,
    table_digest, table_rows, user_tables,
};
