//! Connection and request limits: header size, header read time (slow or idle clients), body time.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{
    SOURCE_TOKEN, TestApp, TestOptions, assert_problem, deletion, spawn_app_with,
};

async fn spawn_limited() -> TestApp {
    spawn_app_with(TestOptions {
        intake_extra: "max_header_bytes = 4096\nheader_timeout = \"1s\"".into(),
        ..Default::default()
    })
    .await
}

/// Reads until the peer closes or `limit` passes; returns what was read and when the read ended.
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (String, Duration) {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(limit.saturating_sub(start.elapsed()), stream.read(&mut buf))
            .await
        {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!("the server kept the connection open for {limit:?}"),
        }
    }
    (String::from_utf8_lossy(&got).into_owned(), start.elapsed())
}

#[tokio::test]
async fn oversized_headers_are_431_and_store_nothing() {
    let app = spawn_limited().await;
    // Within hyper's buffer but over max_header_bytes: our 431 problem.
    let response = app
        .client
        .post(app.url("/v1/deletion-requests"))
        .bearer_auth(SOURCE_TOKEN)
        .header("X-Padding", "a".repeat(6000))
        .json(&deletion("42"))
        .send()
        .await
        .unwrap();
    assert_problem(response, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE).await;
    // Far over the buffer: hyper refuses the head itself.
    let response = app
        .client
        .post(app.url("/v1/deletion-requests"))
        .bearer_auth(SOURCE_TOKEN)
        .header("X-Padding", "a".repeat(64 * 1024))
        .json(&deletion("42"))
        .send()
        .await;
    match response {
        Ok(r) => assert_eq!(r.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
        Err(e) => assert!(e.is_request() || e.is_connect() || e.is_body(), "{e}"),
    }
    app.assert_nothing_stored().await;
    // The limit is on headers only: a normal request still passes.
    let ok = app.post_deletion(&deletion("42")).await;
    assert_eq!(ok.status(), StatusCode::ACCEPTED);
}

#[tokio::test]
async fn a_client_that_sends_its_header_slowly_or_goes_idle_is_disconnected() {
    let app = spawn_limited().await;
    // A partial header, then silence: closed after header_timeout (1 s), with no response.
    let mut slow = TcpStream::connect(("127.0.0.1", app.port)).await.unwrap();
    slow.write_all(b"POST /v1/deletion-requests HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n")
        .await
        .unwrap();
    let (got, took) = read_until_closed(&mut slow, Duration::from_secs(10)).await;
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");
    assert!(!got.contains("202"), "{got}");
    // A connection that never sends anything is closed as well.
    let mut idle = TcpStream::connect(("127.0.0.1", app.port)).await.unwrap();
    let (got, took) = read_until_closed(&mut idle, Duration::from_secs(10)).await;
    assert!(
        got.is_empty() && took >= Duration::from_millis(900),
        "{got:?} after {took:?}"
    );
    app.assert_nothing_stored().await;
}

#[tokio::test]
async fn a_body_sent_too_slowly_is_answered_503_and_stores_nothing() {
    let app = spawn_limited().await;
    let mut slow = TcpStream::connect(("127.0.0.1", app.port)).await.unwrap();
    let head = format!(
        "POST /v1/deletion-requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SOURCE_TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"tenant_id\""
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let limit = deprov::http::REQUEST_TIMEOUT + Duration::from_secs(5);
    let (got, took) = read_until_closed(&mut slow, limit).await;
    assert!(got.starts_with("HTTP/1.1 503"), "{got}");
    assert!(got.contains("application/problem+json"), "{got}");
    assert!(
        took >= deprov::http::REQUEST_TIMEOUT - Duration::from_millis(100),
        "{took:?}"
    );
    app.assert_nothing_stored().await;
}

#[tokio::test]
async fn a_declared_length_over_the_limit_is_413_at_once() {
    let app = spawn_limited().await;
    let mut stream = TcpStream::connect(("127.0.0.1", app.port)).await.unwrap();
    let head = format!(
        "POST /v1/deletion-requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SOURCE_TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 99999999999\r\n\r\n{{}}"
    );
    let start = Instant::now();
    stream.write_all(head.as_bytes()).await.unwrap();
    // Until the whole problem arrived (or the peer closed); a 503 would come only after
    // REQUEST_TIMEOUT (10 s).
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).ends_with('}') {
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!("no answer within 5 s: {:?}", String::from_utf8_lossy(&got)),
        }
    }
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(got.contains("application/problem+json"), "{got}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    app.assert_nothing_stored().await;
}
