//! Serving the router with connection-level limits `axum::serve` does not expose.
//!
//! - **Header read time**: a client must send a request's complete header within
//!   `[intake] header_timeout` (hyper's `header_read_timeout`, which needs a timer — `axum::serve`
//!   sets none, so there it never fires). The same bound closes idle keep-alive connections, so slow
//!   or silent clients cannot hold connections open. The body and the handler are bounded by
//!   [`super::REQUEST_TIMEOUT`] (503 problem).
//! - **Header size**: hyper's read buffer is capped near `[intake] max_header_bytes` (larger heads
//!   are refused by hyper with 431 and the connection closed); heads within the buffer but over the
//!   limit get a 431 problem from [`limit_headers`].
//! - HTTP/1.1 only: hyper's automatic HTTP/2 detection waits for the first bytes with no deadline,
//!   which would let a silent client hold a connection; terminate TLS and HTTP/2 in front of deprov.
//!
//! Each request carries `ConnectInfo<SocketAddr>` like `into_make_service_with_connect_info`, and
//! shutdown is graceful: stop accepting, let in-flight connections finish.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1::Builder;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::error::ApiError;
use crate::config::IntakeConfig;

/// Longest a graceful shutdown waits for open connections before returning.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// 431 problem when the request's header fields (names + values, bytes) exceed `max`.
pub async fn limit_headers(max: usize, request: Request, next: Next) -> Response {
    let size: usize = request
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    if size > max {
        return ApiError::HeadersTooLarge(format!(
            "request header fields total {size} bytes; at most {max} are accepted"
        ))
        .into_response();
    }
    next.run(request).await
}

fn builder(limits: &IntakeConfig) -> Builder {
    let mut builder = Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192) + 1024);
    builder
}

/// Serves `router` on `listener` until `cancel` fires, then stops accepting and waits up to
/// [`SHUTDOWN_GRACE`] for open connections.
///
/// # Errors
/// Never for a single bad connection (logged at debug); the listener's accept errors are logged and
/// retried after 50 ms, as `axum::serve` does.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: &IntakeConfig,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let builder = builder(limits);
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let service = router
            .clone()
            .map_request(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert(ConnectInfo::<SocketAddr>(peer));
                req.map(axum::body::Body::new)
            });
        let conn =
            builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("open connections did not finish within the shutdown grace period");
    }
    Ok(())
}
