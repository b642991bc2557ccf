//! deprov as a real child process (`deprov serve` / `deprov worker`), for the tests that read
//! `/metrics`: the metrics registry is one per process, so in-process servers of concurrently running
//! tests would share counters.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use deprov_testkit::{Throwaway, ThrowawayOptions};
use sqlx::PgPool;

use crate::helpers::{OPERATOR_TOKEN, SOURCE_TOKEN, closed_port};

/// A running deprov process and its PostgreSQL; the process is killed when dropped.
pub struct Process {
    /// `http://127.0.0.1:<port>` of `--listen` (serve) or `--metrics-listen` (worker).
    pub address: String,
    /// A plain client.
    pub client: reqwest::Client,
    /// The PostgreSQL server (state and target database `postgres`).
    pub pg: Throwaway,
    child: Child,
    _dir: tempfile::TempDir,
}

/// Starts a throwaway PostgreSQL with `app.accounts` (the configured root) and, when `schema` is
/// given, runs it there.
pub async fn start_pg(schema: Option<&str>) -> Throwaway {
    let pg = tokio::task::spawn_blocking(|| {
        Throwaway::start(&ThrowawayOptions {
            unsafe_fast: true,
            ..Default::default()
        })
    })
    .await
    .unwrap()
    .expect("start throwaway PostgreSQL");
    let db = connect(&pg).await;
    sqlx::raw_sql("CREATE SCHEMA app; CREATE TABLE app.accounts (id bigint PRIMARY KEY)")
        .execute(&db)
        .await
        .unwrap();
    if let Some(sql) = schema {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&db)
            .await
            .unwrap();
    }
    db.close().await;
    pg
}

/// A finished child's stdout then stderr, as text (what an operator sees in a terminal).
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A small pool on `pg`'s `postgres` database, for assertions.
pub async fn connect(pg: &Throwaway) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .connect(&pg.url("postgres"))
        .await
        .unwrap()
}

/// Runs `deprov <command>` against `pg` with the config `[sources.billing]` + `[tenant]` + `extra`.
/// `serve` listens on a free port, `worker` serves metrics on one. Waits until `/healthz` answers
/// and the start-up checks are done ([`Process::started`]).
pub async fn spawn(pg: Throwaway, command: &str, extra: &str) -> Process {
    spawn_with(pg, command, extra, "warn", Stdio::null(), Stdio::inherit()).await
}

/// [`spawn`], failing the test unless `/healthz` answers 200 within `within` of the call; returns
/// then, without waiting for the start-up checks.
pub async fn spawn_up_within(
    pg: Throwaway,
    command: &str,
    extra: &str,
    within: Duration,
) -> Process {
    start(
        pg,
        command,
        extra,
        ("warn", Stdio::null(), Stdio::inherit()),
        (within, false),
    )
    .await
}

/// [`spawn`] with `RUST_LOG=rust_log` and the child's stdout and stderr given.
pub async fn spawn_with(
    pg: Throwaway,
    command: &str,
    extra: &str,
    rust_log: &str,
    stdout: Stdio,
    stderr: Stdio,
) -> Process {
    start(
        pg,
        command,
        extra,
        (rust_log, stdout, stderr),
        (Duration::from_secs(30), true),
    )
    .await
}

/// [`spawn_with`] (`RUST_LOG`, stdout and stderr in `output`), waiting at most `within` for
/// `/healthz` to answer 200 and, when `started`, for the start-up checks as [`spawn`] does.
async fn start(
    pg: Throwaway,
    command: &str,
    extra: &str,
    (rust_log, stdout, stderr): (&str, Stdio, Stdio),
    (within, started): (Duration, bool),
) -> Process {
    let deadline = tokio::time::Instant::now() + within;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("deprov.toml");
    std::fs::write(
        &config,
        format!(
            "[sources.billing]\ntoken = \"{SOURCE_TOKEN}\"\n\
             [tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n{extra}"
        ),
    )
    .unwrap();
    let port = closed_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_deprov"));
    cmd.arg(command)
        .env("DEPROV_DATABASE_URL", pg.url("postgres"))
        .env("DEPROV_CONFIG", &config)
        .env("DEPROV_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .env("RUST_LOG", rust_log)
        .stdout(stdout)
        .stderr(stderr);
    if command == "worker" {
        cmd.env("DEPROV_METRICS_LISTEN", format!("127.0.0.1:{port}"));
    } else {
        cmd.env("DEPROV_LISTEN", format!("127.0.0.1:{port}"));
    }
    let child = cmd.spawn().expect("spawn deprov");
    let mut process = Process {
        address: format!("http://127.0.0.1:{port}"),
        client: {
            deprov::sources::oidc::install_crypto_provider();
            reqwest::Client::new()
        },
        pg,
        child,
        _dir: dir,
    };
    let mut up = false;
    while !up {
        assert!(
            process.child.try_wait().unwrap().is_none(),
            "deprov {command} exited during start-up"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "deprov {command} did not answer /healthz within {within:?}"
        );
        up = process.answers("/healthz", |_| true).await;
        if !up {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    while started && !process.started(command).await {
        assert!(
            process.child.try_wait().unwrap().is_none(),
            "deprov {command} exited during its start-up checks"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "deprov {command} still starting after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    process
}

impl Process {
    /// Whether `GET path` answers 200 with a body `check` accepts.
    async fn answers(&self, path: &str, check: impl Fn(&str) -> bool) -> bool {
        match self.client.get(self.url(path)).send().await {
            Ok(r) if r.status().is_success() => r.text().await.is_ok_and(|t| check(&t)),
            _ => false,
        }
    }

    /// Whether the start-up checks are done, asked without touching a database (`/readyz` would
    /// take one of intake's connections, which tests count): `serve` answers a `/v1/` path that no
    /// route serves 503 while it is starting, then 404; a worker's `/metrics` has read its migrated
    /// state database (`deprov_db_up{database="state"} 1`), through the queue pool.
    async fn started(&self, command: &str) -> bool {
        if command == "worker" {
            return self
                .answers("/metrics", |t| {
                    Metrics::parse(t).get("deprov_db_up", &[("database", "state")]) == Some(1.0)
                })
                .await;
        }
        match self.client.get(self.url("/v1/no-such-route")).send().await {
            Ok(r) => r.status() == reqwest::StatusCode::NOT_FOUND,
            Err(_) => false,
        }
    }

    /// The URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Sends SIGTERM and waits up to `within` for the process to exit; its exit status, or `None`
    /// when it is still running then.
    pub async fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success(), "kill -TERM {pid}");
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Scrapes `/metrics`, asserting a 200 in the Prometheus text format.
    pub async fn scrape(&self) -> Metrics {
        let response = self.client.get(self.url("/metrics")).send().await.unwrap();
        assert_eq!(response.status(), reqwest::StatusCode::OK);
        assert_eq!(
            response.headers()["content-type"],
            "text/plain; version=0.0.4; charset=utf-8"
        );
        Metrics::parse(&response.text().await.unwrap())
    }

    /// POSTs a deletion request for `tenant` as source `billing`.
    pub async fn post_deletion(&self, tenant: &str) -> reqwest::Response {
        self.client
            .post(self.url("/v1/deletion-requests"))
            .bearer_auth(SOURCE_TOKEN)
            .json(&serde_json::json!({ "tenant_id": tenant }))
            .send()
            .await
            .unwrap()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One scrape, parsed: every sample with its labels.
#[derive(Debug)]
pub struct Metrics {
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
    /// The scrape as received.
    pub text: String,
}

impl Metrics {
    /// Parses the text exposition format (`name{k="v",...} value` lines; `#` lines skipped).
    pub fn parse(text: &str) -> Self {
        let mut samples = Vec::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (series, value) = line.rsplit_once(' ').expect("sample line");
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let labels = rest
                        .trim_end_matches('}')
                        .split(',')
                        .filter(|kv| !kv.is_empty())
                        .map(|kv| {
                            let (k, v) = kv.split_once('=').expect("label");
                            (k.to_owned(), v.trim_matches('"').to_owned())
                        })
                        .collect();
                    (name.to_owned(), labels)
                }
                None => (series.to_owned(), BTreeMap::new()),
            };
            samples.push((name, labels, value.parse().expect("sample value")));
        }
        Self {
            samples,
            text: text.to_owned(),
        }
    }

    /// The value of the sample `name` whose labels include `labels`; `None` when there is none.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).is_some_and(|x| x == v))
            })
            .map(|(_, _, v)| *v)
    }

    /// [`Self::get`], failing the test with the whole scrape when the sample is missing.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no sample {name}{labels:?} in:\n{}", self.text))
    }
}
