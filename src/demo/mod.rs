//! The demo's data side: a realistic multi-tenant SaaS schema with one large and many small tenants
//! ([`data`]).

pub mod data;

pub use data::{DemoSize, DemoTenants, load};
