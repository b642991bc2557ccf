//! `GET /healthz` (liveness) and `GET /readyz` (readiness: the state database answers).

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, Problem};
use crate::db::{self, Bounds};

/// The body of a successful health or readiness check.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok` (liveness) or `ready` (readiness).
    pub status: String,
}

/// Liveness: 200 whenever the process serves HTTP; touches no database.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, description = "Alive", body = Health)))]
pub async fn healthz() -> axum::Json<Health> {
    axum::Json(Health {
        status: "ok".into(),
    })
}

/// Readiness: 200 when deprov's migrations are applied and the state database answers `SELECT 1`
/// through the intake pool within the pool's acquire timeout (`[pools.intake] acquire_timeout`), else
/// 503 with `Retry-After`. A service started while its database was down becomes ready within seconds
/// of the database's return (its migrations are retried in the background), without a restart.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "health",
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "State database unreachable, or migrations not yet applied", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ),
)]
pub async fn readyz(State(state): State<AppState>) -> Result<axum::Json<Health>, ApiError> {
    if !state.is_migrated() {
        return Err(ApiError::db_unavailable(
            "the state database was unreachable at start-up; its migrations are not applied yet",
        ));
    }
    // Bounded by the pool's acquire timeout and, on the server, by Bounds::STATE; no client-side
    // deadline abandons the query (see crate::db).
    let check = async {
        let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
        let one: i32 = db::query_scalar("SELECT 1").fetch_one(&mut *tx).await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(one)
    };
    match check.await {
        Ok(_) => Ok(axum::Json(Health {
            status: "ready".into(),
        })),
        Err(e) => Err(ApiError::db_unavailable(format!(
            "the state database is unavailable: {e}"
        ))),
    }
}
