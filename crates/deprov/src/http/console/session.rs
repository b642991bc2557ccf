//! Console access: log in with an operator token, the session cookie, the [`Viewer`] of every page,
//! and [`ActionForm`], the CSRF- and role-checked form of every state-changing request.
//!
//! A session is a random 256-bit secret in the cookie [`COOKIE`] (`HttpOnly; Secure;
//! SameSite=Strict; Path=/ui`, [`SESSION_TTL`]); the state database keeps only its SHA-256
//! ([`crate::queue::sessions`]). Each request checks the stored digest of the operator token that
//! logged in like a bearer token ([`crate::http::auth::OperatorAuth::authenticate_digest`]), so a
//! revoked token ends its sessions and the role is always the token's current one. The CSRF token
//! of a session is derived from its secret (SHA-256 under a fixed label): only a page served to
//! the session's holder can show it, and it is compared in constant time.

use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::FormRejection;
use axum::extract::{Form, FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use base64::Engine as _;
use maud::html;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;

use super::login_limit::Peer;
use super::page_error::ConsoleError;
use super::shell;
use crate::db::{self, Bounds};
use crate::http::AppState;
use crate::http::auth::TokenDigest;
use crate::http::error::ApiError;
use crate::queue::sessions;
use crate::queue::tokens::{self, Role};

/// The login page.
pub const LOGIN: &str = super::paths::LOGIN;
/// The logout action.
pub const LOGOUT: &str = super::paths::LOGOUT;
/// The session cookie's name.
pub const COOKIE: &str = "deprov_console";
/// How long a session lasts from its login.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);

/// Who is looking at a console page: a live session's operator.
#[derive(Debug, Clone)]
pub struct Viewer {
    /// The audit actor (the operator token's name, `env:operator` for `DEPROV_OPERATOR_TOKEN`).
    pub actor: String,
    /// The token's current role.
    pub role: Role,
    session: [u8; 32],
    csrf: String,
}

impl Viewer {
    /// Whether this viewer may change anything (role `operator`): action forms are shown only then.
    pub fn can_act(&self) -> bool {
        self.role == Role::Operator
    }

    /// The session's CSRF token, for the hidden `csrf` field of every form.
    pub fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// The CSRF token of the session whose secret is `secret`.
fn csrf_of(secret: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"deprov console csrf\0");
    h.update(secret.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(h.finalize())
}

impl FromRequestParts<AppState> for Viewer {
    type Rejection = ConsoleError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ConsoleError> {
        let jar = CookieJar::from_headers(&parts.headers);
        let secret = jar
            .get(COOKIE)
            .ok_or(ConsoleError::Login)?
            .value()
            .to_owned();
        let session = tokens::digest(&secret);
        let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
        let found = sessions::find(&mut *tx, &session).await?;
        tx.commit().await?;
        let found = found.ok_or(ConsoleError::Login)?;
        let token = <[u8; 32]>::try_from(found.operator_token_sha256.as_slice())
            .map_err(|_| ConsoleError::Login)?;
        let operator = match state
            .operators
            .authenticate_digest(&state.pools.intake, Some(TokenDigest::from_bytes(token)))
            .await
        {
            Ok(operator) => operator,
            Err(ApiError::Unauthorized(_) | ApiError::Forbidden(_)) => {
                return Err(ConsoleError::Login);
            }
            Err(e) => return Err(e.into()),
        };
        Ok(Self {
            actor: operator.actor,
            role: operator.role,
            session,
            csrf: csrf_of(&secret),
        })
    }
}

/// Refuses a state-changing request that did not come from the console's own pages: one a browser
/// says came from another site (`Sec-Fetch-Site: cross-site` or `same-site`), or one whose `Origin`
/// header is present and is not the request's own origin ([`own_origin`]; `Origin: null`, sent from
/// sandboxed and other opaque contexts, is never it). No form of the console is ever posted from
/// elsewhere, so neither a login (login CSRF) nor an action is taken from one. Clients that send
/// neither header (scripts) pass on to the session and CSRF checks.
///
/// # Errors
/// 403 for a request from another site or origin.
pub fn same_origin(headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    let refused =
        || ApiError::Forbidden("the console accepts forms only from its own pages".into());
    if let Some(b"cross-site" | b"same-site") = headers.get("sec-fetch-site").map(|v| v.as_bytes())
    {
        return Err(refused());
    }
    if let Some(origin) = headers.get(axum::http::header::ORIGIN) {
        let sent = origin.to_str().ok().and_then(Origin::parse);
        if sent.is_none() || sent != own_origin(headers) {
            return Err(refused());
        }
    }
    Ok(())
}

/// A web origin (RFC 6454): scheme, host and port, compared as browsers serialize them (lower
/// case, the scheme's default port when none is written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// `http` or `https`.
    pub scheme: &'static str,
    /// The host, lower case; an IPv6 address in brackets.
    pub host: String,
    /// The port.
    pub port: u16,
}

impl Origin {
    /// Parses the value of an `Origin` header: `http` or `https`, `://`, a host and an optional
    /// port, nothing else. `None` for anything else, `null` included.
    pub fn parse(text: &str) -> Option<Self> {
        let (scheme, authority) = text.split_once("://")?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => "http",
            "https" => "https",
            _ => return None,
        };
        Self::at(scheme, authority)
    }

    /// The origin of `scheme` and a `host[:port]` (the form of a `Host` header); `None` when it is
    /// not one (empty, with user information, a path or a malformed port).
    fn at(scheme: &'static str, authority: &str) -> Option<Self> {
        if authority.is_empty() || authority.contains(['@', '/', '?', '#']) {
            return None;
        }
        let authority: axum::http::uri::Authority = authority.parse().ok()?;
        let port = match authority.port_u16() {
            Some(port) => port,
            // A port written but not read (`host:`, `host:99999`).
            None if authority.as_str().len() > authority.host().len() => return None,
            None if scheme == "https" => 443,
            None => 80,
        };
        Some(Self {
            scheme,
            host: authority.host().to_ascii_lowercase(),
            port,
        })
    }
}

/// The origin this request was sent to: the scheme it reached the console over (`https` when a
/// proxy says so, as for [`keeps_secure_cookie`], else `http`) with the host and port of its `Host`
/// header. A TLS-terminating proxy must pass the browser's `Host` on (e.g. nginx's `proxy_set_header
/// Host $host`). `None` without a readable `Host`.
pub fn own_origin(headers: &axum::http::HeaderMap) -> Option<Origin> {
    let host = headers.get(axum::http::header::HOST)?.to_str().ok()?;
    Origin::at(if over_https(headers) { "https" } else { "http" }, host)
}

/// Whether a proxy says the request came over HTTPS: `X-Forwarded-Proto: https` (its first value)
/// or `Forwarded: proto=https`.
fn over_https(headers: &axum::http::HeaderMap) -> bool {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase()
    };
    text("x-forwarded-proto").split(',').next().map(str::trim) == Some("https")
        || text("forwarded")
            .split([';', ','])
            .any(|part| part.trim() == "proto=https")
}

/// The form of a state-changing console request, checked in this order before it is read: from
/// the console's own pages ([`same_origin`], else 403), a live session (else 303 to the login page), role
/// `operator` (else 403), the session's CSRF token in the `csrf` field (else 403), then the form
/// itself (else 400 / 422).
#[derive(Debug)]
pub struct ActionForm<T> {
    /// Who acts.
    pub viewer: Viewer,
    /// The form.
    pub form: T,
}

/// Reads the session and the body; checks the role when `operator` and then the CSRF token.
async fn checked_form<T: DeserializeOwned>(
    req: Request,
    state: &AppState,
    operator: bool,
) -> Result<(Viewer, T), ConsoleError> {
    let (mut parts, body) = req.into_parts();
    same_origin(&parts.headers)?;
    let viewer = Viewer::from_request_parts(&mut parts, state).await?;
    if operator && !viewer.can_act() {
        return Err(ApiError::Forbidden(format!(
            "{} has role {}: it may look, not change anything",
            viewer.actor,
            viewer.role.as_str()
        ))
        .into());
    }
    // The body limit of the service applies before this (`[intake] max_body_bytes`).
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .map_err(|e| ApiError::BadRequest(format!("body: {e}")))?;
    let sent = form_urlencoded::parse(&bytes)
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v.into_owned());
    let valid = sent.is_some_and(|s| bool::from(s.as_bytes().ct_eq(viewer.csrf.as_bytes())));
    if !valid {
        return Err(ApiError::Forbidden(
            "the form's CSRF token is missing or wrong: reload the page and submit it again".into(),
        )
        .into());
    }
    let req = Request::from_parts(parts, Body::from(bytes));
    let Form(form) = Form::<T>::from_request(req, state)
        .await
        .map_err(|r| ApiError::from_rejection(r.status(), r.body_text()))?;
    Ok((viewer, form))
}

impl<T: DeserializeOwned + Send> FromRequest<AppState> for ActionForm<T> {
    type Rejection = ConsoleError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ConsoleError> {
        let (viewer, form) = checked_form(req, state, true).await?;
        Ok(Self { viewer, form })
    }
}

/// The login form.
#[derive(Debug, Deserialize)]
pub struct LoginForm {
    /// An operator token (never stored, logged or shown).
    pub token: String,
}

fn login_markup(error: Option<&str>) -> String {
    shell::bare(
        "Log in",
        html! {
            h1 { "deprov console" }
            p { "Log in with an operator token (" code { "deprov tokens create" } " or "
                code { "DEPROV_OPERATOR_TOKEN" } "). A " code { "read-only" }
                " token can look at everything and change nothing." }
            @if let Some(error) = error { p.error role="alert" { (error) } }
            form method="post" action=(LOGIN) {
                label for="token" { "Operator token" }
                input #token type="password" name="token" autocomplete="off" required autofocus;
                button type="submit" { "Log in" }
            }
        },
    )
    .into_string()
}

/// What the login page says when a browser would drop the session cookie: it is `Secure`, and a
/// browser keeps a `Secure` cookie only from HTTPS (or from localhost).
pub const PLAIN_HTTP: &str = "This page was not reached over HTTPS, so your browser will not keep the \
     console's session cookie (it is Secure) and the login would not last past this page. Serve the \
     console over HTTPS (a TLS-terminating proxy that sets X-Forwarded-Proto: https), or open it \
     on localhost.";

/// Whether a browser keeps a `Secure` cookie set in answer to this request: the request came over
/// HTTPS (a proxy's `X-Forwarded-Proto: https` or `Forwarded: proto=https`), or its `Host` is
/// `localhost`, `127.0.0.1` or `[::1]` (browsers treat these as secure).
pub fn keeps_secure_cookie(headers: &axum::http::HeaderMap) -> bool {
    if over_https(headers) {
        return true;
    }
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let name = if host.starts_with('[') {
        host.split_inclusive(']').next().unwrap_or("")
    } else {
        host.split(':').next().unwrap_or("")
    };
    matches!(name, "localhost" | "127.0.0.1" | "[::1]")
}

/// `GET /ui/login`: the login form; over plain HTTP on another host than localhost it says the
/// login cannot work ([`PLAIN_HTTP`]).
pub async fn login_page(headers: axum::http::HeaderMap) -> Html<String> {
    Html(login_markup(
        (!keeps_secure_cookie(&headers)).then_some(PLAIN_HTTP),
    ))
}

/// `POST /ui/login`: a valid operator token starts a session (303 to the kill switch page); any
/// other answers 401 with the login page again and counts against the peer address's failed logins
/// (`[console.login_rate_limit]`, [`super::login_limit::LoginLimit`]). Over plain HTTP on another host than localhost
/// ([`keeps_secure_cookie`]) no session is created: 400, the login page saying why
/// ([`PLAIN_HTTP`]).
///
/// # Errors
/// 403 from another site or origin ([`same_origin`]); 429 with `Retry-After`, the token unchecked,
/// when the peer address used up its failed logins; 503 when the state database is unavailable.
pub async fn login(
    State(state): State<AppState>,
    Peer(peer): Peer,
    headers: axum::http::HeaderMap,
    jar: CookieJar,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Result<Response, ConsoleError> {
    same_origin(&headers)?;
    if let Some(limit) = &state.login_limit
        && let Err(wait) = limit.admit(peer)
    {
        tracing::warn!(
            ?peer,
            "console login refused: too many failed logins from this address"
        );
        return Err(ApiError::TooManyRequests {
            detail: "too many failed logins from this address ([console.login_rate_limit]): \
                     try again after the time Retry-After gives"
                .into(),
            // Whole seconds, rounded up.
            retry_after: (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1),
        }
        .into());
    }
    let Form(form) = form.map_err(|r| ApiError::from_rejection(r.status(), r.body_text()))?;
    if !keeps_secure_cookie(&headers) {
        let page = login_markup(Some(PLAIN_HTTP));
        return Ok((axum::http::StatusCode::BAD_REQUEST, Html(page)).into_response());
    }
    let presented = form.token.trim();
    let operator = match state
        .operators
        .authenticate(&state.pools.intake, Some(presented))
        .await
    {
        Ok(operator) => operator,
        Err(ApiError::Unauthorized(_) | ApiError::Forbidden(_)) => {
            if let Some(limit) = &state.login_limit {
                limit.failed(peer);
            }
            let page = login_markup(Some("That is not a valid operator token."));
            return Ok((axum::http::StatusCode::UNAUTHORIZED, Html(page)).into_response());
        }
        Err(e) => return Err(e.into()),
    };
    let secret = sessions::generate();
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    sessions::create(
        &mut tx,
        &tokens::digest(&secret),
        TokenDigest::of(presented).bytes(),
        &operator.actor,
        SESSION_TTL,
    )
    .await?;
    tx.commit().await?;
    tracing::info!(actor = %operator.actor, "console login");
    let ttl = time::Duration::seconds(i64::try_from(SESSION_TTL.as_secs()).unwrap_or(i64::MAX));
    let cookie = Cookie::build((COOKIE, secret))
        .http_only(true)
        .secure(true)
        .same_site(SameSite::Strict)
        .path("/ui")
        .max_age(ttl)
        .expires(time::OffsetDateTime::now_utc() + ttl);
    Ok((jar.add(cookie), Redirect::to(super::paths::KILL_SWITCHES)).into_response())
}

/// `POST /ui/logout` (any role, CSRF-checked): ends the session and removes the cookie.
///
/// # Errors
/// 403 without the CSRF token; 503 when the state database is unavailable.
pub async fn logout(
    State(state): State<AppState>,
    jar: CookieJar,
    req: Request,
) -> Result<Response, ConsoleError> {
    let (viewer, _): (Viewer, serde::de::IgnoredAny) = checked_form(req, &state, false).await?;
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    sessions::end(&mut *tx, &viewer.session).await?;
    tx.commit().await?;
    let jar = jar.remove(Cookie::build(COOKIE).path("/ui"));
    Ok((jar, Redirect::to(LOGIN)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(scheme: &'static str, host: &str, port: u16) -> Option<Origin> {
        Some(Origin {
            scheme,
            host: host.into(),
            port,
        })
    }

    #[test]
    fn origins_parse_as_browsers_serialize_them() {
        assert_eq!(
            Origin::parse("http://a.example"),
            origin("http", "a.example", 80)
        );
        assert_eq!(
            Origin::parse("HTTPS://A.Example"),
            origin("https", "a.example", 443)
        );
        assert_eq!(
            Origin::parse("http://127.0.0.1:8080"),
            origin("http", "127.0.0.1", 8080)
        );
        assert_eq!(
            Origin::parse("http://[::1]:81"),
            origin("http", "[::1]", 81)
        );
        for refused in [
            "null",
            "",
            "a.example",
            "ftp://a.example",
            "http://",
            "http://a.example:",
            "http://a.example:99999",
            "http://a.example/",
            "http://user@a.example",
            "http://a.example?x",
        ] {
            assert_eq!(Origin::parse(refused), None, "{refused}");
        }
    }

    #[test]
    fn the_own_origin_is_the_host_header_over_the_scheme_a_proxy_names() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = axum::http::HeaderMap::new();
            for (name, value) in pairs {
                h.insert(*name, axum::http::HeaderValue::from_static(value));
            }
            h
        };
        assert_eq!(
            own_origin(&headers(&[("host", "127.0.0.1:8080")])),
            origin("http", "127.0.0.1", 8080)
        );
        assert_eq!(
            own_origin(&headers(&[
                ("host", "Deprov.Internal"),
                ("x-forwarded-proto", "https")
            ])),
            origin("https", "deprov.internal", 443)
        );
        assert_eq!(own_origin(&headers(&[])), None);
        let from = |origin: &'static str| {
            same_origin(&headers(&[("host", "127.0.0.1:8080"), ("origin", origin)])).is_ok()
        };
        assert!(from("http://127.0.0.1:8080"));
        assert!(!from("http://127.0.0.1:8081"));
        assert!(!from("https://127.0.0.1:8080"));
        assert!(!from("null"));
        assert!(same_origin(&headers(&[("host", "127.0.0.1:8080")])).is_ok());
        assert!(same_origin(&headers(&[("origin", "http://127.0.0.1:8080")])).is_err());
    }
}
