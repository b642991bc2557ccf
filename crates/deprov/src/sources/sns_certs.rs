//! `aws-sns`: fetching and caching SNS signing certificates, and the source's load-time checks.
//!
//! A certificate is fetched with GET only from a `SigningCertURL` that passed
//! [`super::sns::check_url`], over https (no redirects, at most [`FETCH_TIMEOUT`], at most
//! [`MAX_CERT_BYTES`]), parsed as a PEM X.509 certificate (`x509-cert`) whose key must be RSA, and
//! cached by URL (at most [`MAX_CACHED`] URLs; the oldest is dropped first). The same client GETs a
//! `SubscribeURL` when `confirm_subscriptions` is on. The TLS roots are the system's, or only those
//! of `cert_roots_file` when given.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use rsa::PublicKey;
use rsa::pkcs8::DecodePublicKey as _;
use tokio::sync::Mutex;
use x509_cert::Certificate;
use x509_cert::der::{DecodePem as _, Encode as _};

use super::sns::SnsReject;

/// Longest a certificate fetch or a subscription confirmation may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest certificate read, in bytes (SNS's are about 2 KiB).
pub const MAX_CERT_BYTES: usize = 16 * 1024;
/// Most certificate URLs kept in the cache (SNS uses one per region at a time).
pub const MAX_CACHED: usize = 16;

/// Why a certificate could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    /// The host could not be reached, timed out or answered 5xx: retry later (503).
    #[error("the signing certificate could not be fetched: {0}")]
    Unavailable(String),
    /// The answer was a 4xx, too large, or not an RSA certificate (401).
    #[error(transparent)]
    Refused(#[from] SnsReject),
}

/// The certificate fetcher and cache of one `aws-sns` source.
pub struct SnsCerts {
    client: reqwest::Client,
    hosts: Vec<String>,
    cache: Mutex<VecDeque<(String, PublicKey)>>,
}

impl std::fmt::Debug for SnsCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnsCerts")
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// The fetcher of `hosts` (patterns a certificate URL's host must match), trusting the PEM
/// certificates in `roots_file` instead of the system's when given.
///
/// # Errors
/// The key at fault (`cert_roots_file`) and why.
pub fn fetcher(
    hosts: Vec<String>,
    roots_file: Option<&str>,
) -> Result<Arc<SnsCerts>, (&'static str, String)> {
    let roots = match roots_file {
        None => None,
        Some(path) => {
            let pem =
                std::fs::read(path).map_err(|e| ("cert_roots_file", format!("{path}: {e}")))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| ("cert_roots_file", format!("{path}: {e}")))?;
            if certs.is_empty() {
                return Err(("cert_roots_file", format!("{path}: no PEM certificate")));
            }
            Some(certs)
        }
    };
    super::oidc::install_crypto_provider();
    let mut builder = reqwest::Client::builder()
        .timeout(FETCH_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .https_only(true);
    if let Some(certs) = roots {
        builder = builder.tls_certs_only(certs);
    }
    let client = builder
        .build()
        .map_err(|e| ("cert_roots_file", format!("TLS client: {e}")))?;
    Ok(Arc::new(SnsCerts {
        client,
        hosts,
        cache: Mutex::new(VecDeque::new()),
    }))
}

/// The RSA public key of a PEM X.509 certificate.
///
/// # Errors
/// [`SnsReject::Certificate`].
pub fn public_key(pem: &[u8]) -> Result<PublicKey, SnsReject> {
    let bad = |e: &dyn std::fmt::Display| SnsReject::Certificate(e.to_string());
    let cert = Certificate::from_pem(pem).map_err(|e| bad(&e))?;
    let spki = cert
        .tbs_certificate()
        .subject_public_key_info()
        .to_der()
        .map_err(|e| bad(&e))?;
    PublicKey::from_public_key_der(&spki).map_err(|e| bad(&e))
}

impl SnsCerts {
    /// The host patterns a `SigningCertURL` or `SubscribeURL` must match.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The key of the certificate at `url` (already checked), from the cache or fetched.
    ///
    /// # Errors
    /// [`CertError`].
    pub async fn key(&self, url: &reqwest::Url) -> Result<PublicKey, CertError> {
        if let Some((_, key)) = self
            .cache
            .lock()
            .await
            .iter()
            .find(|(u, _)| u == url.as_str())
        {
            return Ok(key.clone());
        }
        let pem = self.fetch(url).await?;
        let key = public_key(&pem)?;
        let mut cache = self.cache.lock().await;
        if !cache.iter().any(|(u, _)| u == url.as_str()) {
            if cache.len() >= MAX_CACHED {
                cache.pop_front();
            }
            cache.push_back((url.as_str().to_owned(), key.clone()));
        }
        tracing::info!(url = %url, cached = cache.len(), "SNS signing certificate fetched");
        Ok(key)
    }

    async fn fetch(&self, url: &reqwest::Url) -> Result<Vec<u8>, CertError> {
        let unavailable = |e: &dyn std::fmt::Display| CertError::Unavailable(e.to_string());
        let mut response = self
            .client
            .get(url.clone())
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        let status = response.status();
        if status.is_server_error() {
            return Err(unavailable(&status));
        }
        if !status.is_success() {
            return Err(SnsReject::Certificate(format!("the host answered {status}")).into());
        }
        let too_large = || SnsReject::Certificate(format!("larger than {MAX_CERT_BYTES} bytes"));
        if response
            .content_length()
            .is_some_and(|n| n > MAX_CERT_BYTES as u64)
        {
            return Err(too_large().into());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| unavailable(&e))? {
            if body.len() + chunk.len() > MAX_CERT_BYTES {
                return Err(too_large().into());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// Confirms a subscription: GET `url` (already checked), success = a 2xx answer.
    ///
    /// # Errors
    /// The reason, when the GET failed or was not answered 2xx.
    pub async fn confirm(&self, url: &reqwest::Url) -> Result<(), String> {
        let response = self
            .client
            .get(url.clone())
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(format!("answered {}", response.status()))
        }
    }
}
