-- Sessions of the operator console (`/ui`). Someone logs in with an operator token; the browser
-- then holds a random 256-bit session secret in an HttpOnly cookie, and only its SHA-256 is kept
-- here (as with operator tokens, a slow salted hash buys nothing for a secret of that entropy).
-- A row stored server-side, rather than a signed cookie, lets logout and expiry end a session at
-- once and needs no signing key shared by every API process.
--
-- `operator_token_sha256` is the digest of the operator token that logged in (the same digest
-- `deprov.operator_tokens` keeps, or that of DEPROV_OPERATOR_TOKEN): every request re-checks it
-- like a bearer token, so revoking the token ends its sessions within `[operator_tokens] cache_ttl`
-- and the role is always the token's current one. Expired rows are deleted at the next login.
CREATE TABLE deprov.console_sessions (
    session_sha256        bytea PRIMARY KEY CHECK (length(session_sha256) = 32),
    operator_token_sha256 bytea NOT NULL CHECK (length(operator_token_sha256) = 32),
    actor                 text NOT NULL,
    created_at            timestamptz NOT NULL DEFAULT now(),
    expires_at            timestamptz NOT NULL
);
CREATE INDEX console_sessions_expiry ON deprov.console_sessions (expires_at);
