//! No core dump, and no reading of the process's memory by another process of its user.
//!
//! The gateway holds its secrets in memory (the clients' keys, the executor's URL, the TLS
//! key), and a core dump writes that memory to a file: `panic = "abort"` dumps core where
//! the limit allows it, and outside the package's unit (`LimitCORE=0`) it often does (a
//! shell's `ulimit -c unlimited`, a container, another supervisor). Not dumpable, the
//! process leaves no core, and another process of the same user can neither attach to it
//! nor read `/proc/PID/mem`; root still can.

use std::io;

/// Makes this process not dumpable (`PR_SET_DUMPABLE` 0), for the rest of its life.
pub fn forbid() -> io::Result<()> {
    // SAFETY: PR_SET_DUMPABLE takes an integer argument and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
