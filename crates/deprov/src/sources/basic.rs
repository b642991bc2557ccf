//! `scheme = "basic"`: HTTP Basic authentication (RFC 7617), `Authorization: Basic
//! base64(user-id ":" password)`, as the Open Service Broker API requires of a platform ("Platform to
//! Service Broker Authentication": "the Platform MUST authenticate with the Service Broker using
//! HTTP basic authentication") and as add-on callers such as Heroku's send.
//!
//! The user-id is compared with the configured `username` and the password with every configured
//! password (`secret_env` / `secret_file`: rotation, any may match). Both are compared as SHA-256
//! digests with `subtle`'s constant-time equality, visiting every configured password without
//! stopping at a match, so the time taken reveals neither which password matched nor a length.

use axum::http::HeaderMap;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::Reject;
use super::settings::{InvalidSource, Keys, Secrets, SourceConfig, invalid};

/// Longest configured `username`, in characters.
pub const MAX_USERNAME_LEN: usize = 256;

/// The header carrying the credentials.
pub const AUTHORIZATION: &str = "authorization";

/// The `WWW-Authenticate` challenge of a 401 answered to a `basic` source (RFC 7617 §2).
pub const CHALLENGE: &str = "Basic realm=\"deprov\"";

/// The user-id and password of an `Authorization: Basic …` value (the scheme name is
/// case-insensitive, RFC 7235 §2.1). The token must be padded standard base64 (RFC 7617 §2, RFC
/// 4648 §4) of valid UTF-8 holding a `:`; the user-id is the text before the first `:` (RFC 7617: a
/// user-id containing a colon is invalid), the password everything after it.
///
/// # Errors
/// [`Reject::Malformed`] for another scheme, a missing or non-base64 token, or a decoded value
/// that is not UTF-8 or has no `:`.
pub fn parse(value: &str) -> Result<(String, String), Reject> {
    let malformed = || Reject::Malformed(AUTHORIZATION);
    let (scheme, token) = value.trim().split_once(' ').ok_or_else(malformed)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(malformed());
    }
    let decoded = STANDARD.decode(token.trim()).map_err(|_| malformed())?;
    let text = String::from_utf8(decoded).map_err(|_| malformed())?;
    let (user, password) = text.split_once(':').ok_or_else(malformed)?;
    Ok((user.to_owned(), password.to_owned()))
}

/// The `Authorization` value that carries `user` and `password`: for clients and tests.
pub fn header_value(user: &str, password: &str) -> String {
    format!("Basic {}", STANDARD.encode(format!("{user}:{password}")))
}

/// Whether `user` and `password` are the configured `username` and one of `passwords`: digests
/// compared in constant time, every password visited (no early exit).
pub fn matches(username: &str, passwords: &[Vec<u8>], user: &str, password: &str) -> bool {
    let digest = |b: &[u8]| -> [u8; 32] { Sha256::digest(b).into() };
    let user_ok = digest(user.as_bytes()).ct_eq(&digest(username.as_bytes()));
    let presented = digest(password.as_bytes());
    let mut password_ok = subtle::Choice::from(0);
    for p in passwords {
        password_ok |= presented.ct_eq(&digest(p));
    }
    (user_ok & password_ok).into()
}

/// Verifies a request's `Authorization: Basic` header against `username` and `passwords`.
///
/// # Errors
/// [`Reject::Missing`] without the header, [`Reject::Repeated`] for a repeated one,
/// [`Reject::Malformed`] for an unparseable one ([`parse`]), [`Reject::WrongCredentials`] for a
/// wrong user-id or password.
pub fn verify(username: &str, passwords: &[Vec<u8>], headers: &HeaderMap) -> Result<(), Reject> {
    let value = super::required(headers, AUTHORIZATION)?;
    let (user, password) = parse(value)?;
    if matches(username, passwords, &user, &password) {
        Ok(())
    } else {
        Err(Reject::WrongCredentials)
    }
}

impl SourceConfig {
    /// `basic`: a `username` (1..=[`MAX_USERNAME_LEN`] characters, no `:` and no control
    /// characters, RFC 7617 §2) and at least one password, read (with [`Secrets::Read`]) as the
    /// source's keys: the password's UTF-8 bytes, trailing whitespace trimmed.
    ///
    /// # Errors
    /// [`InvalidSource`] naming `sources.NAME.username` or `…secret_env` / `…secret_file` (never a
    /// password).
    pub(super) fn prepare_basic(
        &mut self,
        name: &str,
        secrets: Secrets,
    ) -> Result<(), InvalidSource> {
        match self.username.as_deref() {
            None => return Err(invalid(name, "username", "required for scheme basic")),
            Some(u)
                if u.is_empty()
                    || u.chars().count() > MAX_USERNAME_LEN
                    || u.contains(':')
                    || u.chars().any(char::is_control) =>
            {
                return Err(invalid(
                    name,
                    "username",
                    format!(
                        "1..={MAX_USERNAME_LEN} characters without `:` or control characters \
                         (RFC 7617)"
                    ),
                ));
            }
            Some(_) => {}
        }
        if self.secret_env.is_empty() && self.secret_file.is_empty() {
            return Err(invalid(
                name,
                "secret_env",
                "give at least one password (secret_env or secret_file)",
            ));
        }
        if secrets == Secrets::Read {
            self.keys = Keys(self.read_keys(name)?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    /// RFC 7617 §2's example: `Aladdin` / `open sesame`.
    #[test]
    fn the_rfc_example_parses_and_verifies() {
        let value = "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==";
        assert_eq!(header_value("Aladdin", "open sesame"), value);
        assert_eq!(
            parse(value).unwrap(),
            ("Aladdin".to_owned(), "open sesame".to_owned())
        );
        let passwords = vec![b"old".to_vec(), b"open sesame".to_vec()];
        assert_eq!(verify("Aladdin", &passwords, &headers(value)), Ok(()));
        assert_eq!(
            verify("aladdin", &passwords, &headers(value)),
            Err(Reject::WrongCredentials)
        );
        assert_eq!(
            verify("Aladdin", &[b"old".to_vec()], &headers(value)),
            Err(Reject::WrongCredentials)
        );
    }

    #[test]
    fn a_password_may_hold_colons_and_the_scheme_is_case_insensitive() {
        let value = header_value("u", "a:b:c").replace("Basic", "bAsIc");
        assert_eq!(parse(&value).unwrap(), ("u".to_owned(), "a:b:c".to_owned()));
    }

    #[test]
    fn a_basic_source_needs_a_username_and_a_password_and_never_prints_it() {
        use crate::config::{Config, Secrets};
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "s3cret-password-value\n").unwrap();
        let file = format!("{:?}", file.display().to_string());
        let tenant = "[tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n";
        let entry = |body: &str| format!("[sources.p]\nscheme = \"basic\"\n{body}\n{tenant}");
        let config = Config::from_toml(&entry(&format!(
            "username = \"cf\"\nsecret_file = [{file}]"
        )))
        .unwrap();
        let source = &config.sources["p"];
        assert_eq!(source.keys.0, vec![b"s3cret-password-value".to_vec()]);
        assert!(
            !format!("{config:?}").contains("s3cret"),
            "passwords never in Debug"
        );
        for (body, key) in [
            (format!("secret_file = [{file}]"), "sources.p.username"),
            (
                format!("username = \"a:b\"\nsecret_file = [{file}]"),
                "sources.p.username",
            ),
            ("username = \"cf\"".to_owned(), "sources.p.secret_env"),
            (
                format!("username = \"cf\"\nsecret_file = [{file}]\ntoken = \"0123456789abcdef0\""),
                "sources.p.token",
            ),
        ] {
            let err = Config::from_toml_with(&entry(&body), Secrets::Skip)
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{body}: {err}");
        }
    }

    #[test]
    fn malformed_values_are_refused() {
        for value in [
            "Basic",
            "Bearer QWxhZGRpbjpvcGVuIHNlc2FtZQ==",
            "Basic not*base64",
            "Basic QWxhZGRpbg==",
            "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ",
            "Basic /w==",
        ] {
            assert_eq!(
                parse(value),
                Err(Reject::Malformed(AUTHORIZATION)),
                "{value}"
            );
        }
        assert_eq!(
            verify("u", &[b"p".to_vec()], &HeaderMap::new()),
            Err(Reject::Missing(AUTHORIZATION))
        );
        let mut twice = headers(&header_value("u", "p"));
        twice.append(
            AUTHORIZATION,
            HeaderValue::from_static("Basic Z2FyYmFnZQ=="),
        );
        assert_eq!(
            verify("u", &[b"p".to_vec()], &twice),
            Err(Reject::Repeated(AUTHORIZATION))
        );
        assert_eq!(
            Reject::Repeated(AUTHORIZATION).to_string(),
            "repeated Authorization header"
        );
    }
}
