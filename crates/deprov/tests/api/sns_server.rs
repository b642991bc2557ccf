//! A loopback HTTPS server standing in for SNS: it hands out the test signing certificate, answers
//! `SubscribeURL` confirmations, and records every path it was asked for. Its certificate is issued
//! by `tests/fixtures/sns/ca.pem`, which deprov trusts through `cert_roots_file`.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::routing::get;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// The test SNS server: its port and the paths (with query) it served, in order.
pub struct SnsServer {
    pub port: u16,
    pub seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SnsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn sns_fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/sns/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub fn sns_fixture_path(name: &str) -> String {
    format!("{}/tests/fixtures/sns/{name}", env!("CARGO_MANIFEST_DIR"))
}

async fn record(State(seen): State<Arc<Mutex<Vec<String>>>>, req: Request) -> StatusCode {
    let uri = req.uri();
    let path = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_owned(), ToString::to_string);
    seen.lock().unwrap().push(path.clone());
    if path.starts_with("/broken") {
        StatusCode::INTERNAL_SERVER_ERROR
    } else if path.starts_with("/missing") {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::OK
    }
}

async fn cert(State(seen): State<Arc<Mutex<Vec<String>>>>) -> Vec<u8> {
    seen.lock()
        .unwrap()
        .push("/SimpleNotificationService-test.pem".into());
    sns_fixture("signing.pem")
}

impl SnsServer {
    /// Starts the server on `127.0.0.1:0`.
    pub async fn start() -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(sns_fixture("server.crt.der"))],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(sns_fixture("server.key.der"))),
            )
            .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route("/SimpleNotificationService-test.pem", get(cert))
            .fallback(record)
            .with_state(seen.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, app) = (acceptor.clone(), app.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self { port, seen, task }
    }

    /// `https://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    /// How many requests asked for a path starting with `prefix`.
    pub fn requests(&self, prefix: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.starts_with(prefix))
            .count()
    }
}
