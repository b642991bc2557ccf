//! A throwaway PostgreSQL server for the demo, the benchmarks and the tests.
//!
//! It needs only PostgreSQL's server binaries (`initdb`, `pg_ctl`, `postgres`): found through
//! `DEPROV_PG_BIN`, else the newest `/usr/lib/postgresql/<version>/bin` (Debian's layout), else `PATH`.
//! PostgreSQL refuses to run as root, so as root every server command runs as the `postgres` user via
//! `runuser` (util-linux, present on every Debian system; no `sudo` needed).
//!
//! `initdb` runs once per machine into a cached template directory (temp dir, keyed by user and binary
//! directory); each server copies it (a few hundred ms instead of seconds), listens on loopback on a
//! free port and is stopped (`pg_ctl stop -m immediate`) and removed when dropped.
//!
//! [`Bouncer`] puts a throwaway PgBouncer in front of one (see [`bouncer`]);
//! [`transactions::TransactionSampler`] measures the longest transaction clients open on a database.

// Starts and prepares throwaway servers, outside the service's pool rules (clippy.toml).
#![allow(clippy::disallowed_methods)]

pub mod bouncer;
pub mod transactions;

pub use bouncer::{Bouncer, BouncerOptions, PoolMode, Show};

use std::path::{Path, PathBuf};
use std::process::Command;

/// Why a throwaway server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ThrowawayError {
    /// No `initdb`/`pg_ctl` found.
    #[error(
        "PostgreSQL server binaries not found: set DEPROV_PG_BIN to the directory holding initdb and pg_ctl"
    )]
    NoBinaries,
    /// A file-system step failed.
    #[error("throwaway PostgreSQL: {0}")]
    Io(#[from] std::io::Error),
    /// `initdb` or `pg_ctl` exited with an error.
    #[error("throwaway PostgreSQL: `{command}` failed: {output}")]
    Command {
        /// What ran.
        command: String,
        /// Its stderr and the server log's tail.
        output: String,
    },
}

/// Options for [`Throwaway::start`].
#[derive(Debug, Clone, Default)]
pub struct ThrowawayOptions {
    /// `fsync=off`, `synchronous_commit=off`, `full_page_writes=off`: faster, for tests only. The demo
    /// and the benchmarks keep PostgreSQL's durable defaults.
    pub unsafe_fast: bool,
    /// Extra `-c name=value` server settings.
    pub settings: Vec<(String, String)>,
}

/// A running throwaway server; stopped and deleted on drop.
#[derive(Debug)]
pub struct Throwaway {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    server_opts: String,
}

/// Whether this process runs as root (effective UID 0): PostgreSQL's commands then run as the
/// `postgres` user through `runuser`.
#[allow(unsafe_code)] // geteuid(2) has no preconditions and cannot fail
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The directory of PostgreSQL's server binaries: `DEPROV_PG_BIN`, else the newest
/// `/usr/lib/postgresql/<version>/bin`, else the directory of `initdb` on `PATH`.
///
/// # Errors
/// [`ThrowawayError::NoBinaries`] when none is found.
pub fn find_bin_dir() -> Result<PathBuf, ThrowawayError> {
    if let Ok(dir) = std::env::var("DEPROV_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, p): &(u32, PathBuf)| p.join("initdb").exists())
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Ok(dir);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .find(|p| p.join("initdb").exists())
        .ok_or(ThrowawayError::NoBinaries)
}

/// Runs a server binary, as `postgres` when we are root.
fn server_command(bin: &Path, program: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(program));
        c
    } else {
        Command::new(bin.join(program))
    }
}

pub(crate) fn run(mut cmd: Command, log: Option<&Path>) -> Result<(), ThrowawayError> {
    let out = cmd.output()?;
    if out.status.success() {
        return Ok(());
    }
    let mut output = String::from_utf8_lossy(&out.stderr).into_owned();
    if let Some(tail) = log.and_then(|l| std::fs::read_to_string(l).ok()) {
        output.push_str(&tail[tail.len().saturating_sub(2000)..]);
    }
    Err(ThrowawayError::Command {
        command: format!("{cmd:?}"),
        output,
    })
}

/// As root, gives `path` (recursively) to the `postgres` user, so that a server run as that user
/// can use it; otherwise does nothing.
///
/// # Errors
/// [`ThrowawayError`] when `chown` fails.
pub fn chown_to_postgres(path: &Path) -> Result<(), ThrowawayError> {
    if is_root() {
        let mut c = Command::new("chown");
        c.args(["-R", "postgres:postgres"]).arg(path);
        run(c, None)?;
    }
    Ok(())
}

/// The cached, initdb'd data directory, made once (atomically renamed into place).
#[allow(unsafe_code)] // geteuid(2) has no preconditions and cannot fail
fn template(bin: &Path) -> Result<PathBuf, ThrowawayError> {
    let key: u64 = bin
        .to_string_lossy()
        .bytes()
        .fold(1469598103934665603, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(1099511628211)
        });
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let root = std::env::temp_dir();
    let final_dir = root.join(format!("deprov-pg-template-{uid}-{key:x}"));
    if final_dir.join("PG_VERSION").exists() {
        return Ok(final_dir);
    }
    let staging = tempfile::Builder::new()
        .prefix("deprov-pg-initdb-")
        .tempdir_in(&root)?;
    chown_to_postgres(staging.path())?;
    let data = staging.path().join("data");
    let mut initdb = server_command(bin, "initdb");
    initdb.arg("-D").arg(&data).args([
        "-U",
        "postgres",
        "--auth=trust",
        "-E",
        "UTF8",
        "--locale=C",
        "--no-sync",
    ]);
    run(initdb, None)?;
    match std::fs::rename(&data, &final_dir) {
        Ok(()) => Ok(final_dir),
        Err(_) if final_dir.join("PG_VERSION").exists() => Ok(final_dir), // another process won the race
        Err(e) => Err(e.into()),
    }
}

pub(crate) fn free_port() -> Result<u16, ThrowawayError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Throwaway {
    /// Starts a fresh server and waits until it accepts connections (`pg_ctl start -w`).
    ///
    /// # Errors
    /// [`ThrowawayError`] when the binaries are missing or the server does not start.
    pub fn start(options: &ThrowawayOptions) -> Result<Self, ThrowawayError> {
        let bin = find_bin_dir()?;
        let template = template(&bin)?;
        let dir = tempfile::Builder::new().prefix("deprov-pg-").tempdir()?;
        let data = dir.path().join("data");
        let mut cp = Command::new("cp");
        cp.arg("-a").arg(&template).arg(&data);
        run(cp, None)?;
        chown_to_postgres(dir.path())?;
        let mut last_err = None;
        for _ in 0..5 {
            let port = free_port()?;
            let mut server_opts = format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200",
                dir.path().display()
            );
            if options.unsafe_fast {
                server_opts
                    .push_str(" -c fsync=off -c synchronous_commit=off -c full_page_writes=off");
            }
            for (k, v) in &options.settings {
                server_opts.push_str(&format!(" -c {k}={v}"));
            }
            let log = dir.path().join("server.log");
            let mut start = server_command(&bin, "pg_ctl");
            start.arg("-D").arg(&data).arg("-l").arg(&log).args([
                "-w",
                "-t",
                "60",
                "-o",
                &server_opts,
                "start",
            ]);
            match run(start, Some(&log)) {
                Ok(()) => {
                    return Ok(Self {
                        dir,
                        bin,
                        port,
                        server_opts,
                    });
                }
                Err(e) => last_err = Some(e), // most likely the port was taken meanwhile: try another
            }
        }
        Err(last_err.expect("loop ran"))
    }

    /// The server's loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL for database `db` as superuser `postgres` (trust authentication, loopback only).
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The data directory (for tests that stop and restart the server).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`), keeping its files; see [`Self::restart`].
    ///
    /// # Errors
    /// When `pg_ctl` fails.
    pub fn stop(&self) -> Result<(), ThrowawayError> {
        let mut stop = server_command(&self.bin, "pg_ctl");
        stop.arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "stop"]);
        run(stop, None)
    }

    /// Starts a stopped server again on the same port (`pg_ctl start -w`).
    ///
    /// # Errors
    /// When `pg_ctl` fails.
    pub fn restart(&self) -> Result<(), ThrowawayError> {
        let mut start = server_command(&self.bin, "pg_ctl");
        let log = self.dir.path().join("server.log");
        start
            .arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "60", "-o", &self.server_opts, "start"]);
        run(start, Some(&log))
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
