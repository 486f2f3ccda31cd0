//! Real OS faults. Each must end in Unavailable (never a Proceed that is not durable),
//! and service must resume by itself once the fault is removed.
//!
//! These tests need root (they mount small tmpfs filesystems); as root, `chmod` does not
//! stop writes, so a read-only state directory is a tmpfs remounted read-only.

mod mutex_support;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hoox_edge::mutex::{Clock, Decision, Unavailable};
use mutex_support::*;

/// A tmpfs mounted for the length of a test; unmounted (lazily, so a failing test still
/// cleans up) on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, opts: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        sh(
            "mount",
            &["-t", "tmpfs", "-o", opts, "tmpfs", dir.to_str().unwrap()],
        );
        Tmpfs(dir.to_path_buf())
    }

    fn remount(&self, opts: &str) {
        sh(
            "mount",
            &["-o", &format!("remount,{opts}"), self.0.to_str().unwrap()],
        );
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn sh(cmd: &str, args: &[&str]) {
    let st = Command::new(cmd).args(args).status().unwrap();
    assert!(
        st.success(),
        "{cmd} {args:?} failed (these tests need root)"
    );
}

fn unavailable(d: &Decision) -> bool {
    matches!(
        d,
        Decision::Unavailable(Unavailable::NotOpen(_) | Unavailable::CommitFailed(_))
    )
}

/// Reserves fresh keys until the mutex serves again.
async fn wait_recovered(m: &hoox_edge::mutex::Mutex, prefix: &str) -> bool {
    let mut n = 0;
    eventually(Duration::from_secs(10), async || {
        n += 1;
        matches!(
            m.reserve(reserve(&key(&format!("{prefix}-{n}")), 3_600_000, 1))
                .await,
            Decision::Proceed(_)
        )
    })
    .await
}

/// Every key in `granted` must still be held in the file at `path`.
fn assert_all_held(path: &Path, granted: &HashSet<String>) {
    let (m, owner) = start(path, Clock::system());
    rt().block_on(async {
        for k in granted {
            let d = m.reserve(reserve(&key(k), 3_600_000, 1)).await;
            assert!(
                matches!(d, Decision::Duplicate(_)),
                "{k} was granted, now {d:?}"
            );
        }
    });
    owner.stop();
}

#[test]
fn read_only_state_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("state");
    let fs = Tmpfs::mount(&mnt, "size=16m,mode=0755");
    let path = mnt.join("m.redb");
    // A database that exists but sits on a read-only filesystem cannot be opened for
    // writing: it must fail closed. (A first start on a read-only folder runs against the
    // binary: `faults::read_only_state_directory`.)
    let (m, owner) = start(&path, Clock::system());
    let before =
        rt().block_on(async { granted(m.reserve(reserve(&key("before"), 3_600_000, 1)).await) });
    owner.stop();
    fs.remount("ro");
    let (m, owner) = start(&path, Clock::system());
    rt().block_on(async {
        for i in 0..5 {
            let d = m
                .reserve(reserve(&key(&format!("ro-{i}")), 3_600_000, 1))
                .await;
            assert!(
                matches!(d, Decision::Unavailable(Unavailable::NotOpen(_))),
                "{d:?}"
            );
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
        assert!(
            !m.shared()
                .serving
                .load(std::sync::atomic::Ordering::Relaxed)
        );
        // A release while failing closed is soft: an error for the caller (it is not made
        // now), counted. The owner keeps it and makes it when the database opens again.
        // (A grant of the previous start, the same entry on the disk, stands in for one
        // this owner gave before a fault.)
        assert!(m.release(before).is_err());
        let failures = &m.shared().stats.release_failures;
        assert_eq!(failures.load(std::sync::atomic::Ordering::Relaxed), 1);
        fs.remount("rw");
        assert!(wait_recovered(&m, "rw").await, "serves again once writable");
        granted(m.reserve(reserve(&key("before"), 3_600_000, 1)).await);
    });
    owner.stop();
}

#[test]
fn database_held_by_another_process() {
    if let Ok(path) = std::env::var(CHILD_ENV) {
        child_begin();
        // The other process: hold the file open until our stdin closes.
        let _db = redb::Database::create(&path).unwrap();
        println!("HOLDING");
        std::io::stdout().flush().unwrap();
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let mut holder = child("database_held_by_another_process", path.to_str().unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    assert!(lines.any(|l| l.unwrap() == "HOLDING"));
    let (m, owner) = start(&path, Clock::system());
    rt().block_on(async {
        for i in 0..5 {
            let d = m
                .reserve(reserve(&key(&format!("held-{i}")), 3_600_000, 1))
                .await;
            assert!(
                matches!(d, Decision::Unavailable(Unavailable::NotOpen(_))),
                "{d:?}"
            );
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
        drop(holder.stdin.take()); // the other process lets go
        assert!(holder.wait().unwrap().success());
        assert!(
            wait_recovered(&m, "free").await,
            "serves again once the file is free"
        );
    });
    owner.stop();
}

/// Runs the child's side of a commit fault: reserve fresh keys, reporting each answer,
/// until Unavailable; keep trying for a while under the fault; then `lift` it and wait for
/// service to come back.
fn reserve_through_fault(path: &Path, lift: impl FnOnce()) {
    reserve_through_fault_armed(path, || {}, lift, 200_000)
}

/// As [`reserve_through_fault`], with the fault made by `arm` once the database is open
/// (a file-size limit below the database's size would refuse the open itself), and lifted
/// after `rounds` of reserves at most, met or not.
fn reserve_through_fault_armed(
    path: &Path,
    arm: impl FnOnce(),
    lift: impl FnOnce(),
    rounds: usize,
) {
    let (m, owner) = start(path, Clock::system());
    let say = |s: String| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{s}").unwrap();
        out.flush().unwrap();
    };
    rt().block_on(async {
        // Answered once the open is done.
        m.ping().await.expect("the owner answers");
        arm();
        let mut failed = 0;
        for i in 0..rounds {
            let name = format!("f{i}");
            // 16 at a time, so the batches (and the file) grow quickly.
            let answers = futures_join(&m, &name).await;
            for (n, d) in answers {
                match d {
                    Decision::Proceed(_) => say(format!("PROCEED {n}")),
                    d if unavailable(&d) => {
                        failed += 1;
                        say(format!("UNAVAILABLE {n} {d:?}"));
                    }
                    d => say(format!("OTHER {n} {d:?}")),
                }
            }
            if failed >= 200 {
                break;
            }
        }
        lift();
        let ok = wait_recovered(&m, "after").await;
        say(format!("RECOVERED {ok}"));
    });
    owner.stop();
}

async fn futures_join(m: &hoox_edge::mutex::Mutex, base: &str) -> Vec<(String, Decision)> {
    let tasks: Vec<_> = (0..16)
        .map(|j| {
            let m = m.clone();
            let n = format!("{base}-{j}");
            tokio::spawn(async move {
                let d = m.reserve(reserve(&key(&n), 3_600_000, 1)).await;
                (n, d)
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Reads a child's report and checks the rules every commit fault must obey.
fn check_report(report: &str, path: &Path) {
    let mut granted = HashSet::new();
    let mut unavailable = 0;
    let mut recovered = false;
    let mut after_fault = 0;
    for l in report.lines() {
        if let Some(k) = l.strip_prefix("PROCEED ") {
            granted.insert(k.to_string());
            after_fault += usize::from(unavailable > 0);
        } else if l.starts_with("UNAVAILABLE ") {
            unavailable += 1;
        } else if l.starts_with("OTHER ") {
            panic!("unexpected answer: {l}");
        } else if l == "RECOVERED true" {
            recovered = true;
        }
    }
    eprintln!(
        "{} granted ({after_fault} of them after the first failure), {unavailable} unavailable",
        granted.len()
    );
    assert!(unavailable > 0, "the fault never showed");
    assert!(
        recovered,
        "service did not resume once the fault was lifted"
    );
    // A Proceed given while the fault was on is only legitimate if it is durable.
    assert_all_held(path, &granted);
}

fn run_child(mut c: std::process::Command) -> String {
    let mut child = c.spawn().unwrap();
    drop(child.stdin.take());
    let mut out = String::new();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        stdout.read_to_string(&mut out).unwrap();
        out
    });
    let end = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            child.kill().unwrap();
            panic!("child hung");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(child.wait().unwrap().success(), "child failed");
    reader.join().unwrap()
}

/// RLIMIT_FSIZE of this process: no write may reach past `cur` bytes of any file.
fn limit_file_size(cur: libc::rlim_t) {
    let lim = libc::rlimit {
        rlim_cur: cur,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit with a valid pointer to an initialised struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &lim) }, 0);
}

#[test]
fn file_size_limit_during_commits() {
    if let Ok(path) = std::env::var(CHILD_ENV) {
        child_begin();
        return reserve_through_fault(Path::new(&path), || limit_file_size(libc::RLIM_INFINITY));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    // Create the file first, so the limit bites on growth, not on creation.
    let (m, owner) = start(&path, Clock::system());
    rt().block_on(async { m.reserve(reserve(&key("seed"), 3_600_000, 1)).await });
    owner.stop();
    let limit = std::fs::metadata(&path).unwrap().len();
    let mut c = child("file_size_limit_during_commits", path.to_str().unwrap());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        c.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: limit,
                rlim_max: libc::RLIM_INFINITY,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Without this the first write past the limit kills the process (SIGXFSZ)
            // instead of failing with EFBIG.
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let report = run_child(c);
    assert!(
        report.contains("CommitFailed"),
        "EFBIG must surface as CommitFailed"
    );
    check_report(&report, &path);
}

/// The limit set inside the journal once the database is open, at a quarter of its length:
/// the fifth record after the open, a reserve's own, meets EFBIG before the owner takes a
/// checkpoint into redb (at eight). Above, the limit is the database's size, past the
/// journal's end, so only a checkpoint ever failed and no reserve's own write did: a
/// Proceed sent for a record that was never written went unseen.
#[test]
fn file_size_limit_on_a_reserves_own_record() {
    if let Ok(path) = std::env::var(CHILD_ENV) {
        child_begin();
        let path = Path::new(&path);
        let journal = hoox_edge::mutex::journal::path_for(path);
        let arm = || {
            let len = std::fs::metadata(&journal).unwrap().len();
            limit_file_size(len / 4);
        };
        // The journal holds 16 records: the limit is met within a few rounds, or the
        // child lifts it after 100 and the parent finds that it never showed.
        return reserve_through_fault_armed(
            path,
            arm,
            || limit_file_size(libc::RLIM_INFINITY),
            100,
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let (m, owner) = start(&path, Clock::system());
    rt().block_on(async { m.reserve(reserve(&key("seed"), 3_600_000, 1)).await });
    owner.stop();
    let mut c = child(
        "file_size_limit_on_a_reserves_own_record",
        path.to_str().unwrap(),
    );
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        c.pre_exec(|| {
            // A write past the limit fails with EFBIG rather than kill the process.
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let report = run_child(c);
    // The journal's own write failed, not a checkpoint's into redb: what this test is for.
    assert!(
        report.contains("CommitFailed(\"journal: "),
        "no reserve was refused for its own record's EFBIG (CommitFailed from the journal)"
    );
    check_report(&report, &path);
}

#[test]
fn full_filesystem() {
    if let Ok(path) = std::env::var(CHILD_ENV) {
        child_begin();
        let filler = Path::new(&path).with_file_name("filler");
        let path = Path::new(&path);
        // Fill what is left of the filesystem once the database exists.
        let (m, owner) = start(path, Clock::system());
        rt().block_on(async { m.ping().await.unwrap() });
        owner.stop();
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0xa5u8; 64 * 1024];
        while f.write_all(&block).is_ok() {}
        let small = [0u8; 512];
        while f.write_all(&small).is_ok() {}
        drop(f);
        return reserve_through_fault(path, || std::fs::remove_file(&filler).unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("small");
    let _fs = Tmpfs::mount(&mnt, "size=4m");
    let path = mnt.join("m.redb");
    let report = run_child(child("full_filesystem", path.to_str().unwrap()));
    assert!(
        report.contains("CommitFailed"),
        "ENOSPC must surface as CommitFailed"
    );
    check_report(&report, &path);
}

#[test]
fn corrupted_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let (m, owner) = start(&path, Clock::system());
    rt().block_on(async {
        for i in 0..100 {
            m.reserve(reserve(&key(&format!("c{i}")), 3_600_000, 1))
                .await;
        }
    });
    owner.stop();
    let mut bytes = std::fs::read(&path).unwrap();
    // Garbage over the header and over the rest of the first pages.
    for (i, b) in bytes.iter_mut().take(64 * 1024).enumerate() {
        *b = (i as u8).wrapping_mul(31) ^ 0x5a;
    }
    std::fs::write(&path, &bytes).unwrap();
    let (m, owner) = start(&path, Clock::system());
    rt().block_on(async {
        for i in 0..3 {
            let d = m
                .reserve(reserve(&key(&format!("c{i}")), 3_600_000, 1))
                .await;
            assert!(
                matches!(d, Decision::Unavailable(Unavailable::NotOpen(_))),
                "{d:?}"
            );
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
        // The operator moves the damaged file aside. Its journal is still there, so this is
        // a lost database, not a first start: still refused, and nothing created.
        std::fs::rename(&path, path.with_extension("corrupt")).unwrap();
        refused_until(&m, "is missing or empty, but its journal is there").await;
        assert!(!path.exists());
        // The journal goes too, the operator's choice: still nothing made by this process,
        // which found both files; a start makes a fresh database.
        let journal = hoox_edge::mutex::journal::path_for(&path);
        std::fs::rename(&journal, path.with_extension("corrupt-journal")).unwrap();
        refused_until(&m, "found it or its journal here since it started").await;
        assert!(
            !path.exists() && !journal.exists(),
            "made by a process that found them"
        );
    });
    owner.stop();
    let (m, owner) = start(&path, Clock::system());
    rt().block_on(async { assert!(wait_recovered(&m, "fresh").await) });
    owner.stop();
}

/// Waits, with the owner's backoff, for a reserve refused as not open for `why`; a grant
/// is a database made where none was to be.
async fn refused_until(m: &hoox_edge::mutex::Mutex, why: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match m.reserve(reserve(&key("c0"), 3_600_000, 1)).await {
            Decision::Unavailable(Unavailable::NotOpen(w)) if w.contains(why) => return,
            Decision::Proceed(_) => panic!("a database made again empty"),
            // Not open for another reason yet, or the owner busy inside its reopen.
            d => {
                assert!(std::time::Instant::now() < deadline, "still: {d:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// An operator restores `mutex.redb` from an older copy and leaves the journal. The
/// journal has wrapped since that copy, so the records that held some of the keys granted
/// in between are gone: replaying what is left would forget those keys. The open must
/// refuse, and serve again once the database that belongs to the journal is back.
#[test]
fn a_database_older_than_its_journal_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let backup = dir.path().join("m.redb.backup");
    let keys = |prefix: &str, n: usize| -> HashSet<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    };
    let reserve_all = |all: &HashSet<String>| {
        let (m, owner) = start(&path, Clock::system());
        rt().block_on(async {
            for k in all {
                granted(m.reserve(reserve(&key(k), 3_600_000, 1)).await);
            }
        });
        owner.stop();
    };
    reserve_all(&keys("before", 4));
    std::fs::copy(&path, &backup).unwrap();
    // 40 synced records: the journal (16 slots) wraps more than twice.
    let since = keys("since", 40);
    reserve_all(&since);
    std::fs::rename(&path, path.with_extension("current")).unwrap();
    std::fs::copy(&backup, &path).unwrap();
    let (m, owner) = start(&path, Clock::system());
    rt().block_on(async {
        for k in &since {
            let d = m.reserve(reserve(&key(k), 3_600_000, 1)).await;
            assert_not_open(d, "older than its journal", k);
        }
        // The database that belongs to the journal is put back: served again, every key
        // held.
        std::fs::rename(path.with_extension("current"), &path).unwrap();
        assert!(wait_recovered(&m, "back").await);
    });
    owner.stop();
    assert_all_held(&path, &since);
}

#[test]
fn an_entry_this_version_cannot_read_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let t = db.begin_write().unwrap();
        {
            let def: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("entries");
            let mut tab = t.open_table(def).unwrap();
            // Version 7 of an entry, from some future release.
            tab.insert(41, [7u8, 1, 2, 3].as_slice()).unwrap();
        }
        t.commit().unwrap();
    }
    let (m, owner) = start(&path, Clock::system());
    let d = rt().block_on(m.reserve(reserve(&key("x"), 3_600_000, 1)));
    assert_not_open(d, "#41", "an unreadable entry might be a live key");
    owner.stop();
}
