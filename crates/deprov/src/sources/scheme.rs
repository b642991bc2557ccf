//! `[sources.NAME] scheme`: how a source authenticates its requests, and which keys of its table
//! each scheme reads ([`Scheme::uses`]; a key it does not read is refused at load, with what to give
//! instead).

use serde::Deserialize;

/// How a source authenticates its requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    /// `Authorization: Bearer <token>` (`token` / `token_env`); the token names the source.
    #[default]
    Bearer,
    /// Standard Webhooks `v1` (webhook-id / webhook-timestamp / webhook-signature).
    StandardWebhooks,
    /// Stripe-Signature `t=`/`v1=`.
    Stripe,
    /// GitHub `X-Hub-Signature-256`.
    Github,
    /// Shopify `X-Shopify-Hmac-Sha256`.
    Shopify,
    /// Slack `v0` over timestamp and body.
    Slack,
    /// Vercel integration webhooks, `x-vercel-signature` (HMAC-SHA1).
    VercelWebhook,
    /// Vercel partner API: `Authorization: Bearer <OIDC JWT>` checked against a JWKS.
    VercelOidc,
    /// Any OIDC/JWT bearer sender: `Authorization: Bearer <JWT>` checked against a JWKS
    /// ([`super::jwt`]).
    Jwt,
    /// Atlassian Connect lifecycle hooks: `Authorization: JWT <RS256 token>` ([`super::atlassian`]).
    AtlassianConnect,
    /// Amazon SNS HTTP/S deliveries, RSA-signed with AWS's certificate (see [`super::sns`]).
    AwsSns,
    /// HTTP Basic (`Authorization: Basic …`): `username` and a password from `secret_env` /
    /// `secret_file` ([`super::basic`]); the Open Service Broker's platforms, add-on callers.
    Basic,
}

impl Scheme {
    /// Every scheme.
    pub const ALL: [Self; 12] = [
        Self::Bearer,
        Self::StandardWebhooks,
        Self::Stripe,
        Self::Github,
        Self::Shopify,
        Self::Slack,
        Self::VercelWebhook,
        Self::VercelOidc,
        Self::Jwt,
        Self::AtlassianConnect,
        Self::AwsSns,
        Self::Basic,
    ];

    /// The name used in the configuration file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bearer => "bearer",
            Self::StandardWebhooks => "standard-webhooks",
            Self::Stripe => "stripe",
            Self::Github => "github",
            Self::Shopify => "shopify",
            Self::Slack => "slack",
            Self::VercelWebhook => "vercel-webhook",
            Self::VercelOidc => "vercel-oidc",
            Self::Jwt => "jwt",
            Self::AtlassianConnect => "atlassian-connect",
            Self::AwsSns => "aws-sns",
            Self::Basic => "basic",
        }
    }

    /// Whether the scheme signs deliveries with an HMAC over the body.
    pub fn is_hmac(self) -> bool {
        !matches!(
            self,
            Self::Bearer | Self::VercelOidc | Self::Basic | Self::AwsSns
        ) && !self.is_token()
    }

    /// Whether the scheme checks a signed token on `POST /v1/webhooks/{source}` (asynchronously:
    /// its keys are fetched), `jwt` and `atlassian-connect`.
    pub fn is_token(self) -> bool {
        matches!(self, Self::Jwt | Self::AtlassianConnect)
    }

    /// Whether the scheme's sender puts a delivery/event ID (equal on retries) in each delivery
    /// (else `dedup` defaults to the tenant); where it is: `payload::default_delivery`.
    pub fn has_delivery_id(self) -> bool {
        !matches!(self, Self::Bearer | Self::VercelOidc | Self::Basic) && !self.is_token()
    }

    /// Whether the scheme signs a timestamp (and so has a tolerance).
    pub fn has_timestamp(self) -> bool {
        matches!(
            self,
            Self::StandardWebhooks | Self::Stripe | Self::Slack | Self::AwsSns
        )
    }

    /// Whether the scheme reads `key` of its `[sources.NAME]` table (one of [`SOURCE_KEYS`]); a key
    /// it does not read is refused at load ([`super::SourceConfig::prepare`]).
    pub fn uses(self, key: &str) -> bool {
        match key {
            "token" | "token_env" => self == Self::Bearer,
            "secret_env" | "secret_file" => self.is_hmac() || self == Self::Basic,
            "tolerance" => self.has_timestamp(),
            "timestamp" | "max_age" => self.is_hmac() && !self.has_timestamp(),
            "jwks_url" | "jwks_file" | "issuer" => matches!(self, Self::VercelOidc | Self::Jwt),
            "audience" => matches!(self, Self::VercelOidc | Self::Jwt | Self::AtlassianConnect),
            "algorithms" | "required_claims" => self == Self::Jwt,
            "leeway" | "allow_http_loopback" => self.is_token(),
            "key_url" | "base_path" => self == Self::AtlassianConnect,
            "topic_arns" | "cert_hosts" | "cert_roots_file" | "confirm_subscriptions" => {
                self == Self::AwsSns
            }
            "username" => self == Self::Basic,
            // Webhook and deletion-request keys: the partner API takes the installation from its
            // path and sends no events.
            "tenant" | "tenant_lookup" | "event" | "delete_events" | "restore_events"
            | "reinstalls" | "dedup" | "decode" => self != Self::VercelOidc,
            _ => true,
        }
    }

    /// What a `[sources.NAME]` table of this scheme takes instead of `key`, which it does not use.
    pub(super) fn instead(self, key: &str) -> &'static str {
        match key {
            "token" | "token_env" | "secret_env" | "secret_file" if self == Self::AwsSns => {
                "SNS signs each message with AWS's certificate: give topic_arns"
            }
            "topic_arns" | "cert_hosts" | "cert_roots_file" | "confirm_subscriptions" => {
                "only aws-sns reads SNS messages"
            }
            "token" | "token_env" if self.is_hmac() => {
                "its deliveries are signed: give secret_env or secret_file"
            }
            "token" | "token_env" | "secret_env" | "secret_file" if self == Self::Jwt => {
                "it checks a signed JWT against jwks_url or jwks_file"
            }
            "token" | "token_env" | "secret_env" | "secret_file"
                if self == Self::AtlassianConnect =>
            {
                "it checks Atlassian's RS256 token against the key key_url serves"
            }
            "token" | "token_env" if self == Self::Basic => {
                "it checks HTTP Basic credentials: give username and secret_env or secret_file"
            }
            "token" | "token_env" => "it checks Vercel's OIDC token against jwks_url or jwks_file",
            "secret_env" | "secret_file" if self == Self::Bearer => "give token or token_env",
            "secret_env" | "secret_file" => {
                "it checks Vercel's OIDC token against jwks_url or jwks_file"
            }
            "tolerance" => "it signs no timestamp",
            "timestamp" | "max_age" if self.has_timestamp() => {
                "it signs a timestamp of its own, bounded by tolerance"
            }
            "timestamp" | "max_age" => "it signs no body: a timestamp in it would prove nothing",
            "jwks_url" | "jwks_file" | "issuer" | "audience" => {
                "only vercel-oidc and jwt check tokens against a JWKS (atlassian-connect: audience)"
            }
            "algorithms" | "required_claims" => "only jwt reads them",
            "leeway" | "allow_http_loopback" => "only jwt and atlassian-connect check tokens",
            "key_url" | "base_path" => "only atlassian-connect reads them",
            "username" => "only basic checks a user name",
            "tenant_lookup" => "the partner API's lookup is [vercel] tenant_lookup",
            _ => {
                "it sends no webhooks: the partner API takes the installation from DELETE /v1/installations/{id}"
            }
        }
    }

    /// The HMAC key for `secret` under this scheme: base64 after `whsec_` for standard-webhooks, the
    /// secret's UTF-8 bytes for the others.
    ///
    /// # Errors
    /// A reason when the secret is empty or (standard-webhooks) not base64.
    pub fn derive_key(self, secret: &str) -> Result<Vec<u8>, String> {
        match self {
            Self::StandardWebhooks => super::standard_webhooks::derive_key(secret),
            _ if secret.is_empty() => Err("the secret is empty".into()),
            _ => Ok(secret.as_bytes().to_vec()),
        }
    }
}

/// Every key of a `[sources.NAME]` table besides `scheme`, in the order they are checked.
pub const SOURCE_KEYS: [&str; 30] = [
    "token",
    "token_env",
    "secret_env",
    "secret_file",
    "tolerance",
    "timestamp",
    "max_age",
    "tenant",
    "tenant_lookup",
    "event",
    "delete_events",
    "restore_events",
    "reinstalls",
    "dedup",
    "jwks_url",
    "jwks_file",
    "issuer",
    "audience",
    "algorithms",
    "required_claims",
    "leeway",
    "key_url",
    "base_path",
    "allow_http_loopback",
    "decode",
    "topic_arns",
    "cert_hosts",
    "cert_roots_file",
    "confirm_subscriptions",
    "username",
];
