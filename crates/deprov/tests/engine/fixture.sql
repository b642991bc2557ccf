-- A compact schema exercising every referential action the engine must reproduce.
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, name text NOT NULL, installation text UNIQUE, deleted_at timestamptz);
CREATE TABLE app.projects (id bigint PRIMARY KEY, account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, name text);
CREATE INDEX ON app.projects (account_id);
CREATE TABLE app."Environments" ("Id" bigint PRIMARY KEY, "projectId" bigint NOT NULL REFERENCES app.projects ON DELETE CASCADE, "Name" text);
CREATE INDEX ON app."Environments" ("projectId");
CREATE TABLE app.builds (id bigint PRIMARY KEY, project_id bigint NOT NULL REFERENCES app.projects ON DELETE CASCADE);
CREATE INDEX ON app.builds (project_id);
-- two parents: an environment and a build
CREATE TABLE app.deployments (id bigint PRIMARY KEY,
    env_id bigint NOT NULL REFERENCES app."Environments" ON DELETE CASCADE,
    build_id bigint REFERENCES app.builds ON DELETE CASCADE);
CREATE INDEX ON app.deployments (env_id);
CREATE INDEX ON app.deployments (build_id);
-- depth 4, composite primary key
CREATE TABLE app.events (deployment_id bigint NOT NULL REFERENCES app.deployments ON DELETE CASCADE, seq int NOT NULL,
    payload text, PRIMARY KEY (deployment_id, seq));
-- no primary key (ctid keyset), unindexed foreign key
CREATE TABLE app.log_lines (deployment_id bigint REFERENCES app.deployments ON DELETE CASCADE, line text);
-- self-reference
CREATE TABLE app.folders (id bigint PRIMARY KEY, account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    parent_id bigint REFERENCES app.folders ON DELETE CASCADE);
CREATE INDEX ON app.folders (account_id);
CREATE INDEX ON app.folders (parent_id);
-- SET NULL from other tenants' rows
CREATE TABLE app.shares (id bigint PRIMARY KEY, account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    project_id bigint REFERENCES app.projects ON DELETE SET NULL);
CREATE INDEX ON app.shares (account_id);
CREATE INDEX ON app.shares (project_id);
-- RESTRICT: a tenant with invoices cannot be cascaded away
CREATE TABLE app.invoices (id bigint PRIMARY KEY, account_id bigint NOT NULL REFERENCES app.accounts ON DELETE RESTRICT);
CREATE INDEX ON app.invoices (account_id);

INSERT INTO app.accounts SELECT a, 'acct ' || a, 'icfg_' || a FROM generate_series(1, 4) a;
-- projects: 10 per account (id = account*100 + n)
INSERT INTO app.projects SELECT a * 100 + p, a, 'p' || p FROM generate_series(1, 4) a, generate_series(1, 10) p;
INSERT INTO app."Environments" SELECT pr.id * 10 + e, pr.id, 'env' || e FROM app.projects pr, generate_series(1, 3) e;
INSERT INTO app.builds SELECT pr.id * 10 + b, pr.id FROM app.projects pr, generate_series(1, 2) b;
-- deployments: every env gets 4; build_id points at a build of the same project (two parents), some NULL
INSERT INTO app.deployments
SELECT e."Id" * 10 + d, e."Id", CASE WHEN d = 4 THEN NULL ELSE e."projectId" * 10 + 1 + (d % 2) END
FROM app."Environments" e, generate_series(1, 4) d;
-- a deployment reachable only through its build's cascade is impossible here (env is NOT NULL), but a
-- deployment of tenant 1's build in tenant 2's environment is not: the cascade deletes it via the build.
INSERT INTO app.deployments VALUES (999999, (SELECT min("Id") FROM app."Environments" WHERE "projectId" = 201), 1011);
INSERT INTO app.events SELECT d.id, s, 'e' || s FROM app.deployments d, generate_series(1, 5) s;
INSERT INTO app.log_lines SELECT d.id, 'line ' || s FROM app.deployments d, generate_series(1, 3) s;
-- folder trees: depth 6 per account
INSERT INTO app.folders SELECT a * 1000 + 1, a, NULL FROM generate_series(1, 4) a;
INSERT INTO app.folders SELECT a * 1000 + lvl, a, a * 1000 + lvl - 1 FROM generate_series(1, 4) a, generate_series(2, 6) lvl;
-- shares: every account shares one project of every other account (SET NULL on the target)
INSERT INTO app.shares SELECT a * 100 + b, a, b * 100 + 1 FROM generate_series(1, 4) a, generate_series(1, 4) b WHERE a <> b;
-- only account 2 has an invoice (RESTRICT blocker)
INSERT INTO app.invoices VALUES (1, 2);
ANALYZE;
