//! The HTTP API's integration tests: one binary, one throwaway PostgreSQL and one server per test.

// Tests set up and inspect databases directly (clippy.toml's rules are the service's).
#![allow(clippy::disallowed_methods)]

mod atlassian;
mod authorization;
mod console;
mod decode;
mod env_flags;
mod errors;
mod group_commit;
mod health;
mod helpers;
mod inputs;
mod intake;
mod jwt;
mod key_forms;
mod kill_switch;
mod kill_switch_scopes;
mod limits;
mod max_age;
mod messages;
mod metrics;
mod migrations;
mod nul;
mod oidc;
mod openapi;
mod operator;
mod osb;
mod osb_worker;
mod plan_cli;
mod pooler;
mod pools;
mod process;
mod rate_limit;
mod reconcile;
mod refusals;
mod requests;
mod schemathesis;
mod signed;
mod sns;
mod sns_server;
mod sqlcheck;
mod tokens;
mod tokens_cache;
mod vercel;
mod webhooks;
