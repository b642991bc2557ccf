//! The HTTP API's integration tests: one binary, one throwaway PostgreSQL and one server per test.

mod env_flags;
mod errors;
mod group_commit;
mod health;
mod helpers;
mod intake;
mod kill_switch;
mod kill_switch_scopes;
mod limits;
mod messages;
mod metrics;
mod nul;
mod oidc;
mod openapi;
mod operator;
mod plan_cli;
mod pooler;
mod pools;
mod process;
mod rate_limit;
mod requests;
mod signed;
mod tokens;
mod tokens_cache;
mod vercel;
mod webhooks;
