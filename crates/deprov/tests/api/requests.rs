//! `TestApp` request helpers and response assertions.

use reqwest::{Response, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{OPERATOR_TOKEN, SOURCE_TOKEN, TestApp};

impl TestApp {
    /// `POST /v1/deletion-requests` with the billing source's token.
    pub async fn post_deletion(&self, body: &Value) -> Response {
        self.post_deletion_with(Some(SOURCE_TOKEN), None, body)
            .await
    }

    /// `POST /v1/reinstallations` of `tenant` with a source's `token`.
    pub async fn post_reinstallation(&self, token: &str, tenant: &str) -> Response {
        self.client
            .post(self.url("/v1/reinstallations"))
            .bearer_auth(token)
            .json(&json!({"tenant_id": tenant}))
            .send()
            .await
            .unwrap()
    }

    /// `POST /v1/deletion-requests` with an optional token and `Idempotency-Key`.
    pub async fn post_deletion_with(
        &self,
        token: Option<&str>,
        key: Option<&str>,
        body: &Value,
    ) -> Response {
        let mut req = self
            .client
            .post(self.url("/v1/deletion-requests"))
            .json(body);
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        req.send().await.unwrap()
    }

    /// `POST /v1/deletion-requests` with a raw body and content type, with the billing token.
    pub async fn post_raw(&self, content_type: &str, body: impl Into<reqwest::Body>) -> Response {
        let req = self
            .client
            .post(self.url("/v1/deletion-requests"))
            .bearer_auth(SOURCE_TOKEN);
        req.header("Content-Type", content_type)
            .body(body)
            .send()
            .await
            .unwrap()
    }

    /// `DELETE /v1/installations/{id}` with `token`, optional JSON body and `Idempotency-Key`.
    pub async fn delete_installation(
        &self,
        id: &str,
        token: &str,
        body: Option<&Value>,
        key: Option<&str>,
    ) -> Response {
        let mut req = self
            .client
            .delete(self.url(&format!("/v1/installations/{id}")))
            .bearer_auth(token);
        req = req.header("X-Vercel-Auth", "system");
        if let Some(body) = body {
            req = req.json(body);
        }
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        req.send().await.unwrap()
    }

    /// `GET path` with the operator token.
    pub async fn operator_get(&self, path: &str) -> Response {
        self.client
            .get(self.url(path))
            .bearer_auth(OPERATOR_TOKEN)
            .send()
            .await
            .unwrap()
    }

    /// `GET /v1/jobs/{id}` with the operator token.
    pub async fn get_job(&self, id: &str) -> Response {
        self.operator_get(&format!("/v1/jobs/{id}")).await
    }

    /// `PUT /v1/kill-switch` with the operator token.
    pub async fn put_kill_switch(&self, engaged: bool, reason: &str) -> Response {
        let req = self
            .client
            .put(self.url("/v1/kill-switch"))
            .bearer_auth(OPERATOR_TOKEN);
        req.json(&json!({"engaged": engaged, "reason": reason}))
            .send()
            .await
            .unwrap()
    }

    /// Unauthenticated `GET path`.
    pub async fn get(&self, path: &str) -> Response {
        self.client.get(self.url(path)).send().await.unwrap()
    }

    /// Rows in `deprov.jobs`.
    pub async fn count_jobs(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM deprov.jobs")
            .fetch_one(&self.db)
            .await
            .unwrap()
    }

    /// Rows in `deprov.deletion_requests`.
    pub async fn count_requests(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM deprov.deletion_requests")
            .fetch_one(&self.db)
            .await
            .unwrap()
    }

    /// Asserts that no request and no job was stored.
    pub async fn assert_nothing_stored(&self) {
        assert_eq!(
            (self.count_jobs().await, self.count_requests().await),
            (0, 0),
            "nothing may be stored"
        );
    }

    /// A job's state straight from `deprov.jobs`.
    pub async fn job_state(&self, id: &str) -> String {
        let id: uuid::Uuid = id.parse().unwrap();
        sqlx::query_scalar("SELECT state FROM deprov.jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&self.db)
            .await
            .unwrap()
    }
}

/// A tenant deletion body.
pub fn deletion(tenant: &str) -> Value {
    json!({"tenant_id": tenant})
}

/// Asserts `status` and an RFC 9457 body with content type `application/problem+json`; returns the body.
pub async fn assert_problem(response: Response, status: StatusCode) -> Value {
    assert_eq!(response.status(), status, "unexpected status");
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(content_type.as_deref(), Some("application/problem+json"));
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], status.as_u16(), "{body}");
    for field in ["type", "title", "detail"] {
        assert!(
            body[field].as_str().is_some_and(|s| !s.is_empty()),
            "problem lacks {field}: {body}"
        );
    }
    body
}

/// Asserts 202 and returns the JSON body.
pub async fn accepted(response: Response) -> Value {
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    body
}
