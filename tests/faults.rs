//! The fault matrix against the running binary, with real OS mechanisms: a database locked by
//! another process, a read-only state directory (a read-only bind mount), a file-size limit
//! hit mid-run (RLIMIT_FSIZE set on the live process with prlimit), a full disk at the first
//! start (a small tmpfs), a corrupt file at start,
//! and a stalled owner (the one test-only hook). Each must answer 503
//! IDEMPOTENCY_UNAVAILABLE with `/readyz` 503 and zero executor calls, then recover without a
//! restart once the fault is gone.
//!
//! An I/O error from the disk, mid-run, comes from a FUSE file system that fails writes
//! and syncs with EIO on command (`support/eiofs.rs`); a power cut, from the same file
//! system holding each file's writes in a volatile cache until that file is synced.
//!
//! The mounts need root, as CI has.

#[path = "support/eiofs.rs"]
mod eiofs;
mod support;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use support::executor::{MockExecutor, Mode};
use support::gateway::{Gateway, Setup, readyz_is_within, trade};

fn code(v: &Value) -> String {
    v["code"].as_str().unwrap_or("").to_string()
}

fn keyed(k: &str) -> Value {
    let mut t = trade("BTCUSDT");
    t["idempotencyKey"] = json!(k);
    t
}

/// Asserts the gateway fails closed: 503 IDEMPOTENCY_UNAVAILABLE, `/readyz` 503, and the
/// executor untouched.
async fn assert_fails_closed(gw: &Gateway, exec: &MockExecutor, k: &str) {
    let calls = exec.calls();
    gw.wait_ready_is(503).await;
    let r = gw.post(&keyed(k), &[]).await;
    assert_eq!(r.status, 503, "{:?}", r.json());
    assert_eq!(code(&r.json()), "IDEMPOTENCY_UNAVAILABLE");
    let wait: u64 = r
        .header("retry-after")
        .and_then(|s| s.parse().ok())
        .expect("503 carries Retry-After in seconds");
    assert!(wait >= 1, "Retry-After {wait}: senders would retry at once");
    assert_eq!(
        exec.calls(),
        calls,
        "a trade reached the executor while failing closed"
    );
}

/// Waits for recovery, then proves service with a fresh key.
async fn assert_recovers(gw: &Gateway, exec: &MockExecutor, k: &str) {
    gw.wait_ready().await;
    let calls = exec.calls();
    let r = gw.post(&keyed(k), &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert_eq!(exec.calls(), calls + 1);
}

/// The gateway as a service manager starts it: SIGXFSZ at its default action (which kills
/// the process), so that the gateway must ignore it itself for a write past the file-size
/// limit to fail with EFBIG, the fault it fails closed on, rather than end it.
fn spawn_with_default_signals(setup: &Setup) -> Gateway {
    let mut cmd = setup.command();
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
            Ok(())
        });
    }
    Gateway::spawn(cmd, &setup.pki.ca_cert)
}

/// RLIMIT_FSIZE on the live gateway: no write may reach past `cur` bytes of any file.
fn set_file_size_limit(gw: &Gateway, cur: u64) {
    let lim = libc::rlimit {
        rlim_cur: cur,
        rlim_max: libc::RLIM_INFINITY,
    };
    let rc = unsafe {
        libc::prlimit(
            gw.child.id() as i32,
            libc::RLIMIT_FSIZE,
            &lim,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let entries = std::fs::read_dir(dir).unwrap();
    let mut names: Vec<_> = entries
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn sh(cmd: &str, args: &[&str]) {
    let st = Command::new(cmd).args(args).status().unwrap();
    assert!(st.success(), "{cmd} {args:?} failed");
}

/// A mount on a directory, unmounted on drop even if the test fails.
struct Mount(PathBuf);

impl Mount {
    /// The directory, bound onto itself.
    fn bind(dir: &Path) -> Mount {
        let d = dir.to_str().unwrap();
        sh("mount", &["--bind", d, d]);
        Mount(dir.to_path_buf())
    }
    /// A file system of `size` in memory.
    fn tmpfs(dir: &Path, size: &str) -> Mount {
        let opt = format!("size={size}");
        sh(
            "mount",
            &["-t", "tmpfs", "-o", &opt, "tmpfs", dir.to_str().unwrap()],
        );
        Mount(dir.to_path_buf())
    }
    fn read_only(&self, ro: bool) {
        let opt = if ro {
            "remount,bind,ro"
        } else {
            "remount,bind,rw"
        };
        sh("mount", &["-o", opt, self.0.to_str().unwrap()]);
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A fault present at the start, and still while the gateway retries its open: it fails
/// closed, says why (`/readyz`'s reason and detail), and still fails closed after three
/// failed opens, not only at the first.
async fn assert_stays_closed(gw: &Gateway, exec: &MockExecutor, why: &str, k: &str) {
    assert_fails_closed(gw, exec, &format!("{k}-1")).await;
    gw.wait_unready_until(why, |b| {
        b["reason"] == "not_open" && b["detail"].as_str().is_some_and(|d| d.contains(why))
    })
    .await;
    wait_logged(gw, "mutex: cannot open", 3).await;
    assert_fails_closed(gw, exec, &format!("{k}-2")).await;
}

/// Recovered once the fault is gone, without a restart, on the very database that was
/// there: its key still held, and no other file made beside it.
async fn assert_recovers_on(gw: &Gateway, exec: &MockExecutor, state: &Path, held: &str) {
    assert_recovers(gw, exec, &format!("{held}-after")).await;
    assert_eq!(gw.post(&keyed(held), &[]).await.status, 409);
    assert_eq!(names(state), ["mutex.redb", "mutex.redb-journal"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locked_by_another_process() {
    let (exec, setup) = stopped_holding("locked").await;
    let state = setup.dir.path().join("state");
    // Another gateway holds the database (redb's lock on the file).
    let mut holder_setup = Setup::new(None);
    let db = state.join("mutex.redb").display().to_string();
    holder_setup.set("store", "path", db);
    let holder = holder_setup.start();
    holder.wait_ready().await;
    let gw = setup.start();
    // Said as what it is, and what to look for: redb's own words only said "already open".
    assert_stays_closed(&gw, &exec, "another process has it open", "locked").await;
    // The holder goes away: recovery without a restart.
    drop(holder);
    assert_recovers_on(&gw, &exec, &state, "locked").await;
}

/// Two gateways make their first start on one folder at the same moment, four times over:
/// each time exactly one serves, the other fails closed, and one database is left, with no
/// draft beside it. Once the first stops, the second serves by itself, on the same keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_first_starts_on_one_folder_at_once() {
    let exec = MockExecutor::start().await;
    let mut setups = [Setup::new(Some(&exec.url())), Setup::new(Some(&exec.url()))];
    for trial in 0..4 {
        let state = setups[0].dir.path().join(format!("trial{trial}"));
        std::fs::create_dir(&state).unwrap();
        let db = state.join("mutex.redb").display().to_string();
        let cmds = setups
            .each_mut()
            .map(|s| s.set("store", "path", db.clone()).command());
        let cas = [&setups[0].pki.ca_cert, &setups[1].pki.ca_cert];
        let [mut a, mut b] = std::thread::scope(|scope| {
            let mut cas = cas.into_iter();
            cmds.map(|cmd| {
                let ca = cas.next().unwrap();
                scope.spawn(move || Gateway::spawn(cmd, ca))
            })
            .map(|h| h.join().unwrap())
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let (serving, refused) = loop {
            assert!(
                std::time::Instant::now() < deadline,
                "neither serves, trial {trial}"
            );
            let (a_ready, b_ready) = (
                a.admin("GET", "/readyz").await,
                b.admin("GET", "/readyz").await,
            );
            match (a_ready.0, b_ready.0) {
                (200, 200) => panic!("both serve on one database, trial {trial}"),
                (200, _) => break (&mut a, &mut b),
                (_, 200) => break (&mut b, &mut a),
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let k = format!("twice-{trial}");
        assert_fails_closed(refused, &exec, &k).await;
        assert_eq!(serving.post(&keyed(&k), &[]).await.status, 200);
        // The reason may still be an earlier one for a moment (the open in progress).
        refused.wait_unready_because("not_open").await;
        assert_eq!(
            names(&state),
            ["mutex.redb", "mutex.redb-journal"],
            "trial {trial}"
        );
        assert!(serving.terminate().success());
        assert_recovers_on(refused, &exec, &state, &k).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_state_directory() {
    let (exec, setup) = stopped_holding("ro").await;
    let state = setup.dir.path().join("state");
    let mount = Mount::bind(&state);
    mount.read_only(true);
    // `check-config` says so first: a folder the gateway cannot write refuses every trade.
    let check = || {
        let o = Command::new(support::gateway::BIN)
            .args(["check-config", "--config"])
            .arg(setup.config_path())
            .output()
            .unwrap();
        assert!(o.status.success());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    setup.write_config();
    let warning = "cannot be written by this user";
    assert!(check().contains(warning), "{}", check());
    let gw = setup.start();
    assert_stays_closed(&gw, &exec, "Read-only file system", "ro").await;
    mount.read_only(false);
    assert!(!check().contains(warning), "{}", check());
    assert_recovers_on(&gw, &exec, &state, "ro").await;
}

/// A release the owner cannot take, because it began failing closed while the order was
/// out, is not reported as one: the answer says `held`, for a retry will be refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refused_while_failing_closed_is_reported_held() {
    let exec = MockExecutor::start().await;
    let mut setup = Setup::new(Some(&exec.url()));
    setup
        .set("executor", "on_unknown_outcome", "release")
        .set("executor", "timeout", "2s");
    let gw = spawn_with_default_signals(&setup);
    gw.wait_ready().await;
    exec.set_mode(Mode::Hang);
    let trade = keyed("held-1");
    let out = gw.post(&trade, &[]);
    let fault = async {
        // The order is at the executor, so its reserve is on the disk.
        exec.wait_for_calls(1).await;
        // No write can land anywhere now: the next reserve fails closed.
        set_file_size_limit(&gw, 1);
        let r = gw.post(&keyed("held-2"), &[]).await;
        assert_eq!(code(&r.json()), "IDEMPOTENCY_UNAVAILABLE");
    };
    let (r, ()) = tokio::join!(out, fault);
    assert_eq!(code(&r.json()), "EXECUTION_OUTCOME_UNKNOWN");
    assert_eq!(r.header("hoox-idempotency-outcome"), Some("held"));
    set_file_size_limit(&gw, libc::RLIM_INFINITY);
    exec.set_mode(Mode::Success);
    assert_recovers(&gw, &exec, "held-3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_state_directory() {
    let exec = MockExecutor::start().await;
    let mut setup = Setup::new(Some(&exec.url()));
    setup.set("store", "path", "later/mutex.redb");
    let mut gw = setup.start();
    assert_fails_closed(&gw, &exec, "missing-1").await;
    // Stopped so, it says that it closed no database: it never had one.
    assert!(gw.terminate().success(), "{}", gw.stderr());
    let said = gw.stderr();
    assert!(
        said.contains("stopped; the database was not open"),
        "{said}"
    );
    assert!(!said.contains("database closed"), "{said}");
    let gw = setup.start();
    assert_fails_closed(&gw, &exec, "missing-1").await;
    std::fs::create_dir(setup.dir.path().join("later")).unwrap();
    assert_recovers(&gw, &exec, "missing-2").await;
}

/// A database that is not one at the start fails closed; the good copy put back, it serves
/// without a restart, its keys held. A broken file moved aside with nothing to put back
/// leaves no database, and only a start makes one (a process that found a file there once
/// made one itself, as it did for files moved aside to copy them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_file_at_start() {
    let (exec, setup) = stopped_holding("corrupt-0").await;
    let db = setup.dir.path().join("state/mutex.redb");
    let good = setup.dir.path().join("mutex.redb.good");
    std::fs::rename(&db, &good).unwrap();
    let garbage: Vec<u8> = (0..256 * 1024u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&db, &garbage).unwrap();
    let mut gw = setup.start();
    assert_fails_closed(&gw, &exec, "corrupt-1").await;
    std::fs::rename(&good, &db).unwrap();
    assert_recovers(&gw, &exec, "corrupt-2").await;
    assert_eq!(gw.post(&keyed("corrupt-0"), &[]).await.status, 409);
    assert!(gw.terminate().success());

    // A first start's broken file (0.2.0's, say), no journal beside it.
    std::fs::remove_file(setup.dir.path().join("state/mutex.redb-journal")).unwrap();
    std::fs::write(&db, &garbage).unwrap();
    let mut gw = setup.start();
    assert_fails_closed(&gw, &exec, "corrupt-3").await;
    std::fs::rename(&db, setup.dir.path().join("mutex.redb.broken")).unwrap();
    let why = "found it or its journal here since it started";
    wait_logged(&gw, why, 1).await;
    assert_fails_closed(&gw, &exec, "corrupt-4").await;
    assert!(!db.exists(), "an empty database was made");
    assert!(gw.terminate().success());
    let gw = setup.start();
    assert_recovers(&gw, &exec, "corrupt-5").await;
}

/// A gateway that took `held` and was stopped cleanly: its executor, and its setup to
/// start it again on the same state.
async fn stopped_holding(held: &str) -> (MockExecutor, Setup) {
    let exec = MockExecutor::start().await;
    let setup = Setup::new(Some(&exec.url()));
    let mut gw = setup.start();
    gw.wait_ready().await;
    assert_eq!(gw.post(&keyed(held), &[]).await.status, 200);
    assert!(gw.terminate().success());
    (exec, setup)
}

/// Asserts the gateway will not make an empty database in place of `db`, missing for `why`:
/// it says why (log and `/readyz`), fails closed and creates nothing. Then, once `restore`
/// has brought the file back (its result is kept alive until the end), it serves again,
/// with `held` still held.
async fn assert_refused_until_restored<T>(
    gw: &Gateway,
    exec: &MockExecutor,
    (db, why): (&Path, &str),
    restore: impl FnOnce() -> T,
    held: &str,
) -> T {
    wait_logged(gw, why, 1).await;
    gw.wait_unready_until(why, |b| {
        b["detail"]
            .as_str()
            .is_some_and(|d| d.contains(why) && d.contains("restore it"))
    })
    .await;
    assert_fails_closed(gw, exec, &format!("{held}-missing")).await;
    assert!(!db.exists(), "an empty database was made");
    let restored = restore();
    assert_recovers(gw, exec, &format!("{held}-restored")).await;
    assert_eq!(gw.post(&keyed(held), &[]).await.status, 409);
    restored
}

/// The disk is full at the first start (an SD card filled before the install): redb stops
/// midway through making the database. The gateway fails closed, and once space is freed it
/// serves by itself, with no restart and no half-made file for an operator to remove.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_at_the_first_start() {
    let exec = MockExecutor::start().await;
    let setup = Setup::new(Some(&exec.url()));
    let state = setup.dir.path().join("state");
    let _disk = Mount::tmpfs(&state, "4m");
    let filler = state.join("filler");
    let full = std::fs::write(&filler, vec![1u8; 8 << 20]).unwrap_err();
    assert_eq!(full.raw_os_error(), Some(libc::ENOSPC));
    let gw = setup.start();
    assert_fails_closed(&gw, &exec, "full-1").await;
    gw.wait_unready_until("No space left", |b| {
        b["detail"]
            .as_str()
            .is_some_and(|d| d.contains("No space left"))
    })
    .await;
    // Each failed attempt removes its draft: after three, at most the one a retry may be
    // making at this moment is there, and the database's path stays empty.
    wait_logged(&gw, "mutex: cannot open", 3).await;
    let (drafts, left): (Vec<_>, Vec<_>) = names(&state)
        .into_iter()
        .partition(|n| n.starts_with("mutex.redb.new-"));
    assert!(drafts.len() <= 1, "{drafts:?}");
    assert_eq!(left, ["filler"], "a half-made database left");

    std::fs::remove_file(&filler).unwrap();
    assert_recovers(&gw, &exec, "full-2").await;
    assert_eq!(names(&state), ["mutex.redb", "mutex.redb-journal"]);
    assert_eq!(gw.post(&keyed("full-2"), &[]).await.status, 409);
}

/// The database file is gone at start, but its journal is not: a lost database, not a
/// first start. An empty one in its place would forget every live key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_database_is_not_made_again_empty() {
    let (exec, setup) = stopped_holding("lost").await;
    let db = setup.dir.path().join("state/mutex.redb");
    let aside = setup.dir.path().join("mutex.redb.aside");
    std::fs::rename(&db, &aside).unwrap();

    let gw = setup.start();
    let why = "is missing or empty, but its journal is there";
    let restore = || std::fs::rename(&aside, &db).unwrap();
    assert_refused_until_restored(&gw, &exec, (&db, why), restore, "lost").await;
}

/// The files moved aside one at a time under a gateway that failed closed at its start
/// (the journal missing, then the database moved too, to copy or restore the pair): with
/// neither left, it took itself for a first start and served an empty database, retries
/// of held trades included, until the files were back. Only a start makes a database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_moved_aside_one_at_a_time_are_not_a_first_start() {
    let (exec, setup) = stopped_holding("moved").await;
    let state = setup.dir.path().join("state");
    let (db, journal) = (state.join("mutex.redb"), state.join("mutex.redb-journal"));
    let aside = |p: &Path| setup.dir.path().join(p.file_name().unwrap());
    std::fs::rename(&journal, aside(&journal)).unwrap();

    let gw = setup.start();
    wait_logged(&gw, "but the database has used it", 1).await;
    std::fs::rename(&db, aside(&db)).unwrap();
    let why = "found it or its journal here since it started";
    let restore = || {
        std::fs::rename(aside(&db), &db).unwrap();
        std::fs::rename(aside(&journal), &journal).unwrap();
    };
    assert_refused_until_restored(&gw, &exec, (&db, why), restore, "moved").await;
}

/// The journal removed while the gateway runs (`rm`, a cleanup script): the process could
/// write on, to a file no restart would find. It fails closed within a second or so, says
/// the journal is missing, and serves again once the file is back (here its hard link,
/// the same file), with the key it held still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_removed_while_running_fails_closed() {
    let exec = MockExecutor::start().await;
    let setup = Setup::new(Some(&exec.url()));
    let gw = setup.start();
    gw.wait_ready().await;
    assert_eq!(gw.post(&keyed("unlinked"), &[]).await.status, 200);
    let journal = setup.dir.path().join("state/mutex.redb-journal");
    let aside = setup.dir.path().join("journal.aside");
    std::fs::hard_link(&journal, &aside).unwrap();
    std::fs::remove_file(&journal).unwrap();

    let why = "is missing or empty, but the database has used it";
    let restore = || std::fs::hard_link(&aside, &journal).unwrap();
    assert_refused_until_restored(&gw, &exec, (&journal, why), restore, "unlinked").await;
    assert!(gw.stderr().contains("went while open"), "{}", gw.stderr());
}

/// An idle gateway, run without a watchdog (by hand, in a container), looks for its files
/// once a second all the same: a turn of its owner is when it looks, and its supervisor's
/// pings are the turns an idle owner takes. They came every 5 s, so `/readyz` and `status`
/// could say "serving" for seconds after the database or journal was removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_gateway_without_a_watchdog_looks_once_a_second() {
    let setup = Setup::new(None);
    let gw = setup.start();
    gw.wait_ready().await;
    let turns = async || {
        let (_, m) = gw.admin("GET", "/metrics").await;
        m.as_str()
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("hoox_mutex_batch_size_count "))
            .and_then(|v| v.parse::<u64>().ok())
            .expect("the owner's turns in /metrics")
    };
    let before = turns().await;
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let pinged = turns().await - before;
    // 3 or 4 pings at once a second; at most one at the old 5 s.
    assert!(pinged >= 2, "{pinged} turns in 3.5 s of idling");
    // And each such turn looks: the journal removed, `/readyz` says so within a look
    // (0.9 s) after a ping (1 s), ~2 s; 5 s here, for a busy machine. Looks spaced 10 s
    // apart left it "serving" for 10 s.
    std::fs::remove_file(setup.dir.path().join("state/mutex.redb-journal")).unwrap();
    assert!(
        readyz_is_within(gw.admin_listen(), 503, Duration::from_secs(5)).await,
        "still ready 5 s after the journal went"
    );
}

/// The journal replaced by a file of its length that holds none of its records (zeros, a
/// blank file made again, another database's journal copied in) beside a database whose
/// checkpoint has moved: refused, as an empty one is, and served again once the journal is
/// back. It was opened as a journal with nothing to replay: every key reserved since the
/// last checkpoint forgotten, and sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_of_zeros_or_of_another_database_is_refused() {
    let exec = MockExecutor::start().await;
    let setup = Setup::new(Some(&exec.url()));
    let mut gw = setup.start();
    gw.wait_ready().await;
    assert_eq!(gw.post(&keyed("checkpointed"), &[]).await.status, 200);
    assert!(gw.terminate().success());
    // Another database's journal, to copy in.
    let other = Setup::new(Some(&exec.url()));
    let mut o = other.start();
    o.wait_ready().await;
    assert_eq!(o.post(&keyed("elsewhere"), &[]).await.status, 200);
    assert!(o.terminate().success());
    // A key in a record past the checkpoint, the gateway killed before the next.
    let mut gw = setup.start();
    gw.wait_ready().await;
    assert_eq!(gw.post(&keyed("in-the-journal"), &[]).await.status, 200);
    gw.kill9();
    let journal = setup.dir.path().join("state/mutex.redb-journal");
    let aside = setup.dir.path().join("journal.aside");
    std::fs::rename(&journal, &aside).unwrap();
    let len = std::fs::metadata(&aside).unwrap().len() as usize;
    let foreign = other.dir.path().join("state/mutex.redb-journal");
    let why = "holds no record of the database";
    for put in [vec![0u8; len], std::fs::read(&foreign).unwrap()] {
        std::fs::write(&journal, &put).unwrap();
        let mut gw = setup.start();
        wait_logged(&gw, why, 1).await;
        gw.wait_unready_until(why, |b| {
            b["detail"]
                .as_str()
                .is_some_and(|d| d.contains(why) && d.contains("Restore its own journal"))
        })
        .await;
        assert_fails_closed(&gw, &exec, "in-the-journal").await;
        assert!(gw.terminate().success());
    }
    std::fs::rename(&aside, &journal).unwrap();
    let gw = setup.start();
    gw.wait_ready().await;
    for held in ["in-the-journal", "checkpointed"] {
        assert_eq!(gw.post(&keyed(held), &[]).await.status, 409, "{held}");
    }
    assert_eq!(exec.calls(), 3);
}

/// The state directory's disk fails and goes while the gateway runs (a USB disk on a Pi,
/// unplugged), leaving the empty mount point. Both files are gone, as at a first start, but
/// this process had them open: no empty database on the wrong disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_gone_mid_run_is_not_replaced_by_an_empty_database() {
    use eiofs::{EioMount, Fault};
    let exec = MockExecutor::start().await;
    let setup = Setup::new(Some(&exec.url()));
    let state = setup.dir.path().join("state");
    let (backing, disk) = failing_state(&setup);
    let gw = setup.start();
    gw.wait_ready().await;
    assert_eq!(gw.post(&keyed("gone"), &[]).await.status, 200);
    // The readiness probe makes the owner write what it carries first, so the reserve
    // below is refused by its own write failing, not by a commit still carried.
    gw.wait_ready().await;
    disk.fail(Fault::WritesAndSyncs);
    assert_eq!(gw.post(&keyed("gone-failing"), &[]).await.status, 503);
    drop(disk);

    let db = state.join("mutex.redb");
    let why = "is missing or empty, but it was open";
    let remount = || EioMount::new(&state, backing.path());
    let _disk = assert_refused_until_restored(&gw, &exec, (&db, why), remount, "gone").await;
}

/// A stop whose database cannot be brought up to date says so and exits 74 (EX_IOERR): it
/// said "database closed" (or "was not open") and exited 0, and systemd showed a clean
/// stop, which an operator about to downgrade relies on. Both ways: the disk fails the
/// final checkpoint, or a trade's write first, the gateway failing closed at the stop.
/// Nothing synced is lost: the next start replays the journal, and the key is still held.
/// A clean stop after it exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_that_cannot_close_the_database_says_so_and_exits_74() {
    use eiofs::Fault;
    let exec = MockExecutor::start().await;
    let setup = Setup::new(Some(&exec.url()));
    let (_backing, disk) = failing_state(&setup);
    for (key, why) in [
        ("at-the-stop", "(final checkpoint: "),
        ("failing", "(failing closed: "),
    ] {
        let mut gw = setup.start();
        gw.wait_ready().await;
        assert_eq!(gw.post(&keyed(key), &[]).await.status, 200);
        // The probe makes the owner write its carried commit: the next write is the
        // first to fail.
        gw.wait_ready().await;
        disk.fail(Fault::WritesAndSyncs);
        if key == "failing" {
            assert_eq!(gw.post(&keyed("refused"), &[]).await.status, 503);
        }
        let status = gw.terminate();
        let log = gw.stderr();
        assert_eq!(status.code(), Some(74), "{key}: {log}");
        let said = format!("stopped; the database was NOT closed cleanly {why}");
        assert!(log.contains(&said), "{key}: {log}");
        assert!(!log.contains("stopped; database closed"), "{key}: {log}");
        assert!(!log.contains("was not open"), "{key}: {log}");
        disk.fail(Fault::None);
    }
    let mut gw = setup.start();
    gw.wait_ready().await;
    for key in ["at-the-stop", "failing"] {
        assert_eq!(gw.post(&keyed(key), &[]).await.status, 409, "{key}");
    }
    assert_eq!(exec.calls(), 2);
    let status = gw.terminate();
    assert_eq!(status.code(), Some(0), "{}", gw.stderr());
    assert!(gw.stderr().contains("stopped; database closed"));
    drop(gw);
}

/// A stop while the owner is stalled says what it waits for, and not "starting: opening
/// the database", the first open's words (readiness is cleared at the stop, and that was
/// all the status went by); it stops once the stall ends, the database closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_the_owner_is_stalled_says_what_it_waits_for() {
    let setup = Setup::new(None);
    let mut gw = setup.start_with(&[(hoox_edge::app::STALL_HOOK_ENV, "1")]);
    gw.wait_ready().await;
    let (s, _) = gw.admin("POST", "/debug/stall?ms=5000").await;
    assert_eq!(s, 200);
    // A trade in the drain, waiting on the owner until its deadline: the supervisor's
    // ping times out after readiness was cleared.
    let (client, url) = (gw.client.clone(), gw.url());
    let body = keyed("stalled-at-stop").to_string();
    let refused =
        tokio::spawn(async move { client.request(hyper::Method::POST, &url, &[], body).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = gw.terminate();
    let log = gw.stderr();
    assert!(status.success(), "{status:?}: {log}");
    assert_eq!(refused.await.unwrap().status, 503, "{log}");
    assert!(!log.contains("starting: opening the database"), "{log}");
    let waits = "stopping: waiting for the mutex's owner to close the database";
    assert!(log.contains(waits), "{log}");
    assert!(log.contains("stopped; database closed"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_stalled() {
    let exec = MockExecutor::start().await;
    let setup = Setup::new(Some(&exec.url()));
    let gw = setup.start_with(&[(hoox_edge::app::STALL_HOOK_ENV, "1")]);
    gw.wait_ready().await;
    let (s, _) = gw.admin("POST", "/debug/stall?ms=8000").await;
    assert_eq!(s, 200);
    assert_fails_closed(&gw, &exec, "stall-1").await;
    assert_recovers(&gw, &exec, "stall-2").await;
    // The refused trade's retry runs: the owner granted its reserve after the gateway had
    // given up on it, and released it rather than leave it pending for its TTL.
    assert_recovers(&gw, &exec, "stall-1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_size_limit_mid_run() {
    let exec = MockExecutor::start().await;
    let setup = Setup::new(Some(&exec.url()));
    let mut gw = spawn_with_default_signals(&setup);
    gw.wait_ready().await;
    assert_eq!(gw.post(&keyed("fsize-0"), &[]).await.status, 200);

    // Cap the file below where it stands: a commit that writes past the cap fails.
    let db = setup.dir.path().join("state/mutex.redb");
    let size = std::fs::metadata(&db).unwrap().len();
    let set_limit = |cur: u64| set_file_size_limit(&gw, cur);
    set_limit(size / 2);
    let mut accepted = vec!["fsize-0".to_string()];
    let mut refused = false;
    for i in 0..200 {
        let k = format!("fsize-{i}-{}", "p".repeat(200));
        let r = gw.post(&keyed(&k), &[]).await;
        match r.status.as_u16() {
            200 => accepted.push(k),
            503 => {
                assert_eq!(code(&r.json()), "IDEMPOTENCY_UNAVAILABLE");
                refused = true;
                break;
            }
            s => panic!("unexpected {s}: {:?}", r.json()),
        }
    }
    assert!(refused, "the file-size limit was never hit");
    // While the limit stays, the fault stays: every trade refused, none forwarded.
    for i in 0..3 {
        assert_fails_closed(&gw, &exec, &format!("fsize-held-{i}")).await;
    }
    // Exactly the accepted trades were forwarded: nothing refused reached the executor.
    assert_eq!(exec.calls(), accepted.len());
    // The keys it held are still counted (by the index it had, or, once a reopen has read
    // the database again, by that): a gateway failing closed that said it held none would
    // invite the removal of its state files.
    let (_, status) = gw.admin("GET", "/status").await;
    assert_eq!(status["live_keys"], accepted.len(), "{status}");

    // The limit is lifted: service resumes by itself, and every accepted key is still
    // held: by the running process, and on disk, read back after a SIGKILL.
    set_limit(libc::RLIM_INFINITY);
    assert_recovers(&gw, &exec, "fsize-after").await;
    let calls = exec.calls();
    for round in ["running", "restarted after SIGKILL"] {
        for k in &accepted {
            let r = gw.post(&keyed(k), &[]).await;
            assert_eq!(r.status, 409, "{round}: {k} {:?}", r.json());
        }
        if round == "running" {
            gw.kill9();
            gw = spawn_with_default_signals(&setup);
            gw.wait_ready().await;
        }
    }
    assert_eq!(exec.calls(), calls);
}

/// Waits (at most 10 s) until the gateway has logged `needle` `times` times in all.
async fn wait_logged(gw: &Gateway, needle: &str, times: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        if gw.stderr().matches(needle).count() >= times {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "never logged {needle:?} {times} times; stderr:\n{}",
        gw.stderr()
    );
}

/// A disk that starts failing: every write and sync returns EIO. Then one whose writes land
/// but whose syncs fail, so that the writer cannot know what reached the disk; the
/// reserve refused then must not hold its key once the disk is back. Last, the same with
/// the journal's writes failing when the database opens again: the reopen cannot free
/// that key yet, so it keeps failing closed, and frees it at the next. Last, a file system
/// the kernel turned read-only after errors: every write, sync and create fails with
/// EROFS. (A read-only bind remount, as at the first start, cannot be made under a running
/// gateway: the kernel refuses it with EBUSY while files are open for writing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_io_errors_mid_run() {
    use eiofs::Fault;
    let exec = MockExecutor::start().await;
    let setup = Setup::new(Some(&exec.url()));
    let (_backing, disk) = failing_state(&setup);
    let gw = setup.start();
    gw.wait_ready().await;
    assert_eq!(gw.post(&keyed("eio-0"), &[]).await.status, 200);

    let phases = [
        (Fault::WritesAndSyncs, None),
        (Fault::Syncs, None),
        (Fault::Syncs, Some(Fault::JournalWrites)),
        (Fault::ReadOnly, None),
    ];
    for (n, (fault, at_reopen)) in phases.into_iter().enumerate() {
        // The readiness probe asks the owner, which first writes what it carries (the
        // last trade's commit): the reserve below makes the first write the fault meets.
        gw.wait_ready().await;
        let failed_writes = gw.stderr().matches("mutex: write failed").count();
        let calls = exec.calls();
        disk.fail(fault);
        let refused = format!("eio-{n}-refused");
        let r = gw.post(&keyed(&refused), &[]).await;
        assert_eq!(r.status, 503, "{fault:?}: {:?}", r.json());
        assert_eq!(code(&r.json()), "IDEMPOTENCY_UNAVAILABLE");
        wait_logged(&gw, "mutex: write failed", failed_writes + 1).await;
        assert_eq!(
            gw.stderr().matches("mutex: write failed").count(),
            failed_writes + 1,
            "{fault:?}: the reserve's own write was not the one that failed"
        );
        assert_fails_closed(&gw, &exec, &format!("eio-{n}-while")).await;
        assert_eq!(
            exec.calls(),
            calls,
            "{fault:?}: a trade reached the executor"
        );

        if let Some(f) = at_reopen {
            // The database opens, but the record that frees the refused key cannot be
            // written: still closed, and the key is kept to free at the next reopen.
            disk.fail(f);
            wait_logged(&gw, "cannot free the keys of a failed write", 1).await;
            assert_fails_closed(&gw, &exec, &format!("eio-{n}-reopening")).await;
        }
        disk.fail(Fault::None);
        assert_recovers(&gw, &exec, &format!("eio-{n}-after")).await;
        // The operator is told it is over, though the reopen's first write (freeing the
        // refused trade's key) resets the backoff the line was keyed on.
        wait_logged(&gw, "mutex: database reopened", n + 1).await;
        // What was accepted before the fault is still held.
        assert_eq!(gw.post(&keyed("eio-0"), &[]).await.status, 409);
        // The trade refused when the disk failed was never sent: its retry goes through,
        // even where its record reached the disk (Fault::Syncs).
        let calls = exec.calls();
        let r = gw.post(&keyed(&refused), &[]).await;
        assert_eq!(
            r.status,
            200,
            "{fault:?}: the refused trade's retry: {:?}",
            r.json()
        );
        assert_eq!(exec.calls(), calls + 1);
        assert_eq!(gw.post(&keyed(&refused), &[]).await.status, 409);
    }
}

/// A box without a real-time clock serves before NTP sets its clock, crashes, and starts
/// again after NTP stepped the clock an hour forward: the trade it took in its first life
/// is still held, and its retry is refused. Keys expire by the wall clock across a
/// restart, which now says the key is long expired; the entry's deadline on the boot clock
/// (`CLOCK_BOOTTIME`, in the same boot) holds it. The first life's wall clock is shifted
/// back an hour by a preloaded shim (`support/wallshift.c`); the boot clock is the real one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_set_by_ntp_between_a_crash_and_the_restart_frees_no_key() {
    let exec = MockExecutor::start().await;
    let setup = Setup::new(Some(&exec.url()));
    let mut gw = shifted(&setup, -3600);
    gw.wait_ready().await;
    let r = gw.post(&keyed("before-ntp"), &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    gw.kill9();

    let gw = setup.start();
    gw.wait_ready().await;
    let r = gw.post(&keyed("before-ntp"), &[]).await;
    let v = r.json();
    assert_eq!(r.status, 409, "{v}");
    assert_eq!(code(&v), "DUPLICATE");
    // Seconds old, with most of its TTL left, by the boot clock.
    let (age, left) = (
        v["age_ms"].as_u64().unwrap(),
        v["expires_in_ms"].as_u64().unwrap(),
    );
    assert!(
        age < 100_000 && (200_000..=300_000).contains(&left),
        "{age}, {left} ms"
    );
    assert_eq!(exec.calls(), 1, "the retry reached the executor");
    // Stored an hour ago by the wall clock: the shim did shift the first life's clock.
    let (status, entry) = gw.admin("GET", "/keys/client:psk:live:before-ntp").await;
    assert_eq!(status, 200, "{entry}");
    // The admin API tells the same: held, for most of its TTL.
    assert!(
        entry["expires_in_ms"].as_u64().unwrap() >= left - 5_000,
        "{entry}"
    );
    assert!(entry["age_ms"].as_u64().unwrap() <= age + 5_000, "{entry}");
    let stored_at = entry["stored_at"].as_u64().unwrap();
    let behind = hoox_edge::mutex::clock::unix_ms().abs_diff(stored_at);
    assert!(
        behind.abs_diff(3_600_000 + age) < 5_000,
        "stored {behind} ms ago, age {age} ms"
    );
}

/// The gateway of `setup`, its wall clock shifted by `seconds` through a preloaded shim
/// (`support/wallshift.c`, built here with `cc`); its boot clock is the real one.
fn shifted(setup: &Setup, seconds: i64) -> Gateway {
    let shim = setup.dir.path().join("libwallshift.so");
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/wallshift.c");
    sh(
        "cc",
        &[
            "-shared",
            "-fPIC",
            "-O2",
            "-o",
            shim.to_str().unwrap(),
            source,
            "-ldl",
        ],
    );
    let mut cmd = setup.command();
    cmd.env("LD_PRELOAD", &shim)
        .env("WALLSHIFT_SECONDS", seconds.to_string());
    Gateway::spawn(cmd, &setup.pki.ca_cert)
}

/// The other way: a clock a year ahead (a bad time server, a clock set by hand) when a
/// trade is taken, set right before the restart. The key is held for its TTL by its
/// deadline on the boot clock, not for the year the wall clock says is left: held so,
/// each key taken in that hour kept its place under `limits.capacity` for a year.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_taken_under_a_clock_a_year_ahead_is_free_after_its_ttl() {
    let exec = MockExecutor::start().await;
    let mut setup = Setup::new(Some(&exec.url()));
    setup.set("store", "ttl", "5s");
    let mut gw = shifted(&setup, 365 * 24 * 3600);
    gw.wait_ready().await;
    let r = gw.post(&keyed("ahead"), &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert!(gw.terminate().success());

    let gw = setup.start();
    gw.wait_ready().await;
    let r = gw.post(&keyed("ahead"), &[]).await;
    let v = r.json();
    assert_eq!(r.status, 409, "{v}");
    assert_eq!(code(&v), "DUPLICATE");
    let left = v["expires_in_ms"].as_u64().unwrap();
    assert!(left <= 5_000, "held {left} ms more");
    tokio::time::sleep(Duration::from_millis(left + 100)).await;
    let r = gw.post(&keyed("ahead"), &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert_eq!(exec.calls(), 2);
}

/// The volatile disk itself: until a power cut a reader sees every write, and after it
/// only what was synced. What the power-cut test below relies on.
#[test]
fn a_volatile_disk_keeps_only_what_was_synced() {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let (mnt, backing) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let disk = eiofs::EioMount::new_volatile(mnt.path(), backing.path());
    let (synced, written) = (mnt.path().join("synced"), mnt.path().join("written"));
    let mut f = std::fs::File::create(&synced).unwrap();
    f.write_all(b"kept").unwrap();
    f.sync_data().unwrap();
    f.write_all_at(b"lost", 8).unwrap();
    std::fs::write(&written, b"gone").unwrap();
    assert_eq!(std::fs::read(&synced).unwrap(), b"kept\0\0\0\0lost");
    assert_eq!(std::fs::read(&written).unwrap(), b"gone");
    assert_eq!(std::fs::read(backing.path().join("written")).unwrap(), b"");
    // A truncate and a regrowth read zeros where the cut bytes were, on disk or not.
    f.set_len(2).unwrap();
    f.set_len(6).unwrap();
    assert_eq!(std::fs::read(&synced).unwrap(), b"ke\0\0\0\0");
    drop(f);
    disk.power_cut();
    assert_eq!(std::fs::read(&synced).unwrap(), b"kept");
    assert_eq!(std::fs::read(&written).unwrap(), b"");
}

/// `hoox_mutex_checkpoint_seconds_count`: the checkpoints the owner took.
async fn checkpoints(gw: &Gateway) -> u64 {
    let (_, m) = gw.admin("GET", "/metrics").await;
    let m = m.as_str().unwrap_or_default();
    m.lines()
        .find_map(|l| l.strip_prefix("hoox_mutex_checkpoint_seconds_count "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no checkpoint count in {m}"))
}

/// Five trades keyed `{tag}-…`, one alone, then four at once (a batch under one sync),
/// each answered 200: their keys.
async fn one_then_four(gw: &Gateway, tag: &str) -> [String; 5] {
    let ks = ["one", "a", "b", "c", "d"].map(|s| format!("{tag}-{s}"));
    let ts = ks.each_ref().map(|k| keyed(k));
    let one = gw.post(&ts[0], &[]).await;
    let (a, b, c, d) = tokio::join!(
        gw.post(&ts[1], &[]),
        gw.post(&ts[2], &[]),
        gw.post(&ts[3], &[]),
        gw.post(&ts[4], &[]),
    );
    for (k, r) in ks.iter().zip([one, a, b, c, d]) {
        assert_eq!(r.status, 200, "{k}: {:?}", r.json());
    }
    ks
}

/// A crash, then a power cut before the restart: the disk loses every write it held in its
/// cache (`support/eiofs.rs`, volatile), as a SIGKILL alone never does. Every key that got
/// a 200 is still held after it: its reserve was on the disk before the answer, not only
/// in a cache. Twice: the journal syncs a record with an O_DSYNC write where the file
/// system takes O_DIRECT, and with fdatasync where it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_cut_loses_no_key_that_got_a_2xx() {
    power_cut_after_trades(true).await;
    power_cut_after_trades(false).await;
}

/// The folder a volatile disk keeps its synced writes in, and the disk, which takes O_DIRECT
/// or not, mounted on `setup`'s state folder. Dropped in the other order: the disk first.
/// The setup's state folder on a disk that fails on command (`eiofs`), its files kept in
/// the returned folder.
fn failing_state(setup: &Setup) -> (tempfile::TempDir, eiofs::EioMount) {
    let backing = tempfile::tempdir().unwrap();
    let disk = eiofs::EioMount::new(&setup.dir.path().join("state"), backing.path());
    (backing, disk)
}

fn volatile_state(setup: &Setup, direct_io: bool) -> (tempfile::TempDir, eiofs::EioMount) {
    let backing = tempfile::tempdir().unwrap();
    let disk = eiofs::EioMount::new_volatile(&setup.dir.path().join("state"), backing.path());
    if !direct_io {
        disk.refuse_direct_io();
    }
    (backing, disk)
}

/// SIGKILL, then the power cut, once the journal has synced the way the run is about.
fn crash_and_cut(gw: &mut Gateway, disk: &eiofs::EioMount, direct_io: bool) {
    let dsync = disk.dsync_writes();
    assert_eq!(dsync > 0, direct_io, "{dsync} O_DSYNC writes");
    gw.kill9();
    disk.power_cut();
}

async fn power_cut_after_trades(direct_io: bool) {
    let exec = MockExecutor::start().await;
    let setup = Setup::new(Some(&exec.url()));
    let (_backing, disk) = volatile_state(&setup, direct_io);
    let mut gw = setup.start();
    gw.wait_ready().await;
    // A first start makes the database and its journal: names in the state folder, which
    // a power cut may take back unless the folder is synced (this disk keeps a folder's
    // changes at once, so it counts the syncs rather than lose the names).
    let syncs = disk.dir_syncs();
    assert!(
        syncs >= 1,
        "{syncs} syncs of the state folder at a first start"
    );
    let mut accepted = Vec::new();
    for round in 0..40 {
        accepted.extend(one_then_four(&gw, &format!("cut-{round}")).await);
    }
    // A checkpoint puts every record before it in the database, synced or not: the last
    // trades come after one (an idle owner takes one every 128 records or so), so that
    // their reserves are in the journal alone, and only its syncs put them on the disk.
    let seen = checkpoints(&gw).await;
    for n in 0.. {
        if checkpoints(&gw).await > seen {
            break;
        }
        assert!(n < 200, "no checkpoint in {n} trades");
        let k = format!("cut-until-{n}");
        assert_eq!(gw.post(&keyed(&k), &[]).await.status, 200);
        accepted.push(k);
    }
    let last = checkpoints(&gw).await;
    for round in 0..4 {
        accepted.extend(one_then_four(&gw, &format!("cut-last-{round}")).await);
    }
    assert_eq!(
        checkpoints(&gw).await,
        last,
        "the last trades were checkpointed"
    );
    assert_eq!(exec.calls(), accepted.len());
    crash_and_cut(&mut gw, &disk, direct_io);

    let gw = setup.start();
    gw.wait_ready().await;
    let mut lost = Vec::new();
    for k in &accepted {
        let r = gw.post(&keyed(k), &[]).await;
        if (r.status.as_u16(), code(&r.json()).as_str()) != (409, "DUPLICATE") {
            lost.push(format!("{k}: {} {}", r.status, r.json()));
        }
    }
    assert!(
        lost.is_empty(),
        "direct I/O {direct_io}: {} of {} keys answered 200 were lost in the power cut, \
         first {:#?}",
        lost.len(),
        accepted.len(),
        &lost[..lost.len().min(3)]
    );
    assert_eq!(
        exec.calls(),
        accepted.len(),
        "direct I/O {direct_io}: a retry reached the executor"
    );
}

/// The same, with the power going at the moment the executor has the order: the reserve
/// was on the disk before its order left, not only by the time of a kill a moment later.
/// Syncs take 200 ms here, so a gateway that answered before its sync would forward the
/// trade while the sync is still on its way, and lose the key with it. Again with O_DIRECT
/// and without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_cut_as_the_order_arrives_loses_no_key() {
    power_cut_as_the_order_arrives(true).await;
    power_cut_as_the_order_arrives(false).await;
}

async fn power_cut_as_the_order_arrives(direct_io: bool) {
    let exec = MockExecutor::start().await;
    // Held at the executor: nothing of this trade is written after its order left.
    exec.set_mode(Mode::Slow(Duration::from_secs(5)));
    let mut setup = Setup::new(Some(&exec.url()));
    setup.set("executor", "timeout", "10s");
    let (_backing, disk) = volatile_state(&setup, direct_io);
    let mut gw = setup.start();
    gw.wait_ready().await;
    disk.delay_syncs(Duration::from_millis(200));
    let t = keyed(&format!("at-the-order-{direct_io}"));
    let (client, url, body) = (gw.client.clone(), gw.url(), t.to_string());
    let order =
        tokio::spawn(async move { client.request(hyper::Method::POST, &url, &[], body).await });
    exec.wait_for_calls(1).await;
    disk.freeze();
    crash_and_cut(&mut gw, &disk, direct_io);
    order.abort();

    let gw = setup.start();
    gw.wait_ready().await;
    let r = gw.post(&t, &[]).await;
    assert_eq!(
        (r.status.as_u16(), code(&r.json()).as_str()),
        (409, "DUPLICATE"),
        "direct I/O {direct_io}: the forwarded trade's key was lost: {:?}",
        r.json()
    );
    assert_eq!(exec.calls(), 1, "direct I/O {direct_io}: forwarded twice");
}

/// Sets this process's RLIMIT_NPROC (soft and hard) to `limit`: for a child, before exec.
fn nproc(limit: u64) -> std::io::Result<()> {
    let l = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    match unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &l) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// The threads of the user `uid`, over every process: what RLIMIT_NPROC counts.
fn threads_of_user(uid: u32) -> u64 {
    let mut n = 0;
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            let real = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().next()?.parse::<u32>().ok());
            n += u64::from(real == Some(uid));
        }
    }
    n
}

/// A limit on threads reached while the gateway runs (systemd's TasksMax or LimitNPROC, a
/// container's pids limit): it needs no new thread to place an order with a named executor
/// (hyper's DNS lookup runs on tokio's blocking pool) nor to close the database at a stop.
/// It aborted at both once its blocking threads had been idle 10 s: at the order with its
/// key reserved and nothing sent, the trade held as unknown after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_on_threads_reached_while_serving_neither_loses_an_order_nor_the_close() {
    const NOBODY: u32 = 65534;
    let exec = MockExecutor::start().await;
    let setup = Setup::new(Some(&exec.url_localhost()));
    // Everything the gateway reads or writes, made its own.
    setup.give_to(NOBODY);
    // The user's threads now, the gateway's main thread, its one worker and the mutex's
    // owner; one blocking thread more (the fixed gateway keeps one) and one for slack.
    let limit = threads_of_user(NOBODY) + 5;
    let mut cmd = setup.command();
    // An unprivileged user: root is not held to RLIMIT_NPROC.
    cmd.uid(NOBODY).gid(NOBODY).env("TOKIO_WORKER_THREADS", "1");
    unsafe { cmd.pre_exec(move || nproc(limit)) };
    // At start, a limit that leaves no thread for the mutex's owner, or none for the
    // blocking pool's kept one, is said, and exit 71.
    for short in [limit - 3, limit - 2] {
        let mut cmd = setup.command();
        cmd.uid(NOBODY).gid(NOBODY).env("TOKIO_WORKER_THREADS", "1");
        unsafe { cmd.pre_exec(move || nproc(short)) };
        let o = cmd.output().unwrap();
        let said = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(71), "{short}: {said}");
        assert!(said.contains("cannot start a thread"), "{said}");
    }

    let mut gw = Gateway::spawn(cmd, &setup.pki.ca_cert);
    gw.wait_ready().await;
    // Past the 10 s tokio keeps an idle blocking thread by default; then the user's other
    // processes take what the limit leaves.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let mut others: Vec<_> = (0..2)
        .map(|_| {
            let mut sleep = Command::new("sleep");
            sleep.arg("60").uid(NOBODY).gid(NOBODY);
            sleep.spawn().unwrap()
        })
        .collect();

    let r = gw.post(&trade("BTCUSDT"), &[]).await;
    let status = gw.terminate();
    for o in &mut others {
        let _ = o.kill();
        let _ = o.wait();
    }
    assert_eq!(r.status, 200, "{:?}\n{}", r.body, gw.stderr());
    assert_eq!(exec.calls(), 1);
    assert!(status.success(), "{status}: {}", gw.stderr());
    assert!(
        gw.stderr().contains("stopped; database closed"),
        "{}",
        gw.stderr()
    );
}

/// Under umask 000 (a hand-run start, another init), the database and its journal are
/// still the gateway's user's alone: others that may write them may put an empty database
/// in place, which frees every live key at the next start. They were made 0666.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_is_made_for_its_user_alone_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    // The gateway of `setup`, started under umask 000, and its files' modes once it is ready.
    async fn modes_under_umask_0(setup: &Setup, files: &[PathBuf]) -> Vec<u32> {
        let mut cmd = setup.command();
        unsafe {
            cmd.pre_exec(|| {
                libc::umask(0);
                Ok(())
            })
        };
        let mut gw = Gateway::spawn(cmd, &setup.pki.ca_cert);
        gw.wait_ready().await;
        let modes = files
            .iter()
            .map(|f| std::fs::metadata(f).unwrap().permissions().mode());
        let modes = modes.map(|m| m & 0o777).collect();
        assert!(gw.terminate().success());
        modes
    }
    let setup = Setup::new(None);
    let db = setup.dir.path().join("state/mutex.redb");
    let journal = PathBuf::from(format!("{}-journal", db.display()));
    assert_eq!(
        modes_under_umask_0(&setup, &[db, journal]).await,
        [0o600, 0o600]
    );

    // Made in place, not through a draft: `store.path` a link to a file not there yet.
    let mut setup = Setup::new(None);
    let target = setup.dir.path().join("state/target.redb");
    let link = setup.dir.path().join("state/link.redb");
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&target, &link).unwrap();
    setup.set("store", "path", link.to_str().unwrap());
    assert_eq!(modes_under_umask_0(&setup, &[target]).await, [0o600]);
}

/// A slow disk (an SD card wear-levelling) is waited for as long as `store.timeout` says:
/// here every journal record takes 3 s to be on disk. Within the deadline set, the reserve
/// waits it out and the trade goes through; past it, the webhook is refused 503, after no
/// less than the deadline and nothing sent (the default, 2 s, is past it too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_disk_is_waited_for_as_long_as_store_timeout() {
    let secs = Duration::from_secs;
    let cases = [
        (Some("300ms"), 503, Duration::from_millis(300)..secs(2)),
        (None, 503, secs(2)..secs(60)),
        (Some("5s"), 200, secs(3)..secs(60)),
    ];
    for (timeout, status, took_within) in cases {
        let exec = MockExecutor::start().await;
        let mut setup = Setup::new(Some(&exec.url()));
        if let Some(t) = timeout {
            setup.set("store", "timeout", t);
        }
        let (_backing, disk) = volatile_state(&setup, true);
        let delay = delay_for_a_synced_write_of(&setup.dir.path().join("state"), &disk, secs(3));
        let gw = setup.start();
        gw.wait_ready().await;
        disk.delay_syncs(delay);
        let t0 = std::time::Instant::now();
        let r = gw.post(&keyed(&format!("slow-{status}")), &[]).await;
        let took = t0.elapsed();
        // The release of a reserve granted after its caller gave up is a write too.
        disk.delay_syncs(Duration::ZERO);
        let at = format!("store.timeout {timeout:?}: {} after {took:?}", r.status);
        assert_eq!(r.status, status, "{at}: {:?}", r.json());
        assert!(took_within.contains(&took), "{at}, want {took_within:?}");
        if status == 503 {
            assert_eq!(code(&r.json()), "IDEMPOTENCY_UNAVAILABLE", "{at}");
            let detail = r.json()["detail"].as_str().unwrap_or("").to_string();
            assert!(detail.contains("timeout"), "{at}: {detail}");
        }
        assert_eq!(exec.calls(), usize::from(status == 200), "{at}");
    }
}

/// The delay of each sync on `disk` (mounted at `dir`) under which one record written as
/// the journal writes it (4 KiB, `O_DIRECT | O_DSYNC`) takes `want`. Through FUSE such a
/// write is a write and then, on most kernels, a sync of its own, each delayed: measured
/// here rather than assumed.
fn delay_for_a_synced_write_of(dir: &Path, disk: &eiofs::EioMount, want: Duration) -> Duration {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let path = dir.join("probe");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
        .open(&path)
        .unwrap();
    let buf = vec![7u8; 8192];
    let at = buf.as_ptr().align_offset(4096);
    let probe = Duration::from_millis(500);
    disk.delay_syncs(probe);
    let t0 = std::time::Instant::now();
    file.write_all_at(&buf[at..at + 4096], 0).unwrap();
    let took = t0.elapsed();
    disk.delay_syncs(Duration::ZERO);
    drop(file);
    std::fs::remove_file(&path).unwrap();
    let syncs = (took.as_secs_f64() / probe.as_secs_f64()).floor() as u32;
    assert!((1..=2).contains(&syncs), "a synced write took {took:?}");
    want / syncs
}
