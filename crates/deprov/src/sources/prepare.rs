//! [`SourceConfig::prepare`]: a `[sources.NAME]` table checked as a whole — the keys its scheme
//! reads ([`super::settings`]), then each scheme's own rules ([`super::jwt`],
//! [`super::atlassian`], [`super::sns_config`], `basic`'s and the HMAC schemes' secrets) — so the
//! table's module needs none of the schemes' modules.

use super::settings::{Dedup, InvalidSource, Scheme, Secrets, SourceConfig, invalid};

impl SourceConfig {
    /// Checks source `name`'s table — `given` is the keys written in it: each must be one its
    /// scheme uses, and those the scheme needs must be there — and, with [`Secrets::Read`], reads
    /// its secrets and derives their keys.
    ///
    /// # Errors
    /// [`InvalidSource`] naming `sources.NAME.<key>` (never the secret's value).
    pub fn prepare<'k>(
        &mut self,
        name: &str,
        given: impl IntoIterator<Item = &'k str>,
        secrets: Secrets,
    ) -> Result<(), InvalidSource> {
        let given: Vec<&str> = given.into_iter().collect();
        self.check_keys(name, &given)?;
        self.check_events(name)?;
        if self.scheme.is_hmac() {
            self.prepare_hmac(name, secrets)?;
        }
        if self.scheme == Scheme::VercelOidc {
            self.check_oidc(name)?;
        }
        if self.scheme == Scheme::Jwt {
            super::jwt::check(name, self)?;
        }
        if secrets == Secrets::Read
            && let Some(path) = &self.jwks_file
        {
            super::oidc::check_jwks_file(path)
                .map_err(|r| invalid(name, "jwks_file", format!("{path}: {r}")))?;
        }
        if self.scheme == Scheme::AtlassianConnect {
            super::atlassian::prepare(name, self)?;
        }
        super::decode::check(&self.decode).map_err(|r| invalid(name, "decode", r))?;
        if self.scheme == Scheme::AwsSns {
            self.sns = Some(
                super::sns_config::prepare(self)
                    .map_err(|(key, reason)| invalid(name, key, reason))?,
            );
        }
        if self.scheme == Scheme::Basic {
            self.prepare_basic(name, secrets)?;
        }
        self.check_values(name)?;
        if self.dedup == Dedup::Delivery && !self.scheme.has_delivery_id() {
            self.dedup = Dedup::Tenant;
        }
        Ok(())
    }
}
