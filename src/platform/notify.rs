//! systemd's notify protocol (`sd_notify(3)`): readiness, reload, stop, status and the watchdog.
//!
//! Every function is a no-op when `NOTIFY_SOCKET` is unset (a shell, a test, a container), so
//! callers never ask "are we under systemd?". A failed send is logged, not returned: nothing a
//! caller could do about it would help, and a service whose watchdog pings are lost is killed
//! and restarted by systemd, which is the recovery we want anyway.
//!
//! The unit runs with `NotifyAccess=main`: systemd accepts only datagrams whose sender is the
//! main PID. Threads share that PID, so any thread (the tokio workers, the mutex owner) may call
//! these; a forked child may not. sd-notify 0.5 speaks to a path socket (systemd's
//! `/run/systemd/notify`); an abstract `@…` socket, used by some container managers, fails
//! and is logged.

use std::time::Duration;

use sd_notify::NotifyState;

/// `READY=1`: send only once the database is open and the listener is bound (SPEC §5), so that
/// `systemctl start` returns when the gateway can actually take a trade.
pub fn ready() {
    send(&[NotifyState::Ready]);
}

/// `RELOADING=1` with `MONOTONIC_USEC`: systemd ≥ 253 (and `Type=notify-reload`) refuse a
/// reload notification that lacks the timestamp. Follow with [`ready`] when the reload is done.
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(e) => log::warn!("sd_notify: cannot read CLOCK_MONOTONIC for RELOADING=1: {e}"),
    }
}

/// `STOPPING=1`: on SIGTERM, before in-flight requests drain and the database closes.
pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

/// `STATUS=…`: one line shown by `systemctl status` (live keys, fail-closed state). Newlines
/// would end the field early, so they are flattened to spaces.
pub fn status(line: &str) {
    if line.contains('\n') {
        send(&[NotifyState::Status(&line.replace('\n', " "))]);
    } else {
        send(&[NotifyState::Status(line)]);
    }
}

/// `WATCHDOG=1`: call every [`watchdog_interval`], and only while the mutex owner answers its
/// ping (SPEC §5): a wedged owner then gets the process restarted instead of failing closed
/// forever.
pub fn watchdog() {
    send(&[NotifyState::Watchdog]);
}

/// How often to call [`watchdog`]: half of `WATCHDOG_USEC`, as `sd_watchdog_enabled(3)` advises,
/// so that one late tick is not fatal. `None` when the watchdog is off, or when `WATCHDOG_PID`
/// names another process (the variables were inherited, not meant for us).
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled()
        .filter(|d| !d.is_zero())
        .map(|d| d / 2)
}

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        log::warn!("sd_notify: {e}");
    }
}

#[cfg(test)]
mod tests {
    //! The notify variables are process-wide, and setting them in a threaded test binary is
    //! unsound. So the test re-runs itself as a child process with its own environment: the
    //! child sends, the parent owns the socket and reads what arrived.

    use super::*;
    use std::os::unix::net::UnixDatagram;
    use std::process::Command;

    const ROLE: &str = "HOOX_NOTIFY_TEST_ROLE";

    fn rerun_self(test: &str, role: &str) -> Command {
        let mut cmd = crate::testing::rerun(test).expect("test binary path");
        cmd.env(ROLE, role)
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID");
        cmd
    }

    fn assert_success(cmd: &mut Command) {
        let out = cmd.output().expect("run child test");
        assert!(
            out.status.success(),
            "child failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn datagrams_reach_the_notify_socket() {
        const NAME: &str = "platform::notify::tests::datagrams_reach_the_notify_socket";
        if std::env::var_os(ROLE).is_some() {
            ready();
            status("live keys: 3\nstate: ok");
            watchdog();
            reloading();
            stopping();
            return;
        }

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind notify socket");
        sock.set_nonblocking(true).expect("nonblocking");
        assert_success(rerun_self(NAME, "child").env("NOTIFY_SOCKET", &path));

        // The child has exited, so every datagram it sent is already queued.
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        while let Ok(n) = sock.recv(&mut buf) {
            got.push(String::from_utf8(buf[..n].to_vec()).expect("utf8 datagram"));
        }
        assert_eq!(got.len(), 5, "datagrams: {got:?}");
        assert_eq!(got[0], "READY=1\n");
        assert_eq!(got[1], "STATUS=live keys: 3 state: ok\n");
        assert_eq!(got[2], "WATCHDOG=1\n");
        let reload: Vec<&str> = got[3].lines().collect();
        assert_eq!(reload[0], "RELOADING=1");
        let usec = reload[1]
            .strip_prefix("MONOTONIC_USEC=")
            .expect("MONOTONIC_USEC follows RELOADING")
            .parse::<u64>()
            .expect("numeric MONOTONIC_USEC");
        assert!(usec > 0);
        assert_eq!(got[4], "STOPPING=1\n");
    }

    #[test]
    fn nothing_is_sent_and_nothing_fails_without_a_socket() {
        const NAME: &str =
            "platform::notify::tests::nothing_is_sent_and_nothing_fails_without_a_socket";
        if std::env::var_os(ROLE).is_some() {
            // Without NOTIFY_SOCKET every call must return quietly; the parent checks stderr.
            ready();
            reloading();
            status("x");
            watchdog();
            stopping();
            assert_eq!(watchdog_interval(), None);
            return;
        }
        let out = rerun_self(NAME, "child").output().expect("run child");
        assert!(out.status.success());
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("sd_notify"),
            "no warning expected"
        );
    }

    #[test]
    fn watchdog_interval_is_half_and_honours_watchdog_pid() {
        const NAME: &str =
            "platform::notify::tests::watchdog_interval_is_half_and_honours_watchdog_pid";
        match std::env::var(ROLE).as_deref() {
            Ok("mine") => {
                assert_eq!(watchdog_interval(), Some(Duration::from_secs(5)));
                return;
            }
            Ok("other" | "off") => {
                assert_eq!(watchdog_interval(), None);
                return;
            }
            _ => {}
        }
        // No WATCHDOG_PID: the variable is ours.
        assert_success(rerun_self(NAME, "mine").env("WATCHDOG_USEC", "10000000"));
        // WATCHDOG_PID of another process (pid 1 is never the test child): not ours.
        assert_success(
            rerun_self(NAME, "other")
                .env("WATCHDOG_USEC", "10000000")
                .env("WATCHDOG_PID", "1"),
        );
        // Zero and garbage mean off.
        assert_success(rerun_self(NAME, "off").env("WATCHDOG_USEC", "0"));
        assert_success(rerun_self(NAME, "off").env("WATCHDOG_USEC", "soon"));
    }
}
