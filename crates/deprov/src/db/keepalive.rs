//! TCP keepalives on deprov's database sockets, so a silent peer cannot strand a pool slot.
//!
//! A peer that disappears without a FIN or RST (host gone, NAT or firewall flow expired, network
//! partition) leaves a client blocked reading a reply that never comes; the server's own
//! `statement_timeout` cannot help, the server is gone. With keepalives the kernel probes the idle
//! socket and fails the read after [`Keepalive::detect_within`], the query returns an I/O error,
//! sqlx drops the connection and the pool slot is free again. sqlx 0.9.0 sets only `TCP_NODELAY` and
//! offers no way to reach the socket (upstream issue launchbadge/sqlx#3540; PRs #4159 and #4355 add
//! `PgConnectOptions::keepalives*` and are not released), so [`enable_for_peers`] runs in the pool's
//! `after_connect` hook: it walks this process's descriptors (`/proc/self/fd`) and sets the options
//! on every TCP socket whose peer address is the database's. Setting them again on a socket that
//! already has them changes nothing, so sockets of other pools to the same address are harmless
//! collateral.
//!
//! Covered: Linux, TCP connections (`SO_KEEPALIVE`, `TCP_KEEPIDLE`, `TCP_KEEPINTVL`, `TCP_KEEPCNT`,
//! and `TCP_USER_TIMEOUT` for data sent but never acknowledged). Not covered: Unix-socket
//! connections (no network in between), other operating systems (no-op), and the moment between
//! the TCP connect and the end of PostgreSQL's start-up exchange (bounded by the pool's
//! `acquire_timeout` instead). Behind PgBouncer these are deprov ↔ PgBouncer sockets; PgBouncer's own
//! `tcp_keepalive` (on by default) covers PgBouncer ↔ PostgreSQL.

use std::net::SocketAddr;
use std::time::Duration;

/// Keepalive timing (Linux socket options, `tcp(7)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Idle time before the first probe (`TCP_KEEPIDLE`).
    pub idle: Duration,
    /// Time between probes (`TCP_KEEPINTVL`).
    pub interval: Duration,
    /// Unanswered probes before the connection is dropped (`TCP_KEEPCNT`).
    pub retries: u32,
}

impl Keepalive {
    /// deprov's setting: first probe after 10 s of silence, then every 5 s, dropped after 4 unanswered
    /// probes — a silent peer is detected within 30 s. A live server's kernel answers probes while
    /// a long statement runs, so long batches are not affected.
    pub const DEFAULT: Self = Self {
        idle: Duration::from_secs(10),
        interval: Duration::from_secs(5),
        retries: 4,
    };

    /// The longest a silent peer can hold a socket: `idle + interval × retries`. Also used as
    /// `TCP_USER_TIMEOUT` (data sent but not acknowledged for this long drops the connection).
    pub fn detect_within(&self) -> Duration {
        self.idle + self.interval * self.retries
    }
}

/// The keepalive options one socket carries, as read back from the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketKeepalive {
    /// The descriptor.
    pub fd: i32,
    /// The peer address.
    pub peer: SocketAddr,
    /// `SO_KEEPALIVE`.
    pub enabled: bool,
    /// `TCP_KEEPIDLE`, seconds.
    pub idle_s: i32,
    /// `TCP_KEEPINTVL`, seconds.
    pub interval_s: i32,
    /// `TCP_KEEPCNT`.
    pub retries: i32,
    /// `TCP_USER_TIMEOUT`, milliseconds.
    pub user_timeout_ms: i32,
}

/// Sets `keepalive` on every TCP socket of this process connected to one of `peers`; returns how
/// many sockets it set. Sockets whose options are already set are counted too (setting is
/// idempotent).
///
/// # Errors
/// When `/proc/self/fd` cannot be read. A socket that closes meanwhile is skipped.
pub fn enable_for_peers(peers: &[SocketAddr], keepalive: &Keepalive) -> std::io::Result<usize> {
    let mut set = 0;
    for (fd, peer) in tcp_sockets()? {
        if peers.contains(&peer) && imp::set(fd, keepalive).is_ok() {
            set += 1;
        }
    }
    Ok(set)
}

/// The keepalive options of every TCP socket of this process connected to `peer`.
///
/// # Errors
/// When `/proc/self/fd` cannot be read.
pub fn inspect(peer: SocketAddr) -> std::io::Result<Vec<SocketKeepalive>> {
    Ok(tcp_sockets()?
        .into_iter()
        .filter(|(_, p)| *p == peer)
        .filter_map(|(fd, peer)| imp::read(fd, peer))
        .collect())
}

/// `(fd, peer)` of this process's connected TCP sockets.
fn tcp_sockets() -> std::io::Result<Vec<(i32, SocketAddr)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let Some(fd) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some(peer) = imp::tcp_peer(fd) {
            out.push((fd, peer));
        }
    }
    Ok(out)
}

#[cfg(target_os = "linux")]
mod imp {
    use std::mem::{size_of, zeroed};
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

    use libc::{c_int, c_void, socklen_t};

    use super::{Keepalive, SocketKeepalive};

    #[allow(unsafe_code)] // getsockopt(2) on a socket this pool owns, into a buffer of the size passed
    fn get_int(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
        let mut value: c_int = 0;
        let mut len = size_of::<c_int>() as socklen_t;
        // SAFETY: value and len point to live stack memory of the sizes given; a descriptor that
        // is not a socket (or closed) makes the call fail with ENOTSOCK / EBADF, nothing else.
        let rc = unsafe {
            libc::getsockopt(fd, level, name, (&raw mut value).cast::<c_void>(), &mut len)
        };
        (rc == 0).then_some(value)
    }

    #[allow(unsafe_code)] // setsockopt(2) on a socket this pool owns, from a value of the size passed
    fn set_int(fd: c_int, level: c_int, name: c_int, value: c_int) -> std::io::Result<()> {
        // SAFETY: value lives for the call and its size is passed; see get_int for bad descriptors.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&raw const value).cast::<c_void>(),
                size_of::<c_int>() as socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    fn secs(d: std::time::Duration) -> c_int {
        c_int::try_from(d.as_secs().max(1)).unwrap_or(c_int::MAX)
    }

    /// The peer of `fd` when it is a connected TCP (stream, IPv4/IPv6) socket.
    #[allow(unsafe_code)] // getpeername(2) into a zeroed sockaddr_storage, read back as the family it reports
    pub(super) fn tcp_peer(fd: c_int) -> Option<SocketAddr> {
        if get_int(fd, libc::SOL_SOCKET, libc::SO_TYPE)? != libc::SOCK_STREAM {
            return None;
        }
        // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
        let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
        let mut len = size_of::<libc::sockaddr_storage>() as socklen_t;
        // SAFETY: storage is large enough for any address family and len says so.
        let rc =
            unsafe { libc::getpeername(fd, (&raw mut storage).cast::<libc::sockaddr>(), &mut len) };
        if rc != 0 {
            return None;
        }
        match c_int::from(storage.ss_family) {
            libc::AF_INET => {
                // SAFETY: the family says the storage holds a sockaddr_in.
                let a: libc::sockaddr_in = unsafe { *(&raw const storage).cast() };
                let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                Some(SocketAddrV4::new(ip, u16::from_be(a.sin_port)).into())
            }
            libc::AF_INET6 => {
                // SAFETY: the family says the storage holds a sockaddr_in6.
                let a: libc::sockaddr_in6 = unsafe { *(&raw const storage).cast() };
                let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
                let port = u16::from_be(a.sin6_port);
                Some(SocketAddrV6::new(ip, port, a.sin6_flowinfo, a.sin6_scope_id).into())
            }
            _ => None,
        }
    }

    pub(super) fn set(fd: c_int, k: &Keepalive) -> std::io::Result<()> {
        set_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
        set_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, secs(k.idle))?;
        set_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, secs(k.interval))?;
        let retries = c_int::try_from(k.retries.max(1)).unwrap_or(c_int::MAX);
        set_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, retries)?;
        let user_ms = c_int::try_from(k.detect_within().as_millis()).unwrap_or(c_int::MAX);
        set_int(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, user_ms)
    }

    pub(super) fn read(fd: c_int, peer: SocketAddr) -> Option<SocketKeepalive> {
        Some(SocketKeepalive {
            fd,
            peer,
            enabled: get_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE)? != 0,
            idle_s: get_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE)?,
            interval_s: get_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL)?,
            retries: get_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT)?,
            user_timeout_ms: get_int(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT)?,
        })
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    //! Elsewhere keepalives are not set (see the module docs).
    use std::net::SocketAddr;

    use super::{Keepalive, SocketKeepalive};

    pub(super) fn tcp_peer(_: i32) -> Option<SocketAddr> {
        None
    }

    pub(super) fn set(_: i32, _: &Keepalive) -> std::io::Result<()> {
        Ok(())
    }

    pub(super) fn read(_: i32, _: SocketAddr) -> Option<SocketKeepalive> {
        None
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn sets_keepalive_only_on_sockets_to_the_peer() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = listener.local_addr().unwrap();
        let _to_peer = std::net::TcpStream::connect(peer).unwrap();
        let _to_other = std::net::TcpStream::connect(other.local_addr().unwrap()).unwrap();
        let before = inspect(peer).unwrap();
        assert_eq!(before.len(), 1, "{before:?}");
        assert!(!before[0].enabled);

        assert_eq!(enable_for_peers(&[peer], &Keepalive::DEFAULT).unwrap(), 1);
        let after = inspect(peer).unwrap();
        assert!(after[0].enabled);
        assert_eq!(
            (after[0].idle_s, after[0].interval_s, after[0].retries),
            (10, 5, 4)
        );
        assert_eq!(after[0].user_timeout_ms, 30_000);
        let untouched = inspect(other.local_addr().unwrap()).unwrap();
        assert!(!untouched[0].enabled, "{untouched:?}");
    }
}
