//! The HTTP API's integration tests: one binary, one throwaway PostgreSQL and one server per test.

mod errors;
mod health;
mod helpers;
mod intake;
mod kill_switch;
mod limits;
mod oidc;
mod openapi;
mod operator;
mod pools;
mod requests;
mod signed;
mod vercel;
mod webhooks;
