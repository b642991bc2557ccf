//! Verified webhook deliveries whose event type does not mean "delete": recorded, nothing started.

use sqlx::PgPool;
use uuid::Uuid;

use crate::ids::{DedupBasis, request_id};

/// Records an ignored delivery of `source` under `uuid5(source, external_id, dedup_key)` (the ID a
/// deletion request with that key would get). Returns `true` when it had been recorded before (its
/// `duplicates` count grows instead). One statement in its own bounded, durable transaction
/// ([`crate::db::Bounds::STATE`]): safe under concurrent retries.
///
/// # Errors
/// Database errors.
pub async fn record(
    pool: &PgPool,
    source: &str,
    event_type: Option<&str>,
    dedup_key: &str,
) -> Result<(Uuid, bool), sqlx::Error> {
    let id = request_id(source, DedupBasis::ExternalId, dedup_key);
    let mut tx = crate::db::begin(pool, crate::db::Bounds::STATE.durable()).await?;
    let duplicate: bool = crate::db::query_scalar(
        "INSERT INTO deprov.ignored_deliveries (id, source, event_type, dedup_key) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (id) DO UPDATE SET duplicates = deprov.ignored_deliveries.duplicates + 1, \
           last_duplicate_at = now() \
         RETURNING duplicates > 0",
    )
    .bind(id)
    .bind(source)
    .bind(event_type)
    .bind(dedup_key)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok((id, duplicate))
}
