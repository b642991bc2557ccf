//! The operator console (`/ui`): access, sessions, CSRF and headers over HTTP, then the whole
//! console driven in Debian's chromium by playwright (`tests/console/console_test.py`) against a
//! live deprov with a worker deleting a paced tenant.
//!
//! The browser test needs playwright (PyPI, pinned in `.ci/run`, in the virtualenv
//! `/opt/deprov-pw`, or the Python named by `DEPROV_PLAYWRIGHT_PYTHON`) and `/usr/bin/chromium`
//! (or `DEPROV_CHROMIUM`). Missing: it fails under `CI=true` and is skipped with a loud message
//! otherwise. It writes its screenshots to a temporary directory, or to `docs/console/` with
//! `DEPROV_WRITE_SCREENSHOTS=1`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, COOKIE, LOCATION, RETRY_AFTER, SET_COOKIE};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{OPERATOR_TOKEN, SOURCE_TOKEN, TestApp, TestOptions, spawn_app_with};

/// The playwright version `.ci/run` installs.
const PLAYWRIGHT: &str = "1.65.2";

impl TestApp {
    /// Creates an operator token named `name` with `role` (as `deprov tokens create` does).
    async fn console_token(&self, name: &str, role: deprov::queue::tokens::Role) -> String {
        let mut conn = self.db.acquire().await.unwrap();
        let (_, token) =
            deprov::queue::tokens::create(&mut conn, name, role, "cli:test", "console")
                .await
                .unwrap();
        token
    }

    /// Logs in with `token`: the session cookie (`name=value`) and the `Set-Cookie` header.
    async fn console_login(&self, token: &str) -> (String, String) {
        let response = self
            .client
            .post(self.url("/ui/login"))
            .header(CONTENT_TYPE, FORM)
            .body(encode(&[("token", token)]))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        assert_eq!(response.headers()[LOCATION], "/ui/kill-switches");
        let set = response.headers()[SET_COOKIE].to_str().unwrap().to_owned();
        let pair = set.split(';').next().unwrap().to_owned();
        (pair, set)
    }

    async fn console_get(&self, cookie: &str, path: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .header(COOKIE, cookie)
            .send()
            .await
            .unwrap()
    }

    async fn console_post(
        &self,
        cookie: &str,
        path: &str,
        form: &[(&str, &str)],
    ) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .header(COOKIE, cookie)
            .header(CONTENT_TYPE, FORM)
            .body(encode(form))
            .send()
            .await
            .unwrap()
    }

    async fn global_engaged(&self) -> bool {
        sqlx::query_scalar("SELECT engaged FROM deprov.kill_switch")
            .fetch_one(&self.db)
            .await
            .unwrap()
    }

    async fn audit_count(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM deprov.audit_log")
            .fetch_one(&self.db)
            .await
            .unwrap()
    }
}

const FORM: &str = "application/x-www-form-urlencoded";

/// `pairs` as a form body.
fn encode(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// The CSRF token a page carries (the value of its hidden `csrf` fields).
fn csrf_of(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    page[at..at + page[at..].find('"').unwrap()].to_owned()
}

#[tokio::test]
async fn console_sessions_roles_csrf_and_headers() {
    let app = spawn_app_with(TestOptions::default()).await;
    let operator = app
        .console_token("alice", deprov::queue::tokens::Role::Operator)
        .await;
    let viewer = app
        .console_token("viewer", deprov::queue::tokens::Role::ReadOnly)
        .await;

    // Without a session every page sends the person to the login page; it carries the headers.
    let response = app.client.get(app.url("/ui/jobs")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()[LOCATION], "/ui/login");
    let response = app.client.get(app.url("/ui/login")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let h = response.headers();
    assert!(
        h["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("script-src 'self'")
    );
    assert!(
        h["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("frame-ancestors 'none'")
    );
    assert_eq!(h["x-frame-options"], "DENY");
    assert_eq!(h["cache-control"], "no-store");

    // A wrong token: 401, the login page again, no session stored, the token not echoed.
    let wrong = "dpv_not-a-token-at-all-0123456789";
    let response = app
        .client
        .post(app.url("/ui/login"))
        .header(CONTENT_TYPE, FORM)
        .body(encode(&[("token", wrong)]))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(response.headers().get(SET_COOKIE).is_none());
    let page = response.text().await.unwrap();
    assert!(page.contains("not a valid operator token") && !page.contains(wrong));
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM deprov.console_sessions")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(sessions, 0);

    // A login posted from another site is refused (login CSRF), even with a valid token.
    let response = app
        .client
        .post(app.url("/ui/login"))
        .header(CONTENT_TYPE, FORM)
        .header("sec-fetch-site", "cross-site")
        .body(encode(&[("token", &operator)]))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert!(response.headers().get(SET_COOKIE).is_none());

    // Over plain HTTP on another host than localhost the browser would drop the Secure cookie:
    // the login page says so and no session is created; behind an HTTPS proxy the login works.
    let page = app
        .client
        .get(app.url("/ui/login"))
        .header("host", "deprov.internal:8080")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("not reached over HTTPS"), "{page}");
    let response = app
        .client
        .post(app.url("/ui/login"))
        .header(CONTENT_TYPE, FORM)
        .header("host", "deprov.internal:8080")
        .body(encode(&[("token", &operator)]))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(response.headers().get(SET_COOKIE).is_none());
    let page = response.text().await.unwrap();
    assert!(
        page.contains("will not keep the console's session cookie")
            && page.contains("Serve the console over HTTPS"),
        "{page}"
    );
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM deprov.console_sessions")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(sessions, 0);
    let response = app
        .client
        .post(app.url("/ui/login"))
        .header(CONTENT_TYPE, FORM)
        .header("host", "deprov.internal")
        .header("x-forwarded-proto", "https")
        .body(encode(&[("token", &operator)]))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    sqlx::query("DELETE FROM deprov.console_sessions")
        .execute(&app.db)
        .await
        .unwrap();

    // The operator's session: cookie attributes, only the session's digest stored, no token shown.
    let (cookie, set) = app.console_login(&operator).await;
    for attribute in [
        "HttpOnly",
        "Secure",
        "SameSite=Strict",
        "Path=/ui",
        "Max-Age=28800",
    ] {
        assert!(set.contains(attribute), "{attribute} missing: {set}");
    }
    let secret = cookie.split_once('=').unwrap().1;
    let stored: Vec<u8> = sqlx::query_scalar("SELECT session_sha256 FROM deprov.console_sessions")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(stored, deprov::queue::tokens::digest(secret).to_vec());
    let page = app
        .console_get(&cookie, "/ui/kill-switches")
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains("Engage global") && page.contains(">alice<"));
    for secret_text in [operator.as_str(), viewer.as_str(), OPERATOR_TOKEN, secret] {
        assert!(!page.contains(secret_text), "a secret was rendered");
    }
    let csrf = csrf_of(&page);

    // A form without the CSRF token, or with another, is refused and changes nothing.
    let before = app.audit_count().await;
    for form in [
        vec![
            ("scope", "global"),
            ("engaged", "true"),
            ("reason", "forged"),
        ],
        vec![
            ("scope", "global"),
            ("engaged", "true"),
            ("reason", "forged"),
            ("csrf", "x"),
        ],
    ] {
        let response = app.console_post(&cookie, "/ui/kill-switches", &form).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        assert!(response.text().await.unwrap().contains("CSRF"));
    }
    // Posted from another site with the right token: refused too (a browser says where from).
    let response = app
        .client
        .post(app.url("/ui/kill-switches"))
        .header(COOKIE, &cookie)
        .header(CONTENT_TYPE, FORM)
        .header("sec-fetch-site", "cross-site")
        .body(encode(&[
            ("scope", "global"),
            ("engaged", "true"),
            ("reason", "forged"),
            ("csrf", &csrf),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert!(!app.global_engaged().await);
    assert_eq!(app.audit_count().await, before);

    // Bad input: an error page, nothing changed.
    let response = app
        .console_post(
            &cookie,
            "/ui/kill-switches",
            &[
                ("scope", "global"),
                ("engaged", "true"),
                ("reason", "  "),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        response.headers()[CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert!(response.text().await.unwrap().contains("reason"));
    assert!(!app.global_engaged().await);
    let response = app.console_get(&cookie, "/ui/jobs/not-a-uuid").await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let response = app.console_get(&cookie, "/ui/jobs?state=exploded").await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let response = app.console_get(&cookie, "/ui/audit?before=yesterday").await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(
        response.headers()[CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let response = app
        .client
        .post(app.url("/ui/login"))
        .header(CONTENT_TYPE, FORM)
        .body("tokn=x")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        response.headers()[CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );

    // With it: engaged, audited under the token's name, as `PUT /v1/kill-switch` does.
    let response = app
        .console_post(
            &cookie,
            "/ui/kill-switches",
            &[
                ("scope", "global"),
                ("engaged", "true"),
                ("reason", "console test"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert!(app.global_engaged().await);
    let (actor, action, reason): (String, String, String) = sqlx::query_as(
        "SELECT actor, action, reason FROM deprov.audit_log ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(
        (actor.as_str(), action.as_str(), reason.as_str()),
        ("alice", "kill_switch.engage", "console test")
    );

    // A tenant's switch and a source's, as the scoped form sends them; an unknown source is the
    // API's 422 and engages nothing.
    for (scope, key) in [("tenant", "acct_9"), ("source", "billing")] {
        let response = app
            .console_post(
                &cookie,
                "/ui/kill-switches",
                &[
                    ("scope", scope),
                    ("key", key),
                    ("engaged", "true"),
                    ("reason", "one scope"),
                    ("csrf", &csrf),
                ],
            )
            .await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER, "{scope}");
        let (engaged, changed_by): (bool, String) = sqlx::query_as(
            "SELECT engaged, changed_by FROM deprov.kill_switch_scopes WHERE scope = $1 AND key = $2",
        )
        .bind(scope)
        .bind(key)
        .fetch_one(&app.db)
        .await
        .unwrap();
        assert_eq!((engaged, changed_by.as_str()), (true, "alice"));
        let page = app
            .console_get(&cookie, response.headers()[LOCATION].to_str().unwrap())
            .await
            .text()
            .await
            .unwrap();
        assert!(
            page.contains(&format!("{scope}:{key} engaged at version")),
            "{page}"
        );
    }
    let response = app
        .console_post(
            &cookie,
            "/ui/kill-switches",
            &[
                ("scope", "source"),
                ("key", "nobody"),
                ("engaged", "true"),
                ("reason", "typo"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(response.text().await.unwrap().contains("no source"));

    // Read-only: every page, no action form, and its POSTs refused even with its CSRF token.
    let (ro_cookie, _) = app.console_login(&viewer).await;
    for path in [
        "/ui/kill-switches",
        "/ui/jobs",
        "/ui/reconcile",
        "/ui/audit",
    ] {
        let response = app.console_get(&ro_cookie, path).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let page = response.text().await.unwrap();
        assert!(page.contains("Read-only"), "{path}");
        for form in ["global-form", "scoped-form", "dry-run", "bulk"] {
            assert!(
                !page.contains(&format!("id=\"{form}\"")),
                "{path} shows {form}"
            );
        }
    }
    let ro_csrf = csrf_of(
        &app.console_get(&ro_cookie, "/ui/kill-switches")
            .await
            .text()
            .await
            .unwrap(),
    );
    let before = app.audit_count().await;
    for (path, form) in [
        (
            "/ui/kill-switches",
            vec![
                ("scope", "global"),
                ("engaged", "false"),
                ("reason", "ro"),
                ("csrf", ro_csrf.as_str()),
            ],
        ),
        (
            "/ui/reconcile/apply",
            vec![
                ("retry", "true"),
                ("reason", "ro"),
                ("csrf", ro_csrf.as_str()),
            ],
        ),
        (
            "/ui/jobs/act",
            vec![
                ("action", "cancel"),
                ("ids", "0195f3a0-0000-7000-8000-000000000000"),
                ("reason", "ro"),
                ("csrf", ro_csrf.as_str()),
            ],
        ),
    ] {
        let response = app.console_post(&ro_cookie, path, &form).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{path}");
    }
    assert!(
        app.global_engaged().await,
        "the read-only release changed nothing"
    );
    assert_eq!(app.audit_count().await, before);

    // Revoking the token ends its sessions (within the token cache's TTL).
    let mut conn = app.db.acquire().await.unwrap();
    deprov::queue::tokens::revoke(&mut conn, "viewer", "cli:test", "console test")
        .await
        .unwrap();
    drop(conn);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let response = app.console_get(&ro_cookie, "/ui/jobs").await;
        if response.status() == StatusCode::SEE_OTHER {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the revoked token's session still works"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Logout ends the session on the server, not only in the browser.
    let response = app
        .console_post(&cookie, "/ui/logout", &[("csrf", &csrf)])
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert!(
        response.headers()[SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
    let response = app.console_get(&cookie, "/ui/kill-switches").await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let sessions: i64 =
        sqlx::query_scalar("SELECT count(*) FROM deprov.console_sessions WHERE actor = 'alice'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(sessions, 0);
}

impl TestApp {
    /// Posts the login form with `token` and these extra headers (`Origin`, `Host`, …).
    async fn console_login_with(&self, token: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut request = self
            .client
            .post(self.url("/ui/login"))
            .header(CONTENT_TYPE, FORM)
            .body(encode(&[("token", token)]));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send().await.unwrap()
    }

    async fn session_count(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM deprov.console_sessions")
            .fetch_one(&self.db)
            .await
            .unwrap()
    }
}

/// A console POST whose `Origin` is not the console's own (another host, port or scheme, or
/// `null`) is refused with 403 and changes nothing, the login included; the console's own origin,
/// or no `Origin` at all, is accepted.
#[tokio::test]
async fn console_posts_from_another_origin_are_refused() {
    let app = spawn_app_with(TestOptions::default()).await;
    let operator = app
        .console_token("alice", deprov::queue::tokens::Role::Operator)
        .await;
    // Browsers send a form POST's real Origin only under a referrer policy that allows it (under
    // `no-referrer` they send `Origin: null`, refused below).
    let response = app.client.get(app.url("/ui/login")).send().await.unwrap();
    assert_eq!(response.headers()["referrer-policy"], "same-origin");
    let own = app.address.clone();
    let port = own.rsplit(':').next().unwrap().to_owned();
    let foreign = [
        "http://evil.example".to_owned(),
        format!("http://evil.example:{port}"),
        "http://127.0.0.1:1".to_owned(),
        format!("https://127.0.0.1:{port}"),
        format!("http://localhost:{port}"),
        "null".to_owned(),
        format!("{own}/ui"),
    ];

    // Login: refused from every foreign origin, no session made.
    for origin in &foreign {
        let response = app
            .console_login_with(&operator, &[("origin", origin)])
            .await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{origin}");
        assert!(response.headers().get(SET_COOKIE).is_none(), "{origin}");
        assert!(
            response
                .text()
                .await
                .unwrap()
                .contains("only from its own pages"),
            "{origin}"
        );
    }
    assert_eq!(app.session_count().await, 0);
    // From the console's own origin (any case, the default port written or not), and without one.
    let response = app.console_login_with(&operator, &[("origin", &own)]).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(app.session_count().await, 1);
    let response = app
        .console_login_with(&operator, &[("origin", &own.to_uppercase())])
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let (cookie, _) = app.console_login(&operator).await;
    assert_eq!(app.session_count().await, 3);
    // Behind a TLS-terminating proxy that passes the browser's Host on.
    let behind_proxy = |origin: &'static str| {
        [
            ("host", "deprov.internal"),
            ("x-forwarded-proto", "https"),
            ("origin", origin),
        ]
    };
    for origin in ["https://deprov.internal", "https://deprov.internal:443"] {
        let response = app
            .console_login_with(&operator, &behind_proxy(origin))
            .await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER, "{origin}");
    }
    let response = app
        .console_login_with(&operator, &behind_proxy("http://deprov.internal"))
        .await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert_eq!(app.session_count().await, 5);

    // An action with the session and its CSRF token, from a foreign origin: refused, nothing
    // changed, nothing audited.
    let page = app
        .console_get(&cookie, "/ui/kill-switches")
        .await
        .text()
        .await
        .unwrap();
    let csrf = csrf_of(&page);
    let engage = encode(&[
        ("scope", "global"),
        ("engaged", "true"),
        ("reason", "from elsewhere"),
        ("csrf", &csrf),
    ]);
    let post = |origin: Option<&str>| {
        let mut request = app
            .client
            .post(app.url("/ui/kill-switches"))
            .header(COOKIE, &cookie)
            .header(CONTENT_TYPE, FORM)
            .body(engage.clone());
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };
    let before = app.audit_count().await;
    for origin in &foreign {
        let response = post(Some(origin)).await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{origin}");
    }
    let response = app
        .client
        .post(app.url("/ui/logout"))
        .header(COOKIE, &cookie)
        .header(CONTENT_TYPE, FORM)
        .header("origin", "http://evil.example")
        .body(encode(&[("csrf", &csrf)]))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert!(!app.global_engaged().await);
    assert_eq!(app.audit_count().await, before);
    assert_eq!(app.session_count().await, 5, "the logout ended no session");

    // From its own origin, and without one: engaged, then released.
    let response = post(Some(&own)).await.unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert!(app.global_engaged().await);
    let response = app
        .console_post(
            &cookie,
            "/ui/kill-switches",
            &[
                ("scope", "global"),
                ("engaged", "false"),
                ("reason", "no origin header"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert!(!app.global_engaged().await);
    assert_eq!(app.audit_count().await, before + 2);
}

/// Failed logins are limited per peer address (`[console.login_rate_limit]`): once an address has
/// used up its failures, its next login is answered 429 with `Retry-After` and the console's error
/// page, whatever the token (it is not checked), and starts no session. Successful logins count
/// nothing, and another address keeps its own quota.
#[tokio::test]
async fn console_failed_logins_are_limited_per_address() {
    let app = spawn_app_with(TestOptions {
        extra_config: "[console.login_rate_limit]\nper_second = 0.01\nburst = 3\n".into(),
        ..TestOptions::default()
    })
    .await;
    let operator = app
        .console_token("alice", deprov::queue::tokens::Role::Operator)
        .await;
    for _ in 0..5 {
        app.console_login(&operator).await;
    }
    assert_eq!(app.session_count().await, 5);
    let wrong = "dpv_not-a-token-at-all-0123456789";
    for attempt in 1..=3 {
        let response = app.console_login_with(wrong, &[]).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{attempt}");
    }
    for token in [operator.as_str(), wrong] {
        let response = app.console_login_with(token, &[]).await;
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(response.headers().get(SET_COOKIE).is_none());
        let retry_after: u64 = response.headers()[RETRY_AFTER]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=100).contains(&retry_after), "{retry_after}");
        assert!(
            response.headers()[CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/html")
        );
        assert!(response.headers().contains_key("content-security-policy"));
        let page = response.text().await.unwrap();
        assert!(
            page.contains("Too many requests") && page.contains("[console.login_rate_limit]"),
            "{page}"
        );
    }
    assert_eq!(app.session_count().await, 5, "no session while limited");

    // From another address (127.0.0.2 reaches the server's 127.0.0.1 over loopback): its own quota.
    let other = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    let response = other
        .post(app.url("/ui/login"))
        .header(CONTENT_TYPE, FORM)
        .body(encode(&[("token", &operator)]))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(app.session_count().await, 6);
}

/// The Python with playwright, or `None`.
fn find_playwright() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("DEPROV_PLAYWRIGHT_PYTHON") {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    Some(PathBuf::from("/opt/deprov-pw/bin/python")).filter(|p| p.is_file())
}

fn chromium() -> PathBuf {
    std::env::var_os("DEPROV_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from)
}

/// Rows of the tenant the browser watches being deleted, and how fast the worker may delete them.
const BIG_ROWS: i64 = 12000;
const ROWS_PER_SECOND: i64 = 150;

/// The target: `app.items` below `app.accounts` (deleted in paced batches), tenant `big` with
/// [`BIG_ROWS`] items; tenant `stuck`, which a RESTRICT reference keeps from being deleted (its
/// job fails: the reconcile's retry has something to do).
const TARGET: &str = "CREATE TABLE app.items (id bigserial PRIMARY KEY, \
       account_id text NOT NULL REFERENCES app.accounts ON DELETE CASCADE); \
     CREATE INDEX ON app.items (account_id); \
     CREATE TABLE app.keep (account_id text REFERENCES app.accounts ON DELETE RESTRICT); \
     INSERT INTO app.accounts (id) VALUES ('big'), ('stuck'); \
     INSERT INTO app.keep VALUES ('stuck'); \
     ANALYZE app.accounts;";

async fn wait_job(app: &TestApp, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let job: Value = app
            .operator_get(&format!("/v1/jobs/{id}"))
            .await
            .json()
            .await
            .unwrap();
        if pred(&job) {
            return job;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {job}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn request_deletion(app: &TestApp, tenant: &str) -> String {
    let response = app
        .client
        .post(app.url("/v1/deletion-requests"))
        .bearer_auth(SOURCE_TOKEN)
        .json(&json!({"tenant_id": tenant, "external_id": format!("evt-{tenant}")}))
        .send()
        .await
        .unwrap();
    let body = crate::helpers::accepted(response).await;
    body["job_id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_chromium() {
    let Some(python) = find_playwright() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "playwright is not installed (DEPROV_PLAYWRIGHT_PYTHON or /opt/deprov-pw/bin/python); \
             .ci/run installs playwright=={PLAYWRIGHT}"
        );
        let _ = std::io::stderr().write_all(
            format!(
                "\n!!!!! SKIPPED: playwright not found. Install it with `python3 -m venv /opt/deprov-pw \
                 && /opt/deprov-pw/bin/pip install playwright=={PLAYWRIGHT}` and `apt-get install \
                 chromium` (or run .ci/run); the console was NOT tested in a browser. !!!!!\n\n"
            )
            .as_bytes(),
        );
        return;
    };
    assert!(
        chromium().is_file(),
        "{} is missing (apt-get install chromium)",
        chromium().display()
    );
    let app = spawn_app_with(TestOptions {
        worker: true,
        target_setup: format!(
            "{TARGET} INSERT INTO app.items (account_id) SELECT 'big' FROM generate_series(1, {BIG_ROWS}); \
             ANALYZE app.items;"
        ),
        extra_config: format!(
            "[hard_delete]\nbatch_rows = 25\nmax_batch_rows = 25\ncascade_rows = 0\nwhole_cascade = false\n\
             [pacing]\nrate_limit = {ROWS_PER_SECOND}\n"
        ),
        ..Default::default()
    })
    .await;
    // A second worker beside the server's, without a LISTEN connection: it acknowledges by
    // heartbeat only, and "every worker acknowledged" must wait for it too.
    let config = deprov::config::Config::load(app.config_path().to_str().unwrap()).unwrap();
    let pools = deprov::db::Pools::new(&app.db_url, &app.db_url, &config.pools).unwrap();
    let second =
        deprov::worker::Worker::new(pools, std::sync::Arc::new(config), "heartbeat-only".into());
    let stop = tokio_util::sync::CancellationToken::new();
    let second = tokio::spawn({
        let stop = stop.clone();
        async move { second.run(stop).await }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while app
        .operator_get("/v1/kill-switch")
        .await
        .json::<Value>()
        .await
        .unwrap()["live_workers"]
        .as_array()
        .unwrap()
        .len()
        < 2
    {
        assert!(Instant::now() < deadline, "two live workers");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let operator = app
        .console_token("alice", deprov::queue::tokens::Role::Operator)
        .await;
    let viewer = app
        .console_token("viewer", deprov::queue::tokens::Role::ReadOnly)
        .await;
    let stuck = request_deletion(&app, "stuck").await;
    wait_job(&app, &stuck, "stuck failed", |j| j["state"] == "failed").await;
    let big = request_deletion(&app, "big").await;
    wait_job(&app, &big, "big running", |j| {
        j["state"] == "running" && j["progress"]["rows_deleted"].as_i64().unwrap_or(0) > 0
    })
    .await;

    let write = std::env::var("DEPROV_WRITE_SCREENSHOTS").as_deref() == Ok("1");
    let tmp = tempfile::tempdir().unwrap();
    let shots = if write {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/console")
    } else {
        tmp.path().to_path_buf()
    };
    std::fs::create_dir_all(&shots).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console/console_test.py");
    let started = Instant::now();
    let child = tokio::process::Command::new(&python)
        .arg(&script)
        .env("DEPROV_URL", &app.address)
        .env("DEPROV_CONSOLE_OPERATOR", &operator)
        .env("DEPROV_CONSOLE_READONLY", &viewer)
        .env("DEPROV_API_TOKEN", OPERATOR_TOKEN)
        .env("DEPROV_BIG_JOB", &big)
        .env("DEPROV_STUCK_JOB", &stuck)
        .env("DEPROV_WORKERS", "2")
        .env("DEPROV_SCREENSHOTS", &shots)
        .env("DEPROV_CHROMIUM", chromium())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", python.display()));
    let output = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .expect("the browser test ran longer than 300 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let _ = std::io::stderr().write_all(
        format!(
            "\nconsole browser test ({:.1} s):\n{stdout}\n{stderr}\n",
            started.elapsed().as_secs_f64()
        )
        .as_bytes(),
    );
    assert!(
        output.status.success(),
        "the browser test failed (exit {:?})",
        output.status.code()
    );
    assert!(stdout.contains("passed, 0 failed"), "no summary: {stdout}");

    // What the browser did is in the database, under the operator's name.
    let actions: Vec<String> =
        sqlx::query_scalar("SELECT action FROM deprov.audit_log WHERE actor = 'alice' ORDER BY id")
            .fetch_all(&app.db)
            .await
            .unwrap();
    for expected in ["kill_switch.engage", "kill_switch.release", "job.retry"] {
        assert!(
            actions.iter().any(|a| a == expected),
            "{expected} not in {actions:?}"
        );
    }
    assert!(!actions.iter().any(|a| a.contains("forged")), "{actions:?}");
    let engaged: bool = app.global_engaged().await;
    assert!(
        !engaged,
        "the browser released the switch; nothing forged engaged it again"
    );
    let _ = Uuid::parse_str(&big).unwrap();
    stop.cancel();
    second.await.unwrap();
}

/// Soft delete and undo on `app.accounts.deleted_at`, and a grace period: jobs wait after their
/// soft delete, so their undo is possible.
const GRACE: &str = "[soft_delete]\n\
     statements = [\"UPDATE app.accounts SET deleted_at = now() WHERE id = $1\"]\n\
     undo_statements = [\"UPDATE app.accounts SET deleted_at = NULL WHERE id = $1\"]\n\
     [hard_delete]\ngrace_period = \"1h\"\n";

async fn job_state(app: &TestApp, id: &str) -> String {
    sqlx::query_scalar("SELECT state FROM deprov.jobs WHERE id = $1::uuid")
        .bind(id)
        .fetch_one(&app.db)
        .await
        .unwrap()
}

async fn last_audit(app: &TestApp) -> (String, String, Option<String>, String) {
    sqlx::query_as(
        "SELECT actor, action, target, reason FROM deprov.audit_log ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(&app.db)
    .await
    .unwrap()
}

#[tokio::test]
async fn console_job_actions_confirm_the_count_then_act_through_the_api_functions() {
    let app = spawn_app_with(TestOptions {
        target_setup: "ALTER TABLE app.accounts ADD COLUMN deleted_at timestamptz; \
                       INSERT INTO app.accounts (id) VALUES ('t1'), ('t2'), ('t3');"
            .into(),
        extra_config: GRACE.into(),
        ..Default::default()
    })
    .await;
    let operator = app
        .console_token("alice", deprov::queue::tokens::Role::Operator)
        .await;
    let t1 = request_deletion(&app, "t1").await;
    let t2 = request_deletion(&app, "t2").await;
    let (cookie, _) = app.console_login(&operator).await;
    let page = app
        .console_get(&cookie, "/ui/jobs")
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains(&t1) && page.contains(&t2) && page.contains("id=\"bulk\""));
    let csrf = csrf_of(&page);

    // The confirmation of a bulk cancel on a filter states the count; it changes nothing.
    let before = app.audit_count().await;
    let response = app
        .console_post(
            &cookie,
            "/ui/jobs/confirm",
            &[("action", "cancel"), ("tenant", "t1"), ("csrf", &csrf)],
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let page = response.text().await.unwrap();
    assert!(page.contains("Confirm: cancel 1 job(s)"), "{page}");
    assert!(page.contains(&t1) && !page.contains(&t2));
    assert_eq!(job_state(&app, &t1).await, "queued");
    assert_eq!(app.audit_count().await, before);

    // Confirmed: exactly that job, audited under the operator's name with the reason.
    let response = app
        .console_post(
            &cookie,
            "/ui/jobs/act",
            &[
                ("action", "cancel"),
                ("ids", &t1),
                ("reason", "duplicate"),
                ("csrf", &csrf),
            ],
        )
        .await;
    // The action answers with a redirect to a page that only reads what was done: loading it
    // again (a reload) acts on nothing.
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let done = response.headers()[LOCATION].to_str().unwrap().to_owned();
    assert!(done.starts_with("/ui/jobs/done?"), "{done}");
    let after_act = app.audit_count().await;
    assert_eq!(after_act, before + 1);
    for _ in 0..2 {
        let response = app.console_get(&cookie, &done).await;
        assert_eq!(response.status(), StatusCode::OK);
        let page = response.text().await.unwrap();
        assert!(
            page.contains("Done: cancel — 1 of the 1 confirmed job(s).")
                && page.contains("queued → <strong>cancelled</strong>")
                && page.contains(&t1),
            "{page}"
        );
    }
    assert_eq!(app.audit_count().await, after_act);
    assert_eq!(
        (job_state(&app, &t1).await, job_state(&app, &t2).await),
        ("cancelled".into(), "queued".into())
    );
    assert_eq!(
        last_audit(&app).await,
        (
            "alice".into(),
            "job.cancel".into(),
            Some(format!("job:{t1}")),
            "duplicate".into()
        )
    );

    // A running job's confirmation and result name its state before and what happens to it; a
    // confirmed job whose state changed since is skipped, and the result says so.
    let t3 = request_deletion(&app, "t3").await;
    sqlx::query(
        "UPDATE deprov.jobs SET state = 'running', lease_owner = 'w-elsewhere', \
         lease_expires_at = now() + interval '1 hour' WHERE id = $1::uuid",
    )
    .bind(&t3)
    .execute(&app.db)
    .await
    .unwrap();
    let page = app
        .console_post(
            &cookie,
            "/ui/jobs/confirm",
            &[("action", "cancel"), ("ids", &t3), ("csrf", &csrf)],
        )
        .await
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("running → <strong>cancelled at its next batch boundary</strong>"),
        "{page}"
    );
    let both = format!("{t1},{t3}");
    let response = app
        .console_post(
            &cookie,
            "/ui/jobs/act",
            &[
                ("action", "cancel"),
                ("ids", &both),
                ("reason", "stop it"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let done = response.headers()[LOCATION].to_str().unwrap().to_owned();
    let page = app.console_get(&cookie, &done).await.text().await.unwrap();
    assert!(
        page.contains("Done: cancel — 1 of the 2 confirmed job(s). 1 skipped: their state changed since the confirmation.")
            && page.contains("running → <strong>cancelled at its next batch boundary</strong>")
            && !page.contains(&format!("data-job=\"{t1}\"")),
        "{page}"
    );
    assert_eq!(app.audit_count().await, after_act + 1);

    // None of the confirmed jobs exists: 404, no audit entry claimed or written.
    let response = app
        .console_post(
            &cookie,
            "/ui/jobs/act",
            &[
                ("action", "cancel"),
                ("ids", &Uuid::now_v7().to_string()),
                ("reason", "ghost"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let page = response.text().await.unwrap();
    assert!(
        page.contains("nothing was recorded") && !page.contains("Recorded in the audit log"),
        "{page}"
    );
    assert_eq!(app.audit_count().await, after_act + 1);

    // Nothing to retry: said so, and no button to act.
    let page = app
        .console_post(
            &cookie,
            "/ui/jobs/confirm",
            &[("action", "retry"), ("state", "queued"), ("csrf", &csrf)],
        )
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains("Confirm: retry 0 job(s)") && !page.contains("id=\"confirm\""));

    // Undo of a job waiting in its grace period: the soft delete is undone on the target.
    app.drain_worker().await;
    let deleted: bool =
        sqlx::query_scalar("SELECT deleted_at IS NOT NULL FROM app.accounts WHERE id = 't2'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert!(deleted, "t2 is soft-deleted and waits in its grace period");
    let page = app
        .console_post(
            &cookie,
            "/ui/jobs/confirm",
            &[("action", "undo"), ("ids", &t2), ("csrf", &csrf)],
        )
        .await
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("Confirm: undo 1 job(s)") && page.contains("nothing deleted can be undone")
    );
    let response = app
        .console_post(
            &cookie,
            "/ui/jobs/act",
            &[
                ("action", "undo"),
                ("ids", &t2),
                ("reason", "reinstalled"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let done = response.headers()[LOCATION].to_str().unwrap().to_owned();
    let page = app.console_get(&cookie, &done).await.text().await.unwrap();
    assert!(
        page.contains("Done: undo — 1 of the 1 confirmed job(s).")
            && page.contains("cancelled (soft delete undone)"),
        "{page}"
    );
    assert_eq!(job_state(&app, &t2).await, "cancelled");
    let deleted: bool =
        sqlx::query_scalar("SELECT deleted_at IS NOT NULL FROM app.accounts WHERE id = 't2'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert!(!deleted, "the undo statements ran");
    assert_eq!(
        last_audit(&app).await,
        (
            "alice".into(),
            "job.undo".into(),
            Some(format!("job:{t2}")),
            "reinstalled".into()
        )
    );

    // An unknown job is the API's 404, as a page; a malformed ID is 422; nothing changes.
    let before = app.audit_count().await;
    let unknown = Uuid::now_v7().to_string();
    let response = app
        .console_post(
            &cookie,
            "/ui/jobs/act",
            &[
                ("action", "undo"),
                ("ids", &unknown),
                ("reason", "again"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let response = app
        .console_post(
            &cookie,
            "/ui/jobs/act",
            &[
                ("action", "cancel"),
                ("ids", "nope"),
                ("reason", "x"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(app.audit_count().await, before);

    // A reconcile apply redirects to a page that reads what it did: reloading it retries nothing.
    sqlx::query("UPDATE deprov.jobs SET state = 'failed', finished_at = now() WHERE id = $1::uuid")
        .bind(&t1)
        .execute(&app.db)
        .await
        .unwrap();
    let response = app
        .console_post(
            &cookie,
            "/ui/reconcile/apply",
            &[
                ("retry", "true"),
                ("tenant", "t1"),
                ("reason", "retry t1"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let applied = response.headers()[LOCATION].to_str().unwrap().to_owned();
    assert!(applied.starts_with("/ui/reconcile/applied?"), "{applied}");
    assert_eq!(job_state(&app, &t1).await, "queued");
    let after_apply = app.audit_count().await;
    for _ in 0..2 {
        let page = app
            .console_get(&cookie, &applied)
            .await
            .text()
            .await
            .unwrap();
        assert!(
            page.contains("Applied: 1 action(s)")
                && page.contains(&format!("data-job=\"{t1}\" data-action=\"retry\""))
                && page.contains("failed → <strong>queued</strong></td><td>20"),
            "{page}"
        );
    }
    assert_eq!(app.audit_count().await, after_apply);

    // Jobs by request or delivery ID: the external ID finds its job and no other.
    let page = app
        .console_get(&cookie, "/ui/jobs?request=evt-t2")
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains(&t2) && !page.contains(&t1), "{page}");

    // The job page shows its requests, and an unknown console path is an HTML 404 with the headers.
    let page = app
        .console_get(&cookie, &format!("/ui/jobs/{t2}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains("evt-t2") && page.contains("billing"));
    let response = app.console_get(&cookie, "/ui/nothing-here").await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(response.headers()["x-frame-options"], "DENY");
}

#[tokio::test]
async fn console_kill_switch_names_a_silent_lease_holder_and_scopes_checkpoints() {
    let app = spawn_app_with(TestOptions {
        target_setup: "INSERT INTO app.accounts (id) VALUES ('t1'), ('t2');".into(),
        ..Default::default()
    })
    .await;
    let operator = app
        .console_token("alice", deprov::queue::tokens::Role::Operator)
        .await;
    let t1 = request_deletion(&app, "t1").await;
    let t2 = request_deletion(&app, "t2").await;
    // t1 runs under the lease of a worker last heard from 5 minutes ago (no longer live); another
    // worker is live and acknowledges every version.
    sqlx::query(
        "UPDATE deprov.jobs SET state = 'running', step = 'hard_delete', lease_owner = 'w-silent', \
         lease_expires_at = now() + interval '1 hour', heartbeat_at = now() - interval '5 min' \
         WHERE id = $1::uuid",
    )
    .bind(&t1)
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO deprov.workers (id, heartbeat_at, live_until, observed_version, last_destroyed_at) VALUES \
         ('w-silent', now() - interval '300 s', now() - interval '240 s', 0, NULL), \
         ('w-live', now(), now() + interval '1 hour', 100, now() - interval '10 s')",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let (cookie, _) = app.console_login(&operator).await;
    let csrf = csrf_of(
        &app.console_get(&cookie, "/ui/kill-switches")
            .await
            .text()
            .await
            .unwrap(),
    );
    let response = app
        .console_post(
            &cookie,
            "/ui/kill-switches",
            &[
                ("scope", "global"),
                ("engaged", "true"),
                ("reason", "incident"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let location = response.headers()[LOCATION].to_str().unwrap().to_owned();
    assert_eq!(job_state(&app, &t2).await, "held");
    let page = app
        .console_get(&cookie, &location)
        .await
        .text()
        .await
        .unwrap();
    // The live worker's last destructive statement, in its row and against the engage.
    assert!(
        page.contains("Last destructive statement ended")
            && page.contains("data-last-destructive=\"before\"")
            && !page.contains("data-last-destructive=\"after\""),
        "{page}"
    );
    // The engage says what it did to queued and to running jobs.
    assert!(
        page.contains("1 queued job(s) moved to held; 1 running job(s) it blocks still running now (each stops at its next batch boundary"),
        "{page}"
    );
    // The live worker acknowledged, but the banner is not the all-clear: a blocked job still runs,
    // under the lease of a worker that is not live, and the page names it.
    assert!(
        page.contains("class=\"banner warn\" id=\"ack-state\" data-acknowledged=\"true\"")
            && !page.contains("class=\"banner ok\" id=\"ack-state\""),
        "{page}"
    );
    assert!(
        page.contains("but 1 running job(s) an engaged switch blocks have not stopped yet"),
        "{page}"
    );
    let silent = "worker <span class=\"mono\">w-silent</span> holds a running job's lease but has not been heard from for ";
    let at = page.find(silent).unwrap_or_else(|| panic!("{page}")) + silent.len();
    let seconds: i64 = page[at..at + page[at..].find(' ').unwrap()]
        .parse()
        .unwrap();
    assert!((300..400).contains(&seconds), "{seconds}");
    assert!(
        page.contains("data-effect=\"pending\"")
            && !page.contains("data-effect=\"in-effect\"")
            && page.contains(&format!("data-job=\"{t1}\""))
            && page
                .contains("lease held by <span class=\"mono\">w-silent</span> — not a live worker"),
        "{page}"
    );
    // The checkpoint a verdict cites: of any job for the global switch; of the tenant's own jobs
    // for a tenant switch (t1 checkpoints after the engage; tenant t2 has none).
    let response = app
        .console_post(
            &cookie,
            "/ui/kill-switches",
            &[
                ("scope", "tenant"),
                ("key", "t2"),
                ("engaged", "true"),
                ("reason", "t2 only"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    sqlx::query("UPDATE deprov.jobs SET heartbeat_at = now() + interval '1 s' WHERE id = $1::uuid")
        .bind(&t1)
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE deprov.workers SET last_destroyed_at = now() + interval '1 s' WHERE id = 'w-live'",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let page = app
        .console_get(&cookie, "/ui/kill-switches")
        .await
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("last hard-delete checkpoint of any job ")
            && page.contains("no hard-delete checkpoint of this tenant's jobs since the engage")
            && page.contains("data-last-destructive=\"after\""),
        "{page}"
    );
    // The held tile gives the job's age, as such.
    let page = app
        .console_get(&cookie, "/ui/jobs")
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains("oldest held job, created"), "{page}");
}
