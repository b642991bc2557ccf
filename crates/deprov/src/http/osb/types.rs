//! The query strings and answers of the Open Service Broker routes (OSB v2.17), as documented in
//! `openapi.yaml`.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// The query string of a deprovision (spec "Deprovisioning", "Parameters").
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeprovisionQuery {
    /// The ID of the Service Offering of the instance (required; stored in the request's reason,
    /// not checked).
    #[param(
        required = true,
        min_length = 1,
        max_length = 1024,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
    )]
    pub service_id: Option<String>,
    /// The ID of the Service Plan of the instance (required; stored in the request's reason, not
    /// checked).
    #[param(
        required = true,
        min_length = 1,
        max_length = 1024,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
    )]
    pub plan_id: Option<String>,
    /// `true`: the platform accepts an asynchronous deprovision. Without it the request is refused
    /// 422 `AsyncRequired`: deprov deletes asynchronously only.
    #[param(value_type = Option<bool>)]
    pub accepts_incomplete: Option<String>,
}

/// The query string of a `last_operation` poll (spec "Polling Last Operation for Service
/// Instances", "Parameters"); each, if present, must be non-empty.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LastOperationQuery {
    /// The ID of the Service Offering (optional; logged).
    #[param(
        min_length = 1,
        max_length = 1024,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
    )]
    pub service_id: Option<String>,
    /// The ID of the Service Plan (optional; logged).
    #[param(
        min_length = 1,
        max_length = 1024,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
    )]
    pub plan_id: Option<String>,
    /// The `operation` a deprovision answered (optional). The instance decides which deletion is
    /// reported: the value is checked for shape, not compared.
    #[param(
        min_length = 1,
        max_length = 1024,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
    )]
    pub operation: Option<String>,
}

/// `202 Accepted` to a deprovision: the deletion is in progress (spec "Deprovisioning", "Body").
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeprovisionAccepted {
    /// The ID of the deletion job (a UUID): also usable with `GET /v1/jobs/{job_id}`.
    pub operation: String,
}

/// The empty object `{}` answered with 200 and 410 (spec "Deprovisioning", "Response").
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct Empty {}

/// The state of the last operation (spec "Polling Last Operation for Service Instances", "Body").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum OperationState {
    /// The deletion is queued, running, or held by a kill switch: poll again.
    #[serde(rename = "in progress")]
    InProgress,
    /// The tenant was deleted.
    #[serde(rename = "succeeded")]
    Succeeded,
    /// The deletion failed or was cancelled by an operator; it waits for an operator.
    #[serde(rename = "failed")]
    Failed,
}

/// A `last_operation` answer (spec "Polling Last Operation for Service Instances", "Body").
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LastOperation {
    /// `in progress`, `succeeded` or `failed`.
    pub state: OperationState,
    /// A user-facing message about the deletion.
    pub description: String,
    /// `failed` only: `false` when part of the tenant was already deleted or soft-deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_usable: Option<bool>,
}
