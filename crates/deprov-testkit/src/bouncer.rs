//! A throwaway PgBouncer in front of a [`Throwaway`] PostgreSQL, for tests and benchmarks.
//!
//! It runs Debian's `/usr/sbin/pgbouncer` (1.18; `DEPROV_PGBOUNCER` overrides the path), as the
//! `postgres` user when we are root, on a free loopback port, with `auth_type = trust`, the admin
//! console open to `postgres` (database `pgbouncer`), `ignore_startup_parameters =
//! extra_float_digits` (sqlx sends it) and `log_connections = 1`, so every server connection it
//! opens is a `new connection to server` line in its log ([`Bouncer::server_logins`]). Every database
//! of the server is reachable through it (`* = host=127.0.0.1 port=…`), one pool per database and
//! user. It is stopped (SIGTERM, then SIGKILL after 10 s) and its files removed when dropped.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use deprov_testkit::{Bouncer, BouncerOptions, PoolMode, Show, Throwaway, ThrowawayOptions};
//! let pg = Throwaway::start(&ThrowawayOptions::default())?;
//! let bouncer = Bouncer::start(&pg, &BouncerOptions { pool_mode: PoolMode::Transaction,
//!     default_pool_size: 2, ..BouncerOptions::default() })?;
//! let url = bouncer.url("postgres"); // give this to the client under test
//! let pools = bouncer.show(Show::Pools).await?; // one row per (database, user)
//! println!("{} server logins, pools: {pools:?}", bouncer.server_logins());
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sqlx::{Connection as _, Row as _};

use super::{Throwaway, ThrowawayError, chown_to_postgres, free_port, is_root, run};

/// PgBouncer's `pool_mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per client connection, for the client's whole session.
    Session,
    /// A server connection per transaction (the mode deprov's `DEPROV_POOLER_MODE=transaction` is for).
    #[default]
    Transaction,
}

impl PoolMode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Transaction => "transaction",
        }
    }
}

/// Options for [`Bouncer::start`].
#[derive(Debug, Clone)]
pub struct BouncerOptions {
    /// `pool_mode` (default transaction).
    pub pool_mode: PoolMode,
    /// `default_pool_size`: server connections per (database, user) pool (default 20, PgBouncer's).
    pub default_pool_size: u32,
    /// `max_client_conn` (default 100, PgBouncer's).
    pub max_client_conn: u32,
    /// Extra `[pgbouncer]` settings, e.g. `("query_wait_timeout", "5")`; written after the defaults, so
    /// they override them.
    pub settings: Vec<(String, String)>,
}

impl Default for BouncerOptions {
    fn default() -> Self {
        Self {
            pool_mode: PoolMode::Transaction,
            default_pool_size: 20,
            max_client_conn: 100,
            settings: Vec::new(),
        }
    }
}

/// What the admin console's `SHOW` lists (PgBouncer docs, "Admin console").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Show {
    /// `SHOW POOLS`: per pool `cl_active`, `cl_waiting`, `sv_active`, `sv_idle`, `sv_used`,
    /// `sv_login`, `maxwait` (s), `maxwait_us`, `pool_mode`.
    Pools,
    /// `SHOW SERVERS`: one row per server connection (`database`, `state`, `connect_time`, `port`, …).
    Servers,
    /// `SHOW CLIENTS`: one row per client connection.
    Clients,
    /// `SHOW STATS`: per database totals (`total_xact_count`, `total_query_count`, `total_wait_time`
    /// in µs, …).
    Stats,
}

impl Show {
    fn command(self) -> &'static str {
        match self {
            Self::Pools => "SHOW POOLS",
            Self::Servers => "SHOW SERVERS",
            Self::Clients => "SHOW CLIENTS",
            Self::Stats => "SHOW STATS",
        }
    }
}

/// A running throwaway PgBouncer; stopped and deleted on drop.
#[derive(Debug)]
pub struct Bouncer {
    dir: tempfile::TempDir,
    port: u16,
    pid: i32,
}

fn binary() -> PathBuf {
    std::env::var_os("DEPROV_PGBOUNCER")
        .map_or_else(|| PathBuf::from("/usr/sbin/pgbouncer"), PathBuf::from)
}

fn config(dir: &Path, port: u16, server: &Throwaway, o: &BouncerOptions) -> String {
    let mut settings: Vec<(String, String)> = [
        ("listen_addr", "127.0.0.1".to_owned()),
        ("listen_port", port.to_string()),
        ("unix_socket_dir", String::new()),
        ("auth_type", "trust".into()),
        ("auth_file", dir.join("userlist.txt").display().to_string()),
        ("admin_users", "postgres".into()),
        ("stats_users", "postgres".into()),
        ("pool_mode", o.pool_mode.as_str().into()),
        ("default_pool_size", o.default_pool_size.to_string()),
        ("max_client_conn", o.max_client_conn.to_string()),
        ("ignore_startup_parameters", "extra_float_digits".into()),
        ("logfile", dir.join("pgbouncer.log").display().to_string()),
        ("pidfile", dir.join("pgbouncer.pid").display().to_string()),
        ("log_connections", "1".into()),
        ("log_disconnections", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    settings.extend(o.settings.iter().cloned());
    let mut text = format!(
        "[databases]\n* = host=127.0.0.1 port={}\n\n[pgbouncer]\n",
        server.port()
    );
    for (k, v) in settings {
        text.push_str(&format!("{k} = {v}\n"));
    }
    text
}

fn accepts(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

#[allow(unsafe_code)] // kill(2) with signal 0 only probes whether the pid exists
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    unsafe { libc::kill(pid, 0) == 0 }
}

impl Bouncer {
    /// Starts PgBouncer in front of `server` (`pgbouncer -d`) and waits (at most 10 s) until it
    /// accepts connections.
    ///
    /// # Errors
    /// [`ThrowawayError`] when the binary is missing, it does not start, or the port is taken (tried
    /// on five free ports).
    #[allow(unsafe_code)] // kill(2) on the pgbouncer child this function spawned
    pub fn start(server: &Throwaway, options: &BouncerOptions) -> Result<Self, ThrowawayError> {
        let bin = binary();
        if !bin.exists() {
            return Err(ThrowawayError::Command {
                command: bin.display().to_string(),
                output: "PgBouncer not found: apt-get install pgbouncer, or set DEPROV_PGBOUNCER"
                    .into(),
            });
        }
        let mut last_err = None;
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("deprov-pgbouncer-")
                .tempdir()?;
            let port = free_port()?;
            std::fs::write(dir.path().join("userlist.txt"), "\"postgres\" \"\"\n")?;
            let ini = dir.path().join("pgbouncer.ini");
            std::fs::write(&ini, config(dir.path(), port, server, options))?;
            chown_to_postgres(dir.path())?;
            let mut cmd = if is_root() {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(&bin);
                c
            } else {
                Command::new(&bin)
            };
            cmd.args(["-d", "-q"]).arg(&ini);
            let log = dir.path().join("pgbouncer.log");
            if let Err(e) = run(cmd, Some(&log)) {
                last_err = Some(e);
                continue;
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            let pidfile = dir.path().join("pgbouncer.pid");
            loop {
                let pid = std::fs::read_to_string(&pidfile)
                    .ok()
                    .and_then(|p| p.trim().parse::<i32>().ok());
                if let Some(pid) = pid
                    && accepts(port)
                {
                    return Ok(Self { dir, port, pid });
                }
                if Instant::now() > deadline {
                    if let Some(pid) = pid {
                        // SAFETY: a plain signal to the daemon we started.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                    last_err = Some(ThrowawayError::Command {
                        command: format!("pgbouncer -d {}", ini.display()),
                        output: std::fs::read_to_string(&log).unwrap_or_default(),
                    });
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Err(last_err.expect("loop ran"))
    }

    /// The loopback port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL for database `db` through the pooler, as `postgres` (trust authentication).
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The admin console's URL (database `pgbouncer`).
    pub fn admin_url(&self) -> String {
        self.url("pgbouncer")
    }

    /// PgBouncer's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }

    /// Server connections PgBouncer has opened so far (its `new connection to server` log lines;
    /// 1.18 has no counter for them). Successful or not: a login that then fails is counted too.
    pub fn server_logins(&self) -> usize {
        self.log().matches("new connection to server").count()
    }

    /// [`Self::server_logins`] of database `db`'s pools only (log lines naming `db/`).
    pub fn server_logins_of(&self, db: &str) -> usize {
        let tag = format!(" {db}/");
        self.log()
            .lines()
            .filter(|l| l.contains("new connection to server") && l.contains(&tag))
            .count()
    }

    /// [`Self::server_closes`] of database `db`'s pools only.
    pub fn server_closes_of(&self, db: &str) -> usize {
        let tag = format!(" {db}/");
        self.log()
            .lines()
            .filter(|l| l.contains(" S-") && l.contains("closing because") && l.contains(&tag))
            .count()
    }

    /// Why PgBouncer closed database `db`'s server connections so far: each `closing because:`
    /// reason of its log with how often it appeared.
    pub fn server_close_reasons_of(&self, db: &str) -> BTreeMap<String, usize> {
        let tag = format!(" {db}/");
        let mut reasons = BTreeMap::new();
        for line in self.log().lines() {
            if line.contains(" S-")
                && line.contains(&tag)
                && let Some((_, why)) = line.split_once("closing because: ")
            {
                let why = why.split(" (age").next().unwrap_or(why).trim().to_owned();
                *reasons.entry(why).or_insert(0) += 1;
            }
        }
        reasons
    }

    /// Client connections PgBouncer refused because `max_client_conn` was reached (its `no more
    /// connections allowed (max_client_conn)` log lines).
    pub fn max_client_conn_rejections(&self) -> usize {
        self.log()
            .matches("no more connections allowed (max_client_conn)")
            .count()
    }

    /// Server connections PgBouncer has closed so far (`closing because:` lines of server
    /// connections, e.g. `client disconnect while server was not ready`).
    pub fn server_closes(&self) -> usize {
        self.log()
            .lines()
            .filter(|l| l.contains(" S-") && l.contains("closing because"))
            .count()
    }

    /// Runs `SHOW …` on the admin console (simple protocol, as the console requires) and returns
    /// each row as column name → text value (NULL as an empty string).
    ///
    /// # Errors
    /// Connection or query errors.
    pub async fn show(&self, what: Show) -> Result<Vec<BTreeMap<String, String>>, sqlx::Error> {
        let mut conn = sqlx::PgConnection::connect(&self.admin_url()).await?;
        let rows = Self::show_on(&mut conn, what).await;
        conn.close().await?;
        rows
    }

    /// [`Self::show`] on an admin-console connection the caller holds open (to [`Self::admin_url`]):
    /// a sampler keeps one, so it is not refused when `max_client_conn` is reached.
    ///
    /// # Errors
    /// Query errors.
    pub async fn show_on(
        conn: &mut sqlx::PgConnection,
        what: Show,
    ) -> Result<Vec<BTreeMap<String, String>>, sqlx::Error> {
        let rows = sqlx::raw_sql(what.command()).fetch_all(&mut *conn).await?;
        Ok(rows
            .iter()
            .map(|row| {
                (0..row.len())
                    .map(|i| {
                        use sqlx::Column as _;
                        let name = row.columns()[i].name().to_owned();
                        let value: Option<String> = row.try_get_unchecked(i).ok().flatten();
                        (name, value.unwrap_or_default())
                    })
                    .collect()
            })
            .collect())
    }

    /// Stops PgBouncer now (SIGTERM; SIGKILL if still running after 10 s) and waits for it to exit.
    #[allow(unsafe_code)] // kill(2) on the pgbouncer child this value owns
    pub fn stop(&self) {
        if !alive(self.pid) {
            return;
        }
        // SAFETY: plain signals to the daemon we started (its pid from its pidfile).
        unsafe { libc::kill(self.pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(self.pid) {
            if Instant::now() > deadline {
                // SAFETY: as above.
                unsafe { libc::kill(self.pid, libc::SIGKILL) };
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        self.stop();
    }
}
