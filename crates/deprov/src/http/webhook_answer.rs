//! What `POST /v1/webhooks/{source}` answers a verified delivery ([`WebhookAnswer`]), and the
//! recording of a delivery whose event does not delete ([`ignore`]), shared by the route
//! ([`super::webhooks`]) and its SNS branch ([`super::sns_delivery`]).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;
use uuid::Uuid;

use super::AppState;
use super::error::ApiError;
use crate::queue::JobState;
use crate::sources::payload;

/// What deprov did with a verified delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WebhookOutcome {
    /// A deletion request was recorded (or had been: `duplicate`).
    Recorded,
    /// The event type does not mean delete: recorded as ignored, nothing started.
    Ignored,
    /// Slack's `url_verification` handshake: `challenge` echoed, nothing stored.
    Challenge,
    /// A `restore_events` event: the tenant is back (see `reinstall`).
    Reinstall,
    /// An SNS `SubscriptionConfirmation`, confirmed (`confirm_subscriptions = true`): its
    /// `SubscribeURL` was requested; recorded as ignored, nothing started.
    Confirmed,
}

/// The answer to a verified delivery.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WebhookAnswer {
    /// What was done.
    pub outcome: WebhookOutcome,
    /// The delivery's event type, as read (see `docs/api.md`, "Signed senders").
    pub event_type: Option<String>,
    /// The deterministic ID the delivery was recorded under (absent for a challenge).
    pub request_id: Option<Uuid>,
    /// The deletion job (recorded deliveries only).
    pub job_id: Option<Uuid>,
    /// The job's state now (recorded deliveries only).
    pub state: Option<JobState>,
    /// `true` when this delivery had been received before.
    pub duplicate: bool,
    /// Slack `url_verification` only: the challenge, echoed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<String>,
    /// For a `restore_events` event: what the reinstall did to the tenant's pending deletion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reinstall: Option<crate::queue::grace::Reinstalled>,
}

impl WebhookAnswer {
    /// An answer of `outcome` for a delivery of `event_type`, with nothing recorded yet.
    pub(super) fn new(outcome: WebhookOutcome, event_type: Option<String>) -> Self {
        Self {
            outcome,
            event_type,
            request_id: None,
            job_id: None,
            state: None,
            duplicate: false,
            challenge: None,
            reinstall: None,
        }
    }
}

/// A verified delivery whose event does not delete: recorded as ignored (deduplicated on its
/// key, else the body's SHA-256), so a redelivery answers `duplicate`.
///
/// # Errors
/// The state database's.
pub(super) async fn ignore(
    state: &AppState,
    name: &str,
    delivery: &payload::Delivery,
    body: &[u8],
) -> Result<WebhookAnswer, ApiError> {
    let key = delivery
        .dedup
        .clone()
        .unwrap_or_else(|| hex::encode(Sha256::digest(body)));
    let (id, duplicate) =
        crate::queue::ignored::record(&state.pools.intake, name, delivery.event.as_deref(), &key)
            .await?;
    if delivery.event.is_some() {
        tracing::info!(source = %name, event = ?delivery.event, duplicate, "webhook ignored: not a delete event");
        crate::telemetry::delivery_ignored(name, "not_a_delete_event");
    } else {
        // A renamed or retyped field would make every deletion look like this: say so loudly.
        tracing::warn!(source = %name, duplicate,
            "webhook ignored: no event type where the source's `event` points (absent or not a string)");
        crate::telemetry::delivery_ignored(name, "no_event_type");
    }
    Ok(WebhookAnswer {
        request_id: Some(id),
        duplicate,
        ..WebhookAnswer::new(WebhookOutcome::Ignored, delivery.event.clone())
    })
}
