-- The demo's multi-tenant SaaS schema (a small Vercel-like hosting product), loaded by deprov::demo::data.
--
-- Tenant root: app.accounts. Everything below it is removed by ON DELETE CASCADE, so a cascading
-- `DELETE FROM app.accounts WHERE id = $1` is the reference result deprov's batched delete must equal.
-- Features the demo exercises on purpose:
--   * cascade chains 5 deep: accounts → projects → environments → deployments → check_runs → check_run_annotations
--   * a self-reference: app.folders.parent_id (trees ≥ 5 levels deep)
--   * a table with two parents inside the tenant: app.deployment_artifacts (deployments and builds)
--   * ON DELETE SET NULL from OTHER tenants' rows: app.shared_links.target_project_id
--   * ON DELETE SET NULL inside the tenant: app.audit_events.actor_user_id
--   * a quoted mixed-case table with mixed-case columns: app."BillingInvoices"
--   * composite keys: project_members, environment_variables (+ a composite FK from its versions), log_lines,
--     invoice_line_items
--   * a global table the tenant only points at: app.plans (never touched by a tenant delete)
--   * every FK column indexed except ONE on purpose: app.project_members.user_id
-- No RESTRICT / NO ACTION reference points at any tenant table.

CREATE SCHEMA app;

CREATE TABLE app.plans (
    id          text PRIMARY KEY,
    name        text NOT NULL,
    limits      jsonb NOT NULL DEFAULT '{}'::jsonb
);

CREATE TABLE app.accounts (
    id                     bigint PRIMARY KEY,
    slug                   text NOT NULL UNIQUE,
    name                   text NOT NULL,
    vercel_installation_id text UNIQUE,
    plan_id                text NOT NULL REFERENCES app.plans (id),
    settings               jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at             timestamptz NOT NULL DEFAULT now(),
    deleted_at             timestamptz
);
CREATE INDEX ON app.accounts (plan_id);

CREATE TABLE app.users (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id  bigint NOT NULL REFERENCES app.accounts (id) ON DELETE CASCADE,
    external_id uuid NOT NULL UNIQUE,
    email       text NOT NULL,
    role        text NOT NULL CHECK (role IN ('owner', 'admin', 'member')),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON app.users (account_id);

CREATE TABLE app.api_keys (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id  bigint NOT NULL REFERENCES app.accounts (id) ON DELETE CASCADE,
    key_hash    text NOT NULL UNIQUE,
    scopes      text[] NOT NULL,
    last_used_at timestamptz
);
CREATE INDEX ON app.api_keys (account_id);

CREATE TABLE app.projects (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id  bigint NOT NULL REFERENCES app.accounts (id) ON DELETE CASCADE,
    public_id   uuid NOT NULL UNIQUE,
    name        text NOT NULL,
    framework   text,
    settings    jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (account_id, name)
);

-- Composite primary key; user_id is the one foreign-key column deliberately left without an index
-- (the primary key's index leads with project_id), so `deprov plan` has something to warn about.
CREATE TABLE app.project_members (
    project_id  bigint NOT NULL REFERENCES app.projects (id) ON DELETE CASCADE,
    user_id     bigint NOT NULL REFERENCES app.users (id) ON DELETE CASCADE,
    permission  text NOT NULL DEFAULT 'write',
    PRIMARY KEY (project_id, user_id)
);

CREATE TABLE app.environments (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id  bigint NOT NULL REFERENCES app.projects (id) ON DELETE CASCADE,
    name        text NOT NULL,
    UNIQUE (project_id, name)
);

CREATE TABLE app.environment_variables (
    environment_id bigint NOT NULL REFERENCES app.environments (id) ON DELETE CASCADE,
    key            text NOT NULL,
    value_encrypted bytea NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (environment_id, key)
);

-- A composite foreign key.
CREATE TABLE app.environment_variable_versions (
    environment_id  bigint NOT NULL,
    key             text NOT NULL,
    version         integer NOT NULL,
    value_encrypted bytea NOT NULL,
    created_at      timestamptz NOT NULL,
    PRIMARY KEY (environment_id, key, version),
    FOREIGN KEY (environment_id, key) REFERENCES app.environment_variables (environment_id, key) ON DELETE CASCADE
);

CREATE TABLE app.builds (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id  bigint NOT NULL REFERENCES app.projects (id) ON DELETE CASCADE,
    commit_sha  text NOT NULL,
    status      text NOT NULL,
    started_at  timestamptz NOT NULL,
    duration_ms integer
);
CREATE INDEX ON app.builds (project_id);

CREATE TABLE app.deployments (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    environment_id bigint NOT NULL REFERENCES app.environments (id) ON DELETE CASCADE,
    url            text NOT NULL,
    state          text NOT NULL,
    meta           jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at     timestamptz NOT NULL
);
CREATE INDEX ON app.deployments (environment_id);

CREATE TABLE app.deployment_events (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    deployment_id bigint NOT NULL REFERENCES app.deployments (id) ON DELETE CASCADE,
    kind          text NOT NULL,
    payload       jsonb NOT NULL,
    created_at    timestamptz NOT NULL
);
CREATE INDEX ON app.deployment_events (deployment_id);

CREATE TABLE app.log_lines (
    deployment_id bigint NOT NULL REFERENCES app.deployments (id) ON DELETE CASCADE,
    line_no       integer NOT NULL,
    stream        text NOT NULL,
    message       text NOT NULL,
    logged_at     timestamptz NOT NULL,
    PRIMARY KEY (deployment_id, line_no)
);

CREATE TABLE app.check_runs (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    deployment_id bigint NOT NULL REFERENCES app.deployments (id) ON DELETE CASCADE,
    name          text NOT NULL,
    conclusion    text NOT NULL,
    started_at    timestamptz NOT NULL
);
CREATE INDEX ON app.check_runs (deployment_id);

-- Five levels below accounts.
CREATE TABLE app.check_run_annotations (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    check_run_id  bigint NOT NULL REFERENCES app.check_runs (id) ON DELETE CASCADE,
    path          text NOT NULL,
    line          integer NOT NULL,
    level         text NOT NULL,
    message       text NOT NULL
);
CREATE INDEX ON app.check_run_annotations (check_run_id);

-- Two parents inside the tenant: the deployment that serves an artifact and the build that made it.
CREATE TABLE app.deployment_artifacts (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    deployment_id bigint NOT NULL REFERENCES app.deployments (id) ON DELETE CASCADE,
    build_id      bigint NOT NULL REFERENCES app.builds (id) ON DELETE CASCADE,
    path          text NOT NULL,
    size_bytes    bigint NOT NULL,
    sha256        text NOT NULL
);
CREATE INDEX ON app.deployment_artifacts (deployment_id);
CREATE INDEX ON app.deployment_artifacts (build_id);

CREATE TABLE app.webhooks (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id  bigint NOT NULL REFERENCES app.projects (id) ON DELETE CASCADE,
    url         text NOT NULL,
    events      text[] NOT NULL,
    secret_hash text NOT NULL
);
CREATE INDEX ON app.webhooks (project_id);

CREATE TABLE app.webhook_deliveries (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    webhook_id   bigint NOT NULL REFERENCES app.webhooks (id) ON DELETE CASCADE,
    delivery_id  uuid NOT NULL,
    status_code  integer,
    response     jsonb,
    delivered_at timestamptz NOT NULL
);
CREATE INDEX ON app.webhook_deliveries (webhook_id);

-- Self-reference: folders form trees; deleting a folder deletes its subtree.
CREATE TABLE app.folders (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id  bigint NOT NULL REFERENCES app.accounts (id) ON DELETE CASCADE,
    parent_id   bigint REFERENCES app.folders (id) ON DELETE CASCADE,
    seq         integer NOT NULL, -- creation order within the account
    name        text NOT NULL,
    UNIQUE (account_id, seq)
);
CREATE INDEX ON app.folders (parent_id);

CREATE TABLE app.documents (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    folder_id   bigint NOT NULL REFERENCES app.folders (id) ON DELETE CASCADE,
    public_id   uuid NOT NULL,
    title       text NOT NULL,
    body        text NOT NULL,
    updated_at  timestamptz NOT NULL
);
CREATE INDEX ON app.documents (folder_id);

-- Owned by one account; may point at ANOTHER account's project, which is unlinked (SET NULL) when
-- that other account is deleted.
CREATE TABLE app.shared_links (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id        bigint NOT NULL REFERENCES app.accounts (id) ON DELETE CASCADE,
    target_project_id bigint REFERENCES app.projects (id) ON DELETE SET NULL,
    token             uuid NOT NULL UNIQUE,
    created_at        timestamptz NOT NULL
);
CREATE INDEX ON app.shared_links (account_id);
CREATE INDEX ON app.shared_links (target_project_id);

CREATE TABLE app.audit_events (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id    bigint NOT NULL REFERENCES app.accounts (id) ON DELETE CASCADE,
    actor_user_id bigint REFERENCES app.users (id) ON DELETE SET NULL,
    action        text NOT NULL,
    details       jsonb NOT NULL,
    occurred_at   timestamptz NOT NULL
);
CREATE INDEX ON app.audit_events (account_id);
CREATE INDEX ON app.audit_events (actor_user_id);

-- Quoted mixed-case names, as an ORM with case-preserving naming would create them.
CREATE TABLE app."BillingInvoices" (
    "Id"            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    "AccountId"     bigint NOT NULL REFERENCES app.accounts (id) ON DELETE CASCADE,
    "InvoiceNumber" text NOT NULL UNIQUE,
    "AmountCents"   bigint NOT NULL,
    "Currency"      text NOT NULL DEFAULT 'USD',
    "IssuedAt"      timestamptz NOT NULL,
    "PaidAt"        timestamptz
);
CREATE INDEX ON app."BillingInvoices" ("AccountId");

CREATE TABLE app.invoice_line_items (
    invoice_id   bigint NOT NULL REFERENCES app."BillingInvoices" ("Id") ON DELETE CASCADE,
    line_no      integer NOT NULL,
    description  text NOT NULL,
    amount_cents bigint NOT NULL,
    PRIMARY KEY (invoice_id, line_no)
);

INSERT INTO app.plans (id, name, limits) VALUES
    ('hobby', 'Hobby', '{"projects": 3, "seats": 1}'),
    ('pro', 'Pro', '{"projects": 100, "seats": 20}'),
    ('enterprise', 'Enterprise', '{"projects": null, "seats": null}');
