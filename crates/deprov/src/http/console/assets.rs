//! The console's two static files, embedded in the binary: its stylesheet and its script, which
//! refreshes the live parts of a page (elements with `data-live="<fragment URL>"`) every two
//! seconds without reloading it. No inline script or style exists anywhere in the console.

use axum::http::header;
use axum::response::IntoResponse;

/// The script's path.
pub const SCRIPT: &str = super::paths::SCRIPT;
/// The stylesheet's path.
pub const STYLE: &str = super::paths::STYLE;

/// `GET /ui/static/console.js`.
pub async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("static/console.js"),
    )
}

/// `GET /ui/static/console.css`.
pub async fn style() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("static/console.css"),
    )
}
