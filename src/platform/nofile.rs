//! The open-file limit (RLIMIT_NOFILE). Every connection is a descriptor, and so is every
//! executor connection, the database, the journal and the log: a soft limit of 1024 (a
//! shell's usual `ulimit -n`, and systemd's default for services) runs out before the
//! default `server.max_connections` does, and then accepts, executor connections and the
//! database's reopen fail alike. The hard limit is ours to take, so `serve` takes it.

use std::io;

use libc::rlim_t;

/// Descriptors the gateway holds besides its connections (and its HTTP executor's, which
/// the caller counts): the admin listener and its clients, the database, the journal, the
/// log and the listeners. A generous round figure: it only decides whether to warn.
pub const RESERVE: rlim_t = 64;

/// The soft limit before and after [`raise_to_hard`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raised {
    pub before: rlim_t,
    pub after: rlim_t,
}

/// Raises the soft RLIMIT_NOFILE to the hard limit. Needs no privilege: any process may
/// raise its soft limit up to its hard one.
pub fn raise_to_hard() -> io::Result<Raised> {
    let mut lim = get()?;
    let before = lim.rlim_cur;
    if lim.rlim_cur >= lim.rlim_max {
        return Ok(Raised {
            before,
            after: before,
        });
    }
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: `lim` is a valid rlimit, read above, with only its soft limit changed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Raised {
        before,
        after: lim.rlim_cur,
    })
}

/// The soft RLIMIT_NOFILE now.
pub fn soft_limit() -> io::Result<rlim_t> {
    get().map(|lim| lim.rlim_cur)
}

fn get() -> io::Result<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill in.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(lim)
}

/// Whether `connections` descriptors for connections and the [`RESERVE`] fit under the
/// soft limit `soft`: if not, the descriptors they would need.
pub fn shortfall(connections: usize, soft: rlim_t) -> Option<rlim_t> {
    let needed = rlim_t::try_from(connections)
        .unwrap_or(rlim_t::MAX)
        .saturating_add(RESERVE);
    // RLIM_INFINITY is the largest rlim_t, so it never falls short.
    (needed > soft).then_some(needed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_and_the_reserve_must_fit_under_the_limit() {
        assert_eq!(shortfall(1024, 1024), Some(1024 + RESERVE));
        assert_eq!(shortfall(1024, 1024 + RESERVE - 1), Some(1024 + RESERVE));
        assert_eq!(shortfall(1024, 1024 + RESERVE), None);
        assert_eq!(shortfall(1024, 65536), None);
        assert_eq!(shortfall(1_000_000, libc::RLIM_INFINITY), None);
    }
}
