//! systemd's notify protocol (`sd_notify(3)`): readiness, reload, stop, status and the watchdog.
//!
//! Every function is a no-op when `NOTIFY_SOCKET` is unset (a shell, a test, a container), so
//! callers never ask "are we under systemd?". A failed send is logged, not returned: nothing a
//! caller could do about it would help, and a service whose watchdog pings are lost is killed
//! and restarted by systemd, which is the recovery we want anyway.
//!
//! Datagrams go out from a thread of their own, in order: a send blocks once the manager's
//! queue is full (it reads none: a stalled PID 1, a container's manager that never reads),
//! and on a tokio worker that froze every webhook, `/readyz` and the SIGTERM with it. The
//! gateway goes on serving; what the manager does not read is dropped, and its watchdog acts
//! on the pings that do not arrive, as it should. A send that fails is warned of once, until
//! one succeeds (a socket that is not there failed every ping, each with a warning).
//!
//! The unit runs with `NotifyAccess=main`: systemd accepts only datagrams whose sender is the
//! main PID. Threads share that PID, so any thread (the tokio workers, the mutex owner) may call
//! these; a forked child may not. sd-notify 0.5 speaks to a path socket (systemd's
//! `/run/systemd/notify`); an abstract `@…` socket, used by some container managers, fails
//! and is logged.

use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::Duration;

use sd_notify::NotifyState;

/// Notes waiting for the sending thread at most; past that, the manager reads none of them.
const WAITING: usize = 32;

/// What the sending thread is given: states, a status line, or a request to say when all
/// before it went out.
enum Note {
    States(Vec<NotifyState<'static>>),
    Status(String),
    Flushed(std::sync::mpsc::Sender<()>),
}

/// `READY=1`: send only once the database is open and the listener is bound (SPEC §5), so that
/// `systemctl start` returns when the gateway can actually take a trade.
pub fn ready() {
    post(Note::States(vec![NotifyState::Ready]));
}

/// `RELOADING=1` with `MONOTONIC_USEC`: systemd ≥ 253 (and `Type=notify-reload`) refuse a
/// reload notification that lacks the timestamp. Follow with [`ready`] when the reload is done.
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => {
            post(Note::States(vec![NotifyState::Reloading, now]));
        }
        Err(e) => log::warn!("sd_notify: cannot read CLOCK_MONOTONIC for RELOADING=1: {e}"),
    }
}

/// `STOPPING=1`: on SIGTERM, before in-flight requests drain and the database closes.
pub fn stopping() {
    post(Note::States(vec![NotifyState::Stopping]));
}

/// `STATUS=…`: one line shown by `systemctl status` (live keys, fail-closed state). Newlines
/// would end the field early, so they are flattened to spaces.
pub fn status(line: &str) {
    post(Note::Status(line.replace('\n', " ")));
}

/// `WATCHDOG=1`: call every [`watchdog_interval`], and only while the mutex owner answers its
/// ping (SPEC §5): a wedged owner then gets the process restarted instead of failing closed
/// forever.
pub fn watchdog() {
    post(Note::States(vec![NotifyState::Watchdog]));
}

/// How often to call [`watchdog`]: half of `WATCHDOG_USEC`, as `sd_watchdog_enabled(3)` advises,
/// so that one late tick is not fatal. `None` when the watchdog is off, or when `WATCHDOG_PID`
/// names another process (the variables were inherited, not meant for us).
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled()
        .filter(|d| !d.is_zero())
        .map(|d| d / 2)
}

/// Waits, `within` at most, until every note posted before has gone out (or failed): for a
/// process about to exit, whose `STOPPING=1` would otherwise go with it.
pub fn flush(within: Duration) {
    let (tx, rx) = std::sync::mpsc::channel();
    if post(Note::Flushed(tx)) {
        let _ = rx.recv_timeout(within);
    }
}

/// Hands `note` to the sending thread (made at the first, only under a manager: no
/// `NOTIFY_SOCKET`, nothing to send). Whether it was taken: not when the queue is full.
fn post(note: Note) -> bool {
    static OUTBOX: OnceLock<Option<SyncSender<Note>>> = OnceLock::new();
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return false;
    }
    let outbox = OUTBOX.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::sync_channel(WAITING);
        let thread = std::thread::Builder::new().name("hoox-notify".into());
        match thread.spawn(move || deliver(rx)) {
            Ok(_) => Some(tx),
            Err(e) => {
                log::warn!("sd_notify: no thread to send from ({e}): sending from the caller's");
                None
            }
        }
    });
    match outbox {
        Some(tx) => match tx.try_send(note) {
            Ok(()) => true,
            // Full: the manager has read none of the last ones. Dropped, as a datagram
            // the manager does not read would be.
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        },
        None => {
            send(note, &mut None);
            true
        }
    }
}

/// The sending thread: each note in turn.
fn deliver(notes: Receiver<Note>) {
    let mut failing = None;
    for note in notes {
        send(note, &mut failing);
    }
}

/// Sends one note; `failing` is the error of the last send, if it failed: the same error
/// again is not said again.
fn send(note: Note, failing: &mut Option<String>) {
    let sent = match note {
        Note::States(states) => sd_notify::notify(&states),
        Note::Status(line) => sd_notify::notify(&[NotifyState::Status(&line)]),
        Note::Flushed(done) => {
            let _ = done.send(());
            return;
        }
    };
    match sent {
        Ok(()) => *failing = None,
        Err(e) => {
            let e = e.to_string();
            if failing.as_ref() != Some(&e) {
                log::warn!("sd_notify: {e} (said once, until a send succeeds)");
                *failing = Some(e);
            }
        }
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
            crate::testing::passed(&out),
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
            flush(Duration::from_secs(10));
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

    /// A manager that reads nothing (a stalled PID 1): the socket's queue fills, and the
    /// sends go on returning. They blocked on the caller's thread, a tokio worker, which
    /// froze every webhook with it.
    #[test]
    fn a_manager_that_reads_nothing_does_not_hold_the_sender() {
        const NAME: &str =
            "platform::notify::tests::a_manager_that_reads_nothing_does_not_hold_the_sender";
        if std::env::var_os(ROLE).is_some() {
            // Far more than the socket's queue (`net.unix.max_dgram_qlen`, 10) and ours.
            for _ in 0..100 {
                watchdog();
                status("x");
            }
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify.sock");
        let _unread = UnixDatagram::bind(&path).expect("bind notify socket");
        let mut child = rerun_self(NAME, "child")
            .env("NOTIFY_SOCKET", &path)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run child");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the sends held the caller");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = child.wait_with_output().expect("child's output");
        assert!(
            crate::testing::passed(&out),
            "{status}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }

    /// A socket that is not there fails every send: said once, not at every ping.
    #[test]
    fn a_failing_send_is_said_once() {
        const NAME: &str = "platform::notify::tests::a_failing_send_is_said_once";
        if std::env::var_os(ROLE).is_some() {
            crate::platform::log::init(log::LevelFilter::Info);
            for _ in 0..20 {
                watchdog();
            }
            flush(Duration::from_secs(10));
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let out = rerun_self(NAME, "child")
            .env("NOTIFY_SOCKET", dir.path().join("not-there.sock"))
            .output()
            .expect("run child");
        assert!(crate::testing::passed(&out));
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(said.matches("sd_notify:").count(), 1, "{said}");
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
        assert!(crate::testing::passed(&out));
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
