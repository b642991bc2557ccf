//! `[osb]`: the Open Service Broker API's deprovision side (`DELETE
//! /v2/service_instances/{instance_id}` and its `last_operation`, see [`crate::http::osb`]).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{ConfigError, SourceConfig, invalid};
use crate::sources::Scheme;

/// The default lowest accepted `X-Broker-API-Version`: 2.12, the version whose status codes say when
/// they MUST be returned and whose string parameters, if present, MUST be non-empty (the spec's
/// release notes, v2.12) — the rules the deprovision route relies on.
pub const DEFAULT_MIN_API_VERSION: &str = "2.12";

/// `[osb]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OsbConfig {
    /// The `[sources.NAME]` (scheme `basic`) whose credentials the platform sends; requests are
    /// recorded under it.
    pub source: String,
    /// Optional statement run by the worker on the target, `$1` = the service instance ID,
    /// returning the tenant key in its first column (no row: nothing to delete, answered 410).
    /// Without it the instance ID is the tenant key.
    pub tenant_lookup: Option<String>,
    /// The lowest accepted `X-Broker-API-Version`, `"2.MINOR"` (default
    /// [`DEFAULT_MIN_API_VERSION`]; MINOR of up to 9 digits): every 2.x from it up is accepted, any
    /// other is refused 412.
    #[serde(default = "default_min")]
    pub min_api_version: String,
}

fn default_min() -> String {
    DEFAULT_MIN_API_VERSION.to_owned()
}

/// Most decimal digits of a MINOR in `"2.MINOR"`: every 2.x a platform can send (`2.100` included).
pub const MAX_MINOR_DIGITS: usize = 9;

/// The minor version of a `"2.MINOR"` text (MINOR of 1..=9 decimal digits); `None` otherwise.
pub fn minor_of(version: &str) -> Option<u32> {
    let minor = version.strip_prefix("2.")?;
    if minor.is_empty()
        || minor.len() > MAX_MINOR_DIGITS
        || !minor.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    minor.parse().ok()
}

impl OsbConfig {
    /// The lowest accepted minor version of 2.x (validated at load).
    pub fn min_minor(&self) -> u32 {
        minor_of(&self.min_api_version).unwrap_or(12)
    }

    /// `sources` is the file's `[sources.NAME]`: the broker's source must be one of them, of scheme
    /// `basic`, without a `tenant_lookup` of its own (the broker's is `[osb] tenant_lookup`).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `osb.source`, `osb.tenant_lookup` or `osb.min_api_version`.
    pub(super) fn validate(
        &self,
        sources: &BTreeMap<String, SourceConfig>,
    ) -> Result<(), ConfigError> {
        let Some(source) = sources.get(&self.source) else {
            return Err(invalid(
                "osb.source",
                format!("no [sources.{}] is configured", self.source),
            ));
        };
        if source.scheme != Scheme::Basic {
            return Err(invalid(
                "osb.source",
                format!(
                    "sources.{} has scheme {:?}; Open Service Broker platforms send HTTP Basic \
                     credentials: give it scheme = \"basic\"",
                    self.source,
                    source.scheme.as_str()
                ),
            ));
        }
        if source.tenant_lookup.is_some() {
            return Err(invalid(
                format!("sources.{}.tenant_lookup", self.source),
                "the broker's lookup is [osb] tenant_lookup ($1 = the service instance ID)",
            ));
        }
        if self
            .tenant_lookup
            .as_deref()
            .is_some_and(|s| s.trim().is_empty())
        {
            return Err(invalid("osb.tenant_lookup", "must not be empty"));
        }
        if minor_of(&self.min_api_version).is_none() {
            return Err(invalid(
                "osb.min_api_version",
                "a version \"2.MINOR\" (MINOR of 1 to 9 decimal digits), e.g. \"2.12\"",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Secrets};

    const BASE: &str = "[tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n\
        [sources.platform]\nscheme = \"basic\"\nusername = \"cf\"\nsecret_env = [\"DEPROV_TEST_UNSET_OSB\"]\n";

    #[test]
    fn versions_are_two_dot_minor() {
        assert_eq!(minor_of("2.12"), Some(12));
        assert_eq!(minor_of("2.0"), Some(0));
        assert_eq!(minor_of("2.100"), Some(100));
        for bad in [
            "2.",
            "3.12",
            "2.x",
            "2.1234567890",
            "2.+1",
            " 2.12",
            "2.12.0",
        ] {
            assert_eq!(minor_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_section_names_a_basic_source_and_defaults_to_2_12() {
        let c = Config::from_toml_with(
            &format!("{BASE}[osb]\nsource = \"platform\"\n"),
            Secrets::Skip,
        )
        .unwrap();
        let osb = c.osb.unwrap();
        assert_eq!(
            (osb.min_api_version.as_str(), osb.min_minor()),
            ("2.12", 12)
        );
        let cases = [
            ("[osb]\nsource = \"nobody\"\n", "osb.source"),
            (
                "[sources.b]\ntoken = \"0123456789abcdef0\"\n[osb]\nsource = \"b\"\n",
                "osb.source",
            ),
            (
                "[osb]\nsource = \"platform\"\ntenant_lookup = \" \"\n",
                "osb.tenant_lookup",
            ),
            (
                "[osb]\nsource = \"platform\"\nmin_api_version = \"3.0\"\n",
                "osb.min_api_version",
            ),
            ("[osb]\nsource = \"platform\"\nretry = 1\n", "retry"),
        ];
        for (extra, key) in cases {
            let err = Config::from_toml_with(&format!("{BASE}{extra}"), Secrets::Skip)
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{extra}: {err}");
        }
        let err = Config::from_toml_with(
            &format!(
                "{BASE}tenant_lookup = \"SELECT id FROM app.accounts WHERE slug = $1\"\n\
                 [osb]\nsource = \"platform\"\n"
            ),
            Secrets::Skip,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("sources.platform.tenant_lookup"), "{err}");
    }
}
