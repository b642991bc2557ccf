-- Operator tokens with roles, for operator access and its audit.
--
-- A token is 32 random bytes (256 bits) written as `dpv_` + base64url; only its SHA-256 is stored.
-- A slow, salted password hash buys nothing for a token of that entropy: nobody can enumerate 2^256
-- candidates, and a salt only defends guessable secrets. The token is shown once, at creation.
-- `name` is the audit actor of everything done with the token. Names are unique among tokens not
-- revoked, so `deprov tokens revoke NAME` means one token and a name can be reused after a revoke.
-- Rows are never deleted: a revoked token keeps its name, creator and times for the audit trail.
CREATE TABLE deprov.operator_tokens (
    id           uuid PRIMARY KEY,
    name         text NOT NULL CHECK (name ~ '^[A-Za-z0-9._@-]{1,100}$'),
    role         text NOT NULL CHECK (role IN ('read-only', 'operator')),
    token_sha256 bytea NOT NULL UNIQUE CHECK (length(token_sha256) = 32),
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text NOT NULL,
    revoked_at   timestamptz,
    revoked_by   text,
    -- Updated at most once per [operator_tokens] cache_ttl per process (see http::auth).
    last_used_at timestamptz,
    CHECK ((revoked_at IS NULL) = (revoked_by IS NULL))
);
CREATE UNIQUE INDEX operator_tokens_active_name ON deprov.operator_tokens (name)
    WHERE revoked_at IS NULL;
