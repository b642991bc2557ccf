-- Set-based generators for the demo data, run by deprov::demo::data::load once per group of accounts.
--
-- Each statement starts with a header line:
--   "-- @insert TABLE"  rows it inserts belong to the group's accounts (counted per table);
--   "-- @exec"          a fix-up that inserts nothing (not counted);
--   "-- @cross TABLE"   run after every group's own data exists; rows belong to the group's accounts.
-- Parameters: $1 bigint[] = the group's account ids; $2 jsonb = the group's shape (numbers per parent,
-- see data.rs `Shape`); $3 bigint[] = the accounts the group's cross-tenant links point at.
-- Values are deterministic (md5 of ids, fixed base timestamps), so two loads give equal digests.

-- @insert app.accounts
INSERT INTO app.accounts (id, slug, name, vercel_installation_id, plan_id, settings, created_at)
SELECT a, 'acct-' || a, 'Account ' || a, 'icfg_' || substr(md5('deprov-demo-' || a), 1, 24),
       (ARRAY['hobby', 'pro', 'enterprise'])[1 + a % 3],
       jsonb_build_object('region', (ARRAY['iad1', 'fra1', 'sfo1'])[1 + a % 3], 'mfa', a % 2 = 0),
       timestamptz '2022-01-01 00:00+00' + a * interval '1 day'
FROM unnest($1::bigint[]) a;

-- @insert app.users
INSERT INTO app.users (account_id, external_id, email, role, created_at)
SELECT a, md5('user-' || a || '-' || g)::uuid, 'user' || g || '@acct-' || a || '.example',
       CASE WHEN g = 1 THEN 'owner' WHEN g % 10 = 0 THEN 'admin' ELSE 'member' END,
       timestamptz '2023-01-01 00:00+00' + g * interval '1 hour'
FROM unnest($1::bigint[]) a, generate_series(1, ($2->>'users')::int) g;

-- @insert app.api_keys
INSERT INTO app.api_keys (account_id, key_hash, scopes, last_used_at)
SELECT a, md5('api-key-' || a || '-' || g), ARRAY['deployments:read', 'projects:write'],
       CASE WHEN g % 2 = 0 THEN timestamptz '2024-06-01 00:00+00' + g * interval '1 minute' END
FROM unnest($1::bigint[]) a, generate_series(1, ($2->>'api_keys')::int) g;

-- @insert app.projects
INSERT INTO app.projects (account_id, public_id, name, framework, settings, created_at)
SELECT a, md5('project-' || a || '-' || g)::uuid, 'project-' || g,
       (ARRAY['nextjs', 'astro', 'sveltekit', NULL])[1 + g % 4],
       jsonb_build_object('buildCommand', 'npm run build', 'nodeVersion', '20.x', 'rootDirectory', NULL),
       timestamptz '2023-02-01 00:00+00' + g * interval '1 day'
FROM unnest($1::bigint[]) a, generate_series(1, ($2->>'projects')::int) g;

-- @insert app.project_members
INSERT INTO app.project_members (project_id, user_id, permission)
SELECT p.id, u.id, CASE WHEN u.r % 3 = 0 THEN 'read' ELSE 'write' END
FROM (SELECT id, account_id, row_number() OVER (PARTITION BY account_id ORDER BY id) AS r
      FROM app.projects WHERE account_id = ANY($1)) p
JOIN (SELECT id, account_id, row_number() OVER (PARTITION BY account_id ORDER BY id) AS r
      FROM app.users WHERE account_id = ANY($1)) u
  ON u.account_id = p.account_id AND u.r % ($2->>'members_stride')::int = p.r % ($2->>'members_stride')::int;

-- @insert app.environments
INSERT INTO app.environments (project_id, name)
SELECT p.id, e FROM app.projects p, unnest(ARRAY['production', 'preview', 'development']) e
WHERE p.account_id = ANY($1);

-- @insert app.environment_variables
INSERT INTO app.environment_variables (environment_id, key, value_encrypted, updated_at)
SELECT e.id, 'VAR_' || g, decode(md5('env-' || e.id || '-' || g), 'hex'),
       timestamptz '2024-01-01 00:00+00' + g * interval '1 hour'
FROM app.environments e JOIN app.projects p ON p.id = e.project_id,
     generate_series(1, ($2->>'env_vars')::int) g
WHERE p.account_id = ANY($1);

-- @insert app.environment_variable_versions
INSERT INTO app.environment_variable_versions (environment_id, key, version, value_encrypted, created_at)
SELECT v.environment_id, v.key, g, decode(md5('ver-' || v.environment_id || v.key || g), 'hex'),
       v.updated_at - (($2->>'env_var_versions')::int - g) * interval '1 day'
FROM app.environment_variables v JOIN app.environments e ON e.id = v.environment_id JOIN app.projects p ON p.id = e.project_id,
     generate_series(1, ($2->>'env_var_versions')::int) g
WHERE p.account_id = ANY($1);

-- @insert app.builds
INSERT INTO app.builds (project_id, commit_sha, status, started_at, duration_ms)
SELECT p.id, md5('build-' || p.id || '-' || g) || substr(md5(g::text), 1, 8),
       CASE WHEN g % 17 = 0 THEN 'error' ELSE 'ready' END,
       timestamptz '2024-01-01 00:00+00' + g * interval '7 minutes', 20000 + (g * 7919) % 90000
FROM app.projects p, generate_series(1, ($2->>'builds_per_project')::int) g
WHERE p.account_id = ANY($1);

-- @insert app.deployments
INSERT INTO app.deployments (environment_id, url, state, meta, created_at)
SELECT e.id, 'https://' || p.name || '-' || substr(md5(e.id || '-' || g), 1, 9) || '-acct' || p.account_id || '.vercel.app',
       CASE WHEN g % 23 = 0 THEN 'ERROR' ELSE 'READY' END,
       jsonb_build_object('branch', CASE e.name WHEN 'production' THEN 'main' ELSE 'feature-' || g % 7 END,
                          'commitRef', substr(md5('c' || e.id || g), 1, 7)),
       timestamptz '2024-01-01 00:00+00' + g * interval '13 minutes'
FROM app.environments e JOIN app.projects p ON p.id = e.project_id,
     generate_series(1, ($2->>'deployments_per_env')::int) g
WHERE p.account_id = ANY($1);

-- @insert app.deployment_events
INSERT INTO app.deployment_events (deployment_id, kind, payload, created_at)
SELECT d.id, (ARRAY['queued', 'building', 'uploading', 'deploying', 'ready'])[1 + (g - 1) % 5],
       jsonb_build_object('step', g, 'durationMs', (d.id * 31 + g * 97) % 5000),
       d.created_at + g * interval '9 seconds'
FROM app.deployments d JOIN app.environments e ON e.id = d.environment_id JOIN app.projects p ON p.id = e.project_id,
     generate_series(1, ($2->>'events_per_deployment')::int) g
WHERE p.account_id = ANY($1);

-- @insert app.log_lines
INSERT INTO app.log_lines (deployment_id, line_no, stream, message, logged_at)
SELECT d.id, g, CASE WHEN g % 11 = 0 THEN 'stderr' ELSE 'stdout' END,
       '[' || (ARRAY['install', 'build', 'lint', 'bundle', 'upload'])[1 + g % 5] || '] step ' || g || ' ok in '
           || (g * 37) % 900 || 'ms (' || substr(md5(d.id || ':' || g), 1, 12) || ')',
       d.created_at + g * interval '10 milliseconds'
FROM app.deployments d JOIN app.environments e ON e.id = d.environment_id JOIN app.projects p ON p.id = e.project_id,
     generate_series(1, ($2->>'log_lines_per_deployment')::int) g
WHERE p.account_id = ANY($1);

-- @insert app.check_runs
INSERT INTO app.check_runs (deployment_id, name, conclusion, started_at)
SELECT d.id, (ARRAY['lint', 'test', 'lighthouse'])[1 + (g - 1) % 3], CASE WHEN (d.id + g) % 9 = 0 THEN 'failure' ELSE 'success' END,
       d.created_at + g * interval '2 minutes'
FROM app.deployments d JOIN app.environments e ON e.id = d.environment_id JOIN app.projects p ON p.id = e.project_id,
     generate_series(1, ($2->>'checks_per_deployment')::int) g
WHERE p.account_id = ANY($1);

-- @insert app.check_run_annotations
INSERT INTO app.check_run_annotations (check_run_id, path, line, level, message)
SELECT c.id, 'src/app/page-' || g || '.tsx', 1 + (c.id * 7 + g * 13) % 400, CASE WHEN g % 2 = 0 THEN 'warning' ELSE 'notice' END,
       'rule ' || (ARRAY['no-unused-vars', 'react-hooks/exhaustive-deps', 'a11y/alt-text'])[1 + g % 3]
FROM app.check_runs c JOIN app.deployments d ON d.id = c.deployment_id JOIN app.environments e ON e.id = d.environment_id
     JOIN app.projects p ON p.id = e.project_id,
     generate_series(1, ($2->>'annotations_per_check')::int) g
WHERE p.account_id = ANY($1);

-- @insert app.deployment_artifacts
INSERT INTO app.deployment_artifacts (deployment_id, build_id, path, size_bytes, sha256)
SELECT d.id, b.id, '/_next/static/chunks/' || g || '-' || substr(md5(d.id || '-' || g), 1, 16) || '.js',
       1024 + (d.id * 131 + g * 977) % 500000, md5('a' || d.id || '-' || g) || md5('b' || d.id || '-' || g)
FROM (SELECT d.id, e.project_id, row_number() OVER (PARTITION BY e.project_id ORDER BY d.id) AS r
      FROM app.deployments d JOIN app.environments e ON e.id = d.environment_id JOIN app.projects p ON p.id = e.project_id
      WHERE p.account_id = ANY($1)) d
JOIN (SELECT b.id, b.project_id, row_number() OVER (PARTITION BY b.project_id ORDER BY b.id) AS r
      FROM app.builds b JOIN app.projects p ON p.id = b.project_id WHERE p.account_id = ANY($1)) b
  ON b.project_id = d.project_id AND b.r = 1 + d.r % ($2->>'builds_per_project')::int,
     generate_series(1, ($2->>'artifacts_per_deployment')::int) g;

-- @insert app.webhooks
INSERT INTO app.webhooks (project_id, url, events, secret_hash)
SELECT p.id, 'https://hooks.acct-' || p.account_id || '.example/' || g, ARRAY['deployment.succeeded', 'deployment.error'],
       md5('whsec-' || p.id || '-' || g)
FROM app.projects p, generate_series(1, ($2->>'webhooks_per_project')::int) g
WHERE p.account_id = ANY($1);

-- @insert app.webhook_deliveries
INSERT INTO app.webhook_deliveries (webhook_id, delivery_id, status_code, response, delivered_at)
SELECT w.id, md5('delivery-' || w.id || '-' || g)::uuid, CASE WHEN g % 19 = 0 THEN 500 ELSE 200 END,
       CASE WHEN g % 19 = 0 THEN jsonb_build_object('error', 'upstream timeout') END,
       timestamptz '2024-03-01 00:00+00' + g * interval '1 minute'
FROM app.webhooks w JOIN app.projects p ON p.id = w.project_id,
     generate_series(1, ($2->>'deliveries_per_webhook')::int) g
WHERE p.account_id = ANY($1);

-- @insert app.folders
INSERT INTO app.folders (account_id, parent_id, seq, name)
SELECT a, NULL, g, 'folder ' || g FROM unnest($1::bigint[]) a, generate_series(1, ($2->>'folders')::int) g;

-- @exec
-- Folders form a binary tree per account (folder n's parent is folder n/2): depth floor(log2 n) + 1.
UPDATE app.folders c SET parent_id = p.id
FROM app.folders p
WHERE c.account_id = ANY($1) AND c.seq > 1 AND p.account_id = c.account_id AND p.seq = c.seq / 2;

-- @insert app.documents
INSERT INTO app.documents (folder_id, public_id, title, body, updated_at)
SELECT f.id, md5('doc-' || f.id || '-' || g)::uuid, 'Document ' || f.seq || '.' || g,
       repeat('Lorem ipsum dolor sit amet. ', 1 + g % 4), timestamptz '2024-02-01 00:00+00' + g * interval '1 day'
FROM app.folders f, generate_series(1, ($2->>'documents_per_folder')::int) g
WHERE f.account_id = ANY($1);

-- @insert app.shared_links
INSERT INTO app.shared_links (account_id, target_project_id, token, created_at)
SELECT p.account_id, p.id, md5('link-' || p.id || '-' || g)::uuid, timestamptz '2024-04-01 00:00+00' + g * interval '1 hour'
FROM app.projects p, generate_series(1, ($2->>'links_per_project')::int) g
WHERE p.account_id = ANY($1);

-- @insert app.audit_events
INSERT INTO app.audit_events (account_id, actor_user_id, action, details, occurred_at)
SELECT a, u.id, (ARRAY['project.created', 'deployment.promoted', 'member.invited', 'env.updated'])[1 + g % 4],
       jsonb_build_object('ip', '10.0.' || g % 256 || '.' || a % 256, 'seq', g),
       timestamptz '2024-01-01 00:00+00' + g * interval '30 seconds'
FROM unnest($1::bigint[]) a CROSS JOIN generate_series(1, ($2->>'audit_events')::int) g
LEFT JOIN (SELECT id, account_id, row_number() OVER (PARTITION BY account_id ORDER BY id) AS r
           FROM app.users WHERE account_id = ANY($1)) u
  ON u.account_id = a AND u.r = 1 + g % ($2->>'users')::int AND g % 13 <> 0;

-- @insert app."BillingInvoices"
INSERT INTO app."BillingInvoices" ("AccountId", "InvoiceNumber", "AmountCents", "IssuedAt", "PaidAt")
SELECT a, 'INV-' || a || '-' || lpad(g::text, 4, '0'), 2000 + (a * 7 + g * 113) % 50000,
       timestamptz '2022-01-01 00:00+00' + g * interval '1 month',
       CASE WHEN g < ($2->>'invoices')::int THEN timestamptz '2022-01-05 00:00+00' + g * interval '1 month' END
FROM unnest($1::bigint[]) a, generate_series(1, ($2->>'invoices')::int) g;

-- @insert app.invoice_line_items
INSERT INTO app.invoice_line_items (invoice_id, line_no, description, amount_cents)
SELECT i."Id", g, (ARRAY['Seats', 'Bandwidth', 'Build minutes', 'Edge requests'])[1 + (g - 1) % 4], (i."AmountCents" / 4) + g
FROM app."BillingInvoices" i, generate_series(1, ($2->>'lines_per_invoice')::int) g
WHERE i."AccountId" = ANY($1);

-- @cross app.shared_links
-- Each account of the group shares links to projects of the accounts in $3 (another tenant's projects).
INSERT INTO app.shared_links (account_id, target_project_id, token, created_at)
SELECT a, p.id, md5('xlink-' || a || '-' || p.id)::uuid, timestamptz '2024-05-01 00:00+00'
FROM unnest($1::bigint[]) a
CROSS JOIN LATERAL (SELECT id FROM app.projects WHERE account_id = ANY($3) AND account_id <> a
                    ORDER BY md5(a || '-' || id) LIMIT ($2->>'cross_links')::int) p;

-- @cross app.shared_links
-- ... and one link to a project of another account of its own group.
INSERT INTO app.shared_links (account_id, target_project_id, token, created_at)
SELECT a, p.id, md5('glink-' || a || '-' || p.id)::uuid, timestamptz '2024-05-02 00:00+00'
FROM unnest($1::bigint[]) a
CROSS JOIN LATERAL (SELECT id FROM app.projects WHERE account_id = ANY($1) AND account_id <> a
                    ORDER BY md5(a || '-' || id) LIMIT 1) p;
