//! Renders a generated case to SQL through deprov's [`SqlBuilder`] (every name quoted) and loads it:
//! tables and partitions first, then the rows (one `INSERT … SELECT FROM unnest($n::text[] …)` per
//! table, values as bind parameters), then indexes and foreign keys, so the data may form cycles.

use deprov::sql::{QualifiedName, SqlBuilder, Statement};
use sqlx::PgPool;

use crate::model::{Action, Case, Deferral, Partitioning, Table};

pub fn name(case: &Case, table: &Table) -> QualifiedName {
    QualifiedName::new(case.schema.clone(), table.name.clone())
}

fn cols(b: &mut SqlBuilder, t: &Table, idx: &[usize]) {
    b.join(idx, ", ", |b, _, &c| {
        b.ident(&t.columns[c].name);
    });
}

/// The table that `INHERITS` from `tables[i]`, when it has one: about one in five non-root,
/// non-partitioned tables (chosen from the seed, so the generator's random stream and every
/// earlier seed's case stay as they were). It holds a copy of all its parent's rows, the victim's
/// included, and no constraint refers to it: a foreign key covers only its own table, so the
/// cascade leaves every row of it (deprov once deleted them).
pub fn inheriting_child(case: &Case, i: usize) -> Option<QualifiedName> {
    let t = &case.tables[i];
    (i > 0 && t.partition.is_none() && (case.seed as usize + i).is_multiple_of(5))
        .then(|| QualifiedName::new(case.schema.clone(), format!("{}_kid", t.name)))
}

/// `CREATE SCHEMA`, `CREATE TABLE`s and partitions.
pub fn tables(case: &Case) -> Vec<Statement> {
    let mut out = Vec::new();
    let mut b = SqlBuilder::new();
    b.sql("CREATE SCHEMA IF NOT EXISTS ").ident(&case.schema);
    out.push(b.build());
    for (i, t) in case.tables.iter().enumerate() {
        let mut b = SqlBuilder::new();
        b.sql("CREATE TABLE ").table(&name(case, t)).sql(" (");
        b.join(&t.columns, ", ", |b, _, c| {
            b.ident(&c.name).sql(" ").sql(c.ty.sql());
            if c.not_null {
                b.sql(" NOT NULL");
            }
            if let Some(d) = c.default {
                b.sql(" DEFAULT ").int(d);
            }
        });
        if let Some(pk) = &t.pk {
            b.sql(", PRIMARY KEY (");
            cols(&mut b, t, pk);
            b.sql(")");
        }
        for u in &t.uniques {
            b.sql(", UNIQUE (");
            cols(&mut b, t, u);
            b.sql(")");
        }
        b.sql(")");
        match &t.partition {
            Some(Partitioning::Hash { col, .. }) => {
                b.sql(" PARTITION BY HASH (").ident(&t.columns[*col].name);
                b.sql(")");
            }
            Some(Partitioning::List { col, .. }) => {
                b.sql(" PARTITION BY LIST (").ident(&t.columns[*col].name);
                b.sql(")");
            }
            None => {}
        }
        out.push(b.build());
        out.extend(partitions(case, t));
        if let Some(kid) = inheriting_child(case, i) {
            let mut b = SqlBuilder::new();
            b.sql("CREATE TABLE ")
                .table(&kid)
                .sql(" () INHERITS (")
                .table(&name(case, t))
                .sql(")");
            out.push(b.build());
        }
    }
    out
}

fn partitions(case: &Case, t: &Table) -> Vec<Statement> {
    let part = |k: usize| {
        let mut b = SqlBuilder::new();
        let pname = QualifiedName::new(case.schema.clone(), format!("{} part {k}", t.name));
        b.sql("CREATE TABLE ")
            .table(&pname)
            .sql(" PARTITION OF ")
            .table(&name(case, t));
        b
    };
    match &t.partition {
        Some(Partitioning::Hash { modulus, .. }) => (0..*modulus)
            .map(|r| {
                let mut b = part(r as usize);
                b.sql(" FOR VALUES WITH (MODULUS ")
                    .int(*modulus)
                    .sql(", REMAINDER ")
                    .int(r)
                    .sql(")");
                b.build()
            })
            .collect(),
        Some(Partitioning::List { groups, .. }) => {
            let mut out: Vec<Statement> = groups
                .iter()
                .enumerate()
                .map(|(k, g)| {
                    let mut b = part(k);
                    b.sql(" FOR VALUES IN (");
                    b.join(g, ", ", |b, _, &v| {
                        b.int(v);
                    });
                    b.sql(")");
                    b.build()
                })
                .collect();
            let mut b = part(groups.len());
            b.sql(" DEFAULT");
            out.push(b.build());
            out
        }
        None => Vec::new(),
    }
}

/// Indexes on foreign-key columns (where the case asks) and the foreign keys themselves.
pub fn constraints(case: &Case) -> Vec<Statement> {
    let mut out = Vec::new();
    for t in &case.tables {
        for fk in &t.fks {
            if t.index_fks {
                let mut b = SqlBuilder::new();
                b.sql("CREATE INDEX ON ").table(&name(case, t)).sql(" (");
                cols(&mut b, t, &fk.cols);
                out.push(b.sql(")").build());
            }
            let parent = &case.tables[fk.parent];
            let mut b = SqlBuilder::new();
            b.sql("ALTER TABLE ")
                .table(&name(case, t))
                .sql(" ADD CONSTRAINT ")
                .ident(&fk.name)
                .sql(" FOREIGN KEY (");
            cols(&mut b, t, &fk.cols);
            b.sql(") REFERENCES ").table(&name(case, parent)).sql(" (");
            cols(&mut b, parent, &fk.parent_cols);
            b.sql(")").sql(fk.action.sql());
            if fk.action == Action::SetNullCols {
                // Only the key's own columns: the shared tenant column (the first) keeps its value.
                b.sql(" (");
                cols(&mut b, t, &fk.cols[1..]);
                b.sql(")");
            }
            b.sql(match fk.deferral {
                Deferral::NotDeferrable => "",
                Deferral::Immediate => " DEFERRABLE INITIALLY IMMEDIATE",
                Deferral::Deferred => " DEFERRABLE INITIALLY DEFERRED",
            });
            out.push(b.build());
        }
    }
    out
}

/// `INSERT INTO t (cols) SELECT u.c0::type, … FROM unnest($1::text[], …) u(c0, …)`.
fn insert(case: &Case, t: &Table) -> Statement {
    let idx: Vec<usize> = (0..t.columns.len()).collect();
    let mut b = SqlBuilder::new();
    b.sql("INSERT INTO ").table(&name(case, t)).sql(" (");
    cols(&mut b, t, &idx);
    b.sql(") SELECT ");
    b.join(&t.columns, ", ", |b, i, c| {
        b.sql("u.c").int(i as i64).sql("::").sql(c.ty.sql());
    });
    b.sql(" FROM unnest(");
    b.join(&idx, ", ", |b, i, _| {
        b.param(i + 1).sql("::text[]");
    });
    b.sql(") u(");
    b.join(&idx, ", ", |b, i, _| {
        b.sql("c").int(i as i64);
    });
    b.sql(")");
    b.build()
}

/// Every statement of the case, for the failure report.
pub fn script(case: &Case) -> String {
    let mut out: Vec<String> = tables(case).iter().map(|s| s.text().into()).collect();
    out.extend(constraints(case).iter().map(|s| s.text().into()));
    out.join(";\n") + ";"
}

/// Creates the schema, loads the rows and adds the constraints.
pub async fn load(db: &PgPool, case: &Case) -> Result<(), String> {
    let run = |s: Statement| async move {
        sqlx::query(s.as_query())
            .execute(db)
            .await
            .map(drop)
            .map_err(|e| format!("{e} in: {}", s.text()))
    };
    for s in tables(case) {
        run(s).await?;
    }
    for t in case.tables.iter().filter(|t| !t.rows.is_empty()) {
        let s = insert(case, t);
        let mut q = sqlx::query(s.as_query());
        for c in 0..t.columns.len() {
            let column: Vec<Option<String>> = t.rows.iter().map(|r| r[c].clone()).collect();
            q = q.bind(column);
        }
        q.execute(db)
            .await
            .map_err(|e| format!("{e} in: {}", s.text()))?;
    }
    for (i, t) in case.tables.iter().enumerate() {
        if let Some(kid) = inheriting_child(case, i) {
            let mut b = SqlBuilder::new();
            b.sql("INSERT INTO ")
                .table(&kid)
                .sql(" SELECT * FROM ONLY ")
                .table(&name(case, t));
            run(b.build()).await?;
        }
    }
    for s in constraints(case) {
        run(s).await?;
    }
    Ok(())
}
