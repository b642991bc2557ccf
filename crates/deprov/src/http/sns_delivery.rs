//! `aws-sns` deliveries on `POST /v1/webhooks/{source}` ([`crate::sources::sns`]).
//!
//! A message is refused 401, nothing stored, unless its topic is in `topic_arns`, its `Timestamp`
//! within the tolerance, its `SigningCertURL` an allowed `https` `.pem` URL, and its signature
//! verifies with that certificate's key; a certificate that cannot be fetched (network, timeout,
//! 5xx) is 503 so SNS retries. A verified `Notification` continues through the common webhook
//! path (`decode`, `event`, `delete_events`, `tenant`, dedup on `MessageId`). The other types are
//! answered here and recorded as ignored deliveries under their `Type`:
//! - `SubscriptionConfirmation`, with `confirm_subscriptions = true`: its `SubscribeURL` (https, a
//!   `cert_hosts` host) is GET, then the delivery is answered `outcome: confirmed` (a failed GET is
//!   503: SNS resends it). Without it: answered `ignored` and logged as a warning naming the topic
//!   and the URL's host, for an operator to confirm by hand; counted in
//!   `deprov_sns_unconfirmed_subscriptions_total`.
//! - `UnsubscribeConfirmation`: answered `ignored` and logged as a warning.

use super::AppState;
use super::error::ApiError;
use super::webhook_answer::{WebhookAnswer, WebhookOutcome, ignore};
use crate::sources::payload::Delivery;
use crate::sources::sns::{self, Kind, Message, SnsReject};
use crate::sources::sns_certs::CertError;
use crate::sources::{SourceConfig, unix_now};

fn refused(name: &str, r: &SnsReject) -> ApiError {
    ApiError::Unauthorized(format!("source {name}: {r}"))
}

/// Verifies an SNS message of source `name` (see the module docs) and returns it.
///
/// # Errors
/// 401 for any failed check, 503 when the certificate cannot be fetched.
pub(super) async fn authenticate(
    name: &str,
    source: &SourceConfig,
    body: &[u8],
) -> Result<Message, ApiError> {
    let Some(certs) = &source.sns else {
        return Err(ApiError::Unauthorized(format!(
            "source {name}: not prepared for SNS"
        )));
    };
    let m = sns::parse(body).map_err(|r| refused(name, &r))?;
    sns::check_message(&m, &source.topic_arns, unix_now(), source.tolerance())
        .map_err(|r| refused(name, &r))?;
    let url = sns::check_url("SigningCertURL", &m.signing_cert_url, certs.hosts(), true)
        .map_err(|r| refused(name, &r))?;
    let key = certs.key(&url).await.map_err(|e| match e {
        CertError::Unavailable(reason) => {
            tracing::warn!(source = %name, %url, reason, "SNS signing certificate fetch failed");
            ApiError::db_unavailable(format!(
                "source {name}: the SNS signing certificate could not be fetched; retry later"
            ))
        }
        CertError::Refused(r) => refused(name, &r),
    })?;
    sns::verify_signature(&key, &m).map_err(|r| refused(name, &r))?;
    Ok(m)
}

/// Answers a verified message that is not a `Notification` (see the module docs); `None` for a
/// notification.
///
/// # Errors
/// 401 for a `SubscribeURL` that is not allowed, 503 when confirming failed; the state database's.
pub(super) async fn answer_other(
    state: &AppState,
    name: &str,
    source: &SourceConfig,
    m: &Message,
) -> Result<Option<WebhookAnswer>, ApiError> {
    let topic = m.topic_arn.as_str();
    let mut outcome = WebhookOutcome::Ignored;
    match m.kind {
        Kind::Notification => return Ok(None),
        Kind::SubscriptionConfirmation => {
            let hosts = source.sns.as_ref().map(|c| c.hosts()).unwrap_or_default();
            let raw = m.subscribe_url.as_deref().unwrap_or_default();
            let url =
                sns::check_url("SubscribeURL", raw, hosts, false).map_err(|r| refused(name, &r))?;
            let host = url.host_str().unwrap_or_default();
            match &source.sns {
                Some(certs) if source.confirm_subscriptions => {
                    certs.confirm(&url).await.map_err(|reason| {
                        tracing::warn!(source = %name, topic, host, reason, "SNS subscription confirmation failed");
                        ApiError::db_unavailable(format!(
                            "source {name}: confirming the SNS subscription failed; retry later"
                        ))
                    })?;
                    tracing::info!(source = %name, topic, host, "SNS subscription confirmed");
                    outcome = WebhookOutcome::Confirmed;
                }
                _ => {
                    metrics::counter!(crate::telemetry::SNS_UNCONFIRMED, "source" => name.to_owned()).increment(1);
                    tracing::warn!(source = %name, topic, subscribe_url_host = host,
                        "SNS subscription NOT confirmed (confirm_subscriptions is off): confirm it \
                         from the SubscriptionConfirmation's SubscribeURL or the AWS console");
                }
            }
        }
        Kind::UnsubscribeConfirmation => {
            tracing::warn!(source = %name, topic, "SNS UnsubscribeConfirmation: this endpoint's subscription was deleted");
        }
    }
    let delivery = Delivery {
        event: Some(m.kind.as_str().to_owned()),
        deletes: false,
        tenant: None,
        tenant_unusable: None,
        dedup: Some(m.message_id.clone()),
    };
    let answer = ignore(state, name, &delivery, &[]).await?;
    Ok(Some(WebhookAnswer { outcome, ..answer }))
}
