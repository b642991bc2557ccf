//! The console's errors: the HTTP edge's one error type ([`ApiError`]) rendered as an HTML page,
//! and the redirect to the login page.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::html;
use serde::de::DeserializeOwned;

use super::paths::LOGIN;
use super::shell;
use crate::http::error::ApiError;
use crate::http::extract::ApiQuery;

/// Why a console request was not answered with its page.
#[derive(Debug)]
pub enum ConsoleError {
    /// No session, or an expired or ended one, or its token was revoked: 303 to the login page.
    Login,
    /// Any other refusal or failure, as the JSON API would answer it (same status and detail),
    /// rendered as a page.
    Api(ApiError),
}

impl From<ApiError> for ConsoleError {
    fn from(e: ApiError) -> Self {
        Self::Api(e)
    }
}

impl From<sqlx::Error> for ConsoleError {
    fn from(e: sqlx::Error) -> Self {
        Self::Api(e.into())
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        let e = match self {
            Self::Login => return Redirect::to(LOGIN).into_response(),
            Self::Api(e) => e,
        };
        let status = e.status();
        match &e {
            ApiError::Internal(detail) => tracing::error!(%detail, "internal error"),
            ApiError::Unavailable { detail, .. } => tracing::warn!(%detail, "unavailable"),
            other => {
                tracing::debug!(status = status.as_u16(), detail = %other, "console request refused");
            }
        }
        let problem = e.problem();
        let body = shell::bare(
            &problem.title,
            html! {
                h1 { (problem.title) }
                p.error { (problem.detail) }
                p.muted { "HTTP " (problem.status) ". Nothing was changed." }
                p { a href=(super::paths::KILL_SWITCHES) { "Back to the console" } }
            },
        );
        let mut response = (status, Html(body.into_string())).into_response();
        if let ApiError::Unavailable { retry_after, .. }
        | ApiError::TooManyRequests { retry_after, .. } = &e
        {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after));
        }
        response
    }
}

/// A page's query string, parsed as the JSON API parses one ([`ApiQuery`]); a malformed one is
/// answered with the error page.
#[derive(Debug)]
pub struct PageQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for PageQuery<T> {
    type Rejection = ConsoleError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ConsoleError> {
        ApiQuery::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Self(q.0))
            .map_err(ConsoleError::Api)
    }
}
