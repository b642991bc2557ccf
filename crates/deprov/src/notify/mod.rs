//! Failure and completion notifications: a transactional outbox delivered as Standard Webhooks.
//!
//! - **Recording.** A trigger on `deprov.jobs` (migration `0005_notifications.sql`) inserts one row into
//!   `deprov.outbox` in the same transaction as every change of a job's state to `completed`, `failed`
//!   or `cancelled`, whichever code path makes it: the event commits with the state change, or neither
//!   does. The row holds the whole body (`{"type", "timestamp", "data": {job_id, state, tenant_id, …}}`).
//! - **Delivery.** Every worker process runs a [`Dispatcher`] (with `[notifications]` configured):
//!   it claims due rows ([`outbox::claim`], `FOR UPDATE SKIP LOCKED`, at most `max_in_flight`), POSTs
//!   each with `webhook-id` (the row's ID, the same on every attempt), `webhook-timestamp` (Unix
//!   seconds) and `webhook-signature` (`v1,<base64 HMAC-SHA256 of id.timestamp.body>`, signed by
//!   [`crate::sources::standard_webhooks::sign`]). A 2xx is `delivered`; any other status, a timeout or
//!   a refused connection is retried after [`dispatch::retry_delay`]; after `max_attempts`, or when it
//!   fails older than `max_age`, the row is `dead`. Delivery is at-least-once: a process that dies
//!   mid-delivery leaves the claim to expire and another sends the event again.
//! - **Visibility.** `deprov_notifications{state}`, `deprov_notifications_oldest_pending_seconds` and
//!   `deprov_notification_deliveries_total{outcome}` ([`crate::telemetry`]); every failure is logged
//!   (a dead event at `error`); `deprov notifications list --state dead` lists them and
//!   `deprov notifications redrive` sends them again.

pub mod dispatch;
pub mod outbox;

pub use dispatch::{Dispatcher, NotifyError, Round, retry_delay};
