//! Typed identifiers parsed at the edge, and the deterministic request-ID scheme.
//!
//! A deletion request's ID is a UUIDv5 (RFC 9562 §5.5, SHA-1 name-based) over [`REQUEST_NAMESPACE`] and
//! the name `"{source}\n{basis}\n{key}"`, where `basis` is `external_id`, `idempotency_key`,
//! `tenant_id` or `installation_id`. The same sender repeating the same request therefore always gets
//! the same ID, on any deprov instance, forever: this is what makes retries collapse.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The fixed namespace of deprov request IDs (version 1 of the scheme). Never change it: every stored
/// request ID was derived from it. It is itself `uuid5(NAMESPACE_URL, "https://deprov.dev/ns/request/v1")`.
pub const REQUEST_NAMESPACE: Uuid = Uuid::from_u128(0x344219f3_a87b_55c3_8cf0_ac8484addebc);

/// Upper bound on a tenant key's length in characters (Unicode scalar values, as OpenAPI's
/// `maxLength` counts them; at most 1024 bytes of UTF-8), so a key always fits an index entry.
pub const MAX_TENANT_ID_LEN: usize = 256;

/// A tenant key as the sender gave it (a string; cast to the root key column's type by the engine).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TenantId(String);

impl TenantId {
    /// Validates a tenant key: 1..=256 characters, no control characters.
    ///
    /// # Errors
    /// A human-readable reason when the key is empty, too long or contains control characters.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() {
            return Err("must not be empty".into());
        }
        if raw.chars().count() > MAX_TENANT_ID_LEN {
            return Err(format!("must be at most {MAX_TENANT_ID_LEN} characters"));
        }
        if raw.chars().any(char::is_control) {
            return Err("must not contain control characters".into());
        }
        Ok(Self(raw.to_owned()))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TenantId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How the type of `[tenant] key_column` reads a tenant key, so intake can refuse a key the cast
/// would refuse and store every key in the one form PostgreSQL prints it in (`"07"`, `"+7"` and
/// `" 7"` are all tenant `"7"` of a `bigint` column): one deterministic request ID, one job, and one
/// tenant kill switch per tenant. Learnt from the target's catalog at start
/// ([`crate::sqlcheck::Gate::key_form`]); other types are left to the worker's own cast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyForm {
    /// `smallint`, `integer` or `bigint`: a decimal integer in the type's range, optionally signed
    /// and surrounded by spaces (PostgreSQL docs §8.1.1; the hexadecimal, octal, binary and
    /// underscore forms PostgreSQL 16 added are refused). Printed without sign `+`, zeros or spaces.
    Integer {
        /// The smallest value of the type.
        min: i64,
        /// The largest value of the type.
        max: i64,
        /// The type's name, for messages.
        name: &'static str,
    },
    /// `uuid`: 32 hexadecimal digits, hyphenated 8-4-4-4-12 or not, optionally in braces, any
    /// case (a subset of PostgreSQL docs §8.12). Printed lower-case and hyphenated.
    Uuid,
    /// Any other type: the key is stored as sent and the worker's cast decides.
    AsSent,
}

impl KeyForm {
    /// The form of a key column of type `sql_type`, as `format_type` prints it.
    pub fn of(sql_type: &str) -> Self {
        match sql_type {
            "smallint" => Self::Integer {
                min: i16::MIN.into(),
                max: i16::MAX.into(),
                name: "smallint",
            },
            "integer" => Self::Integer {
                min: i32::MIN.into(),
                max: i32::MAX.into(),
                name: "integer",
            },
            "bigint" => Self::Integer {
                min: i64::MIN,
                max: i64::MAX,
                name: "bigint",
            },
            "uuid" => Self::Uuid,
            _ => Self::AsSent,
        }
    }

    /// `key` as the key column prints it.
    ///
    /// # Errors
    /// A human-readable reason when the column's type cannot read `key`.
    pub fn canonical(self, key: &TenantId) -> Result<TenantId, String> {
        let raw = key.as_str();
        match self {
            Self::Integer { min, max, name } => {
                let t = raw.trim_matches(' ');
                let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
                let refused = || {
                    format!(
                        "must be a decimal integer from {min} to {max} ([tenant] key_column is {name})"
                    )
                };
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(refused());
                }
                match t.parse::<i64>() {
                    Ok(n) if (min..=max).contains(&n) => Ok(TenantId(n.to_string())),
                    _ => Err(refused()),
                }
            }
            Self::Uuid => match Uuid::try_parse(raw) {
                Ok(u) if !raw.starts_with("urn:") => Ok(TenantId(u.hyphenated().to_string())),
                _ => Err(
                    "must be a UUID: 32 hexadecimal digits, hyphenated 8-4-4-4-12 or not, \
                          optionally in braces ([tenant] key_column is uuid)"
                        .into(),
                ),
            },
            Self::AsSent => Ok(key.clone()),
        }
    }

    /// [`Self::canonical`] when the type reads `key`, else `key` as sent (for senders that must
    /// not be refused: the job then fails with the cast's error).
    pub fn canonical_or_as_sent(self, key: &str) -> String {
        TenantId::parse(key)
            .ok()
            .and_then(|k| self.canonical(&k).ok())
            .map_or_else(|| key.to_owned(), |k| k.0)
    }
}

/// A job's ID (UUIDv7: time-ordered, so newer jobs sort later).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub Uuid);

impl JobId {
    /// A fresh, time-ordered job ID.
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }
}

impl Default for JobId {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// What a request's deterministic ID is derived from, in order of preference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupBasis {
    /// The sender's own ID for the request (`external_id` in the body).
    ExternalId,
    /// The `Idempotency-Key` header (IETF draft-ietf-httpapi-idempotency-key-header).
    IdempotencyKey,
    /// Nothing else given: the tenant key itself, so every retry for a tenant collapses.
    TenantId,
    /// A marketplace's natural key of an install: a Vercel installation ID (the partner API), an
    /// Open Service Broker service instance ID.
    InstallationId,
}

impl DedupBasis {
    /// The name stored in `deprov.deletion_requests.dedup_basis`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ExternalId => "external_id",
            Self::IdempotencyKey => "idempotency_key",
            Self::TenantId => "tenant_id",
            Self::InstallationId => "installation_id",
        }
    }
}

/// The deterministic request ID: `uuid5(REQUEST_NAMESPACE, "{source}\n{basis}\n{key}")`.
pub fn request_id(source: &str, basis: DedupBasis, key: &str) -> Uuid {
    let name = format!("{source}\n{}\n{key}", basis.as_str());
    Uuid::new_v5(&REQUEST_NAMESPACE, name.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_is_the_documented_derivation() {
        let derived = Uuid::new_v5(&Uuid::NAMESPACE_URL, b"https://deprov.dev/ns/request/v1");
        assert_eq!(
            REQUEST_NAMESPACE, derived,
            "update the constant's literal to {derived}"
        );
    }

    #[test]
    fn request_id_is_stable_and_separates_bases() {
        let a = request_id("billing", DedupBasis::TenantId, "42");
        assert_eq!(a, request_id("billing", DedupBasis::TenantId, "42"));
        assert_ne!(a, request_id("billing", DedupBasis::ExternalId, "42"));
        assert_ne!(a, request_id("other", DedupBasis::TenantId, "42"));
        assert_eq!(a.get_version_num(), 5);
    }

    #[test]
    fn tenant_id_rejects_bad_keys() {
        assert!(TenantId::parse("").is_err());
        assert!(TenantId::parse("a\nb").is_err());
        assert!(TenantId::parse(&"x".repeat(257)).is_err());
        // Characters, not bytes (OpenAPI `maxLength`): 256 three-byte characters fit, 257 do not.
        assert!(TenantId::parse(&"€".repeat(256)).is_ok());
        assert!(TenantId::parse(&"€".repeat(257)).is_err());
        assert_eq!(TenantId::parse("acct_1").unwrap().as_str(), "acct_1");
    }

    fn canonical(form: KeyForm, raw: &str) -> Result<String, String> {
        form.canonical(&TenantId::parse(raw).unwrap())
            .map(|k| k.as_str().to_owned())
    }

    #[test]
    fn integer_keys_are_printed_as_postgresql_prints_them() {
        let big = KeyForm::of("bigint");
        for (raw, printed) in [
            ("7", "7"),
            ("07", "7"),
            ("+7", "7"),
            (" 7 ", "7"),
            ("-0", "0"),
            ("-9223372036854775808", "-9223372036854775808"),
        ] {
            assert_eq!(canonical(big, raw).as_deref(), Ok(printed), "{raw:?}");
        }
        for raw in [
            "acct_1",
            " ",
            "+",
            "1.0",
            "1e3",
            "0x1F",
            "1_000",
            "9223372036854775808",
            "- 1",
            "１",
        ] {
            assert!(canonical(big, raw).is_err(), "{raw:?}");
        }
        let small = KeyForm::of("smallint");
        assert_eq!(canonical(small, "32767").as_deref(), Ok("32767"));
        assert!(canonical(small, "32768").unwrap_err().contains("smallint"));
        assert!(canonical(KeyForm::of("integer"), "2147483648").is_err());
    }

    #[test]
    fn uuid_keys_are_lower_case_and_hyphenated() {
        let printed = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11";
        for raw in [
            printed,
            "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
            "a0eebc999c0b4ef8bb6d6bb9bd380a11",
            "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
        ] {
            assert_eq!(
                canonical(KeyForm::Uuid, raw).as_deref(),
                Ok(printed),
                "{raw:?}"
            );
        }
        for raw in [
            "urn:uuid:a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "a0eebc99",
            "7",
        ] {
            assert!(canonical(KeyForm::Uuid, raw).is_err(), "{raw:?}");
        }
    }

    #[test]
    fn other_key_types_keep_the_key_as_sent() {
        for t in ["text", "character varying(20)", "numeric"] {
            assert_eq!(canonical(KeyForm::of(t), " 07 ").as_deref(), Ok(" 07 "));
        }
        assert_eq!(KeyForm::of("bigint").canonical_or_as_sent("07"), "7");
        assert_eq!(KeyForm::of("bigint").canonical_or_as_sent("acct"), "acct");
    }
}
