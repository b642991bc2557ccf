//! Loads the demo schema ([`SCHEMA_SQL`]) and its data: one large tenant and many small ones.
//!
//! All rows are made by set-based `INSERT … SELECT … generate_series(…)` statements kept in
//! `data.sql`, each run once for the large tenant and once for all small tenants together, so the load
//! time depends on the row count, not the statement count. Every value is deterministic.

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::PgPool;

use deprov::sql::QualifiedName;

/// The demo schema (`CREATE SCHEMA app` and 24 tables); see the comments in the file.
pub const SCHEMA_SQL: &str = include_str!("schema.sql");
const DATA_SQL: &str = include_str!("data.sql");

/// Rows each small tenant gets (approximately).
pub const SMALL_TENANT_ROWS: u64 = 2_000;
/// Account ids are `ACCOUNT_ID_BASE + 1 ..= ACCOUNT_ID_BASE + small_tenants + 1`.
pub const ACCOUNT_ID_BASE: i64 = 1_000;

/// How much data [`load`] makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoSize {
    /// Number of small tenants (about [`SMALL_TENANT_ROWS`] rows each).
    pub small_tenants: u32,
    /// Target row count of the large tenant, summed over all its tables; the load makes at least this
    /// many (a little more, as counts are whole multiples per parent row).
    pub large_tenant_rows: u64,
}

impl Default for DemoSize {
    /// The demo's size: 60 small tenants and a large tenant of 1,000,000 rows.
    fn default() -> Self {
        Self {
            small_tenants: 60,
            large_tenant_rows: 1_000_000,
        }
    }
}

impl DemoSize {
    /// A size for tests: 5 small tenants and a 5,000-row large tenant (loads in about a second).
    pub fn test() -> Self {
        Self {
            small_tenants: 5,
            large_tenant_rows: 5_000,
        }
    }
}

/// What [`load`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoTenants {
    /// `app.accounts.id` of the large tenant (placed in the middle of the id range).
    pub large: i64,
    /// `app.accounts.id` of every small tenant, ascending.
    pub small: Vec<i64>,
    /// The large tenant's `vercel_installation_id` (`icfg_` + 24 hex digits).
    pub large_vercel_installation_id: String,
    /// Rows of the large tenant per table (every table reachable from `app.accounts`, including its
    /// own `app.accounts` row and the shared links it owns that point at other tenants' projects).
    pub large_rows: BTreeMap<QualifiedName, u64>,
}

impl DemoTenants {
    /// The large tenant's total row count over all tables.
    pub fn large_total_rows(&self) -> u64 {
        self.large_rows.values().sum()
    }
}

/// Numbers per parent row, bound as `$2` (jsonb) to every statement in `data.sql`.
#[derive(Debug, Clone, Serialize)]
struct Shape {
    users: u64,
    api_keys: u64,
    projects: u64,
    members_stride: u64,
    env_vars: u64,
    builds_per_project: u64,
    deployments_per_env: u64,
    events_per_deployment: u64,
    log_lines_per_deployment: u64,
    checks_per_deployment: u64,
    annotations_per_check: u64,
    env_var_versions: u64,
    artifacts_per_deployment: u64,
    webhooks_per_project: u64,
    deliveries_per_webhook: u64,
    folders: u64,
    documents_per_folder: u64,
    links_per_project: u64,
    audit_events: u64,
    invoices: u64,
    lines_per_invoice: u64,
    cross_links: u64,
}

const ENVIRONMENTS_PER_PROJECT: u64 = 3;

impl Shape {
    /// A tenant of at least `rows` rows; log lines (the bulk, as in real systems) fill what the fixed
    /// proportions leave.
    fn for_rows(rows: u64) -> Self {
        let projects = (rows / 25_000).max(2);
        let mut s = Shape {
            users: (rows / 2_000).max(5),
            api_keys: (rows / 100_000).max(2),
            projects,
            members_stride: 10,
            env_vars: 8,
            builds_per_project: (rows / (200 * projects)).max(3),
            deployments_per_env: (rows / (250 * ENVIRONMENTS_PER_PROJECT * projects)).max(2),
            events_per_deployment: 5,
            log_lines_per_deployment: 0,
            checks_per_deployment: 2,
            annotations_per_check: 3,
            env_var_versions: 3,
            artifacts_per_deployment: 3,
            webhooks_per_project: 2,
            deliveries_per_webhook: (rows / (20 * projects)).max(2),
            folders: (rows / 500).max(40),
            documents_per_folder: 10,
            links_per_project: 2,
            audit_events: (rows / 6).max(10),
            invoices: 24,
            lines_per_invoice: 4,
            cross_links: 3,
        };
        let deployments = projects * ENVIRONMENTS_PER_PROJECT * s.deployments_per_env;
        let members = projects * s.users.div_ceil(s.members_stride);
        let envs = projects * ENVIRONMENTS_PER_PROJECT;
        let fixed = 1
            + s.users
            + s.api_keys
            + projects
            + members
            + envs * (1 + s.env_vars * (1 + s.env_var_versions))
            + projects * s.builds_per_project
            + deployments
                * (1 + s.events_per_deployment
                    + s.artifacts_per_deployment
                    + s.checks_per_deployment * (1 + s.annotations_per_check))
            + projects * s.webhooks_per_project * (1 + s.deliveries_per_webhook)
            + s.folders * (1 + s.documents_per_folder)
            + projects * s.links_per_project
            + s.audit_events
            + s.invoices * (1 + s.lines_per_invoice);
        s.log_lines_per_deployment = rows.saturating_sub(fixed).div_ceil(deployments).max(10);
        s
    }
}

/// One statement of `data.sql`.
struct Step {
    /// `Some(table)` for `@insert`/`@cross`, `None` for `@exec`.
    table: Option<QualifiedName>,
    cross: bool,
    text: &'static str,
}

fn steps() -> Vec<Step> {
    DATA_SQL
        .split("\n-- @")
        .skip(1)
        .map(|chunk| {
            let (header, text) = chunk.split_once('\n').expect("data.sql: header line");
            let (kind, table) = header.split_once(' ').unwrap_or((header, ""));
            let table = (!table.is_empty())
                .then(|| QualifiedName::parse(table).expect("data.sql: table name"));
            match kind {
                "insert" | "cross" | "exec" => Step {
                    table,
                    cross: kind == "cross",
                    text,
                },
                other => panic!("data.sql: unknown header @{other}"),
            }
        })
        .collect()
}

/// Creates schema `app` ([`SCHEMA_SQL`]) in the pool's database and fills it, then runs `ANALYZE`.
///
/// Accounts get ids `ACCOUNT_ID_BASE + 1 ..`; the large tenant's id is in the middle, so it is neither
/// the first nor the last key. Small tenants link to the large tenant's projects (SET NULL
/// references from other tenants) and to each other's; the large tenant links to small tenants'.
///
/// As a superuser the rows are inserted with `session_replication_role = replica` (no per-row
/// foreign-key triggers, about twice as fast) and every foreign key is checked afterwards with
/// [`orphaned_rows`](super::ownership::orphaned_rows); otherwise the triggers check each row.
///
/// # Errors
/// Any database error (for instance schema `app` already exists; a failed load leaves nothing
/// behind, as schema and data are loaded in one transaction), or [`sqlx::Error::Protocol`] naming
/// the foreign keys the generated data violates (a bug in `data.sql`; the data stays committed).
pub async fn load(pool: &PgPool, size: &DemoSize) -> Result<DemoTenants, sqlx::Error> {
    let n = i64::from(size.small_tenants);
    let large = ACCOUNT_ID_BASE + n / 2 + 1;
    let small: Vec<i64> = (ACCOUNT_ID_BASE + 1..=ACCOUNT_ID_BASE + n + 1)
        .filter(|id| *id != large)
        .collect();
    let groups = [
        (
            vec![large],
            Shape::for_rows(size.large_tenant_rows),
            small.clone(),
        ),
        (
            small.clone(),
            Shape {
                cross_links: 2,
                ..Shape::for_rows(SMALL_TENANT_ROWS)
            },
            vec![large],
        ),
    ];
    let steps = steps();
    let mut large_rows = BTreeMap::new();
    let mut tx = pool.begin().await?;
    sqlx::raw_sql(SCHEMA_SQL).execute(&mut *tx).await?;
    // As superuser, skip the per-row foreign-key triggers while loading (about half the load time)
    // and check every foreign key with one anti-join each afterwards instead.
    let superuser: bool = sqlx::query_scalar("SELECT current_setting('is_superuser') = 'on'")
        .fetch_one(&mut *tx)
        .await?;
    if superuser {
        sqlx::query("SET LOCAL session_replication_role = replica")
            .execute(&mut *tx)
            .await?;
    }
    for cross_phase in [false, true] {
        for (i, (accounts, shape, others)) in groups.iter().enumerate() {
            for step in steps.iter().filter(|s| s.cross == cross_phase) {
                let started = std::time::Instant::now();
                let done = sqlx::query(step.text)
                    .bind(accounts)
                    .bind(sqlx::types::Json(shape))
                    .bind(others)
                    .execute(&mut *tx)
                    .await?;
                tracing::debug!(group = i, table = ?step.table, rows = done.rows_affected(), elapsed = ?started.elapsed(), "demo data step");
                if let (0, Some(table)) = (i, &step.table) {
                    *large_rows.entry(table.clone()).or_insert(0) += done.rows_affected();
                }
            }
        }
    }
    tx.commit().await?;
    if superuser {
        let orphans = super::ownership::orphaned_rows(pool, "app").await?;
        if !orphans.is_empty() {
            return Err(sqlx::Error::Protocol(format!(
                "demo data violates foreign keys: {orphans:?}"
            )));
        }
    }
    sqlx::query("ANALYZE").execute(pool).await?;
    let large_vercel_installation_id =
        sqlx::query_scalar("SELECT vercel_installation_id FROM app.accounts WHERE id = $1")
            .bind(large)
            .fetch_one(pool)
            .await?;
    Ok(DemoTenants {
        large,
        small,
        large_vercel_installation_id,
        large_rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_sql_parses_and_shape_reaches_target() {
        let steps = steps();
        assert!(steps.iter().filter(|s| s.table.is_some()).count() >= 21);
        assert!(
            steps
                .iter()
                .any(|s| s.table == Some(QualifiedName::new("app", "BillingInvoices")))
        );
        for rows in [1_000, 5_000, 1_000_000] {
            let s = Shape::for_rows(rows);
            assert!(
                s.folders >= 32,
                "folder trees must be at least 6 levels deep"
            );
            assert!(s.log_lines_per_deployment >= 10);
        }
    }
}
