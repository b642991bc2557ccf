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
    /// A Vercel installation ID (the partner API's natural key).
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
}
