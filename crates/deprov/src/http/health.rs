//! `GET /healthz` (liveness) and `GET /readyz` (readiness: the state database answers, and the
//! target database does not refuse the configured SQL).

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, Problem};
use crate::db::{self, Bounds};
use crate::readiness::NotReady;

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

/// Readiness: 503 with `Retry-After: 1` while the process checks its databases at start (it serves
/// HTTP from before those checks); then 200 when deprov's migrations are applied and the state
/// database answers `SELECT 1` through the intake pool within the pool's acquire timeout
/// (`[pools.intake] acquire_timeout`), else 503 with `Retry-After`. A service started while its
/// database was down becomes ready within seconds of the database's return (its migrations are
/// retried in the background), without a restart.
/// Also 503 (`Retry-After: 5`, how often the check is repeated) while the start-up check of the
/// configured SQL finds a statement the target database refuses: the detail names each setting and
/// the server's error. A check not yet run (the target unreachable since start) does not make it
/// 503: intake does not need the target.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "health",
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "State database unreachable, migrations not yet applied, or the target database refuses a configured statement (the detail names its setting)", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ),
)]
pub async fn readyz(State(state): State<AppState>) -> Result<axum::Json<Health>, ApiError> {
    match state.readiness.check() {
        Ok(()) => {}
        Err(refused @ NotReady::Refused(_)) => {
            return Err(ApiError::Unavailable {
                detail: refused.to_string(),
                retry_after: crate::sqlcheck::RECHECK_REFUSED.as_secs(),
            });
        }
        Err(not_ready) => return Err(ApiError::db_unavailable(not_ready.to_string())),
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
