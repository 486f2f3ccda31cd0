//! Durability under SIGKILL: a child process reserves keys and prints each Proceed it
//! received; the parent kills it at random moments, again and again, on the same file.
//! Every printed key must still be held after reopening, and none may be granted twice.

mod mutex_support;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hoox_edge::mutex::{Clock, Decision, Grant, Snapshot, State};
use mutex_support::*;

const TEST: &str = "sigkill_never_loses_a_granted_key";
/// Each child reserves from a window of keys, half of them its predecessor's: those test
/// grants across the crash, and the new half leaves every child keys to grant before its
/// kill (a child whose keys were all taken would only ever be killed idle).
const WINDOW: u64 = 3000;
/// Which child this is: where its window starts.
const CYCLE_ENV: &str = "HOOX_CRASH_CYCLE";

#[test]
fn sigkill_never_loses_a_granted_key() {
    if let Ok(path) = std::env::var(CHILD_ENV) {
        child_begin();
        return reserve_until_killed(Path::new(&path));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let mut seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    println!("kill timing seed {seed}");
    let mut granted = HashSet::new();
    let (mut killed_mid_run, mut granting) = (0, 0);
    for cycle in 0..15 {
        let mut c = child(TEST, path.to_str().unwrap())
            .env(CYCLE_ENV, cycle.to_string())
            .spawn()
            .unwrap();
        let out = c.stdout.take().unwrap();
        let (first_tx, first) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            BufReader::new(out)
                .lines()
                .map_while(Result::ok)
                .filter_map(|l| l.strip_prefix("PROCEED ").map(str::to_string))
                .inspect(|_| {
                    let _ = first_tx.send(());
                })
                .collect::<Vec<_>>()
        });
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        // The kill comes at a random moment once the child grants: how long its start
        // takes (a growing file to check and replay) is the machine's, not the test's.
        granting += usize::from(first.recv_timeout(Duration::from_secs(10)).is_ok());
        std::thread::sleep(Duration::from_millis(seed % 400));
        c.kill().unwrap(); // SIGKILL
        let status = c.wait().unwrap();
        // By the kill, or ended by itself (its reserves done); never by another signal (an
        // abort), which `code()` alone would have counted as a kill.
        let signal = std::os::unix::process::ExitStatusExt::signal(&status);
        assert!(signal.is_none_or(|s| s == libc::SIGKILL), "child: {status}");
        killed_mid_run += usize::from(signal.is_some());
        let lines = reader.join().unwrap();
        for k in &lines {
            assert!(
                granted.insert(k.clone()),
                "cycle {cycle}: {k} granted twice"
            );
        }
    }
    assert!(
        killed_mid_run >= 10,
        "the child must die by the signal, not by itself"
    );
    eprintln!("{} keys granted over 15 SIGKILLed children", granted.len());
    assert!(
        granting >= 10,
        "only {granting} of 15 children granted a key within 10 s of their start"
    );
    let (m, owner) = start(&path, Clock::system());
    rt().block_on(async {
        for k in &granted {
            match m.reserve(reserve(&key(k), 3_600_000, 1)).await {
                Decision::Duplicate(_) => {}
                other => panic!("{k} was granted before the crash but now: {other:?}"),
            }
        }
    });
    owner.stop();
}

/// The child: 16 concurrent callers reserving random keys forever, printing each grant
/// only once the mutex has answered Proceed.
fn reserve_until_killed(path: &Path) {
    let cycle: u64 = std::env::var(CYCLE_ENV)
        .ok()
        .and_then(|c| c.parse().ok())
        .expect("the parent names the cycle");
    let (m, _owner) = start(path, Clock::system());
    let rt = rt();
    rt.block_on(async {
        let _tasks: Vec<_> = (0..16u64)
            .map(|t| {
                let m = m.clone();
                tokio::spawn(async move {
                    let mut x = (SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap()
                        .as_nanos() as u64)
                        ^ (t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    loop {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let name = format!("k{}", cycle * WINDOW / 2 + x % WINDOW);
                        let k = key(&name);
                        if let Decision::Proceed(g) = m.reserve(reserve(&k, 3_600_000, 1)).await {
                            {
                                let mut out = std::io::stdout().lock();
                                writeln!(out, "PROCEED {name}").unwrap();
                                out.flush().unwrap();
                            }
                            if x.is_multiple_of(3) {
                                m.commit(g, None).unwrap();
                            }
                        }
                    }
                })
            })
            .collect();
        // Runs until the parent's SIGKILL.
        std::future::pending::<()>().await
    });
}

const JOURNAL_TEST: &str = "the_journal_alone_brings_back_reserves_commits_and_releases";

/// After a SIGKILL, redb holds only its last checkpoint; everything since lives in the
/// journal. A child reserves four keys, commits one, releases one, pings, commits another
/// and idles, says so and waits to be killed: too few records to fill the journal, so no
/// checkpoint after its open has taken place and the state after the kill comes from the replay alone. Then the same journal
/// with a synced record damaged (and later ones intact) must fail the open, not be skipped.
#[test]
fn the_journal_alone_brings_back_reserves_commits_and_releases() {
    if let Ok(path) = std::env::var(CHILD_ENV) {
        child_begin();
        let (m, _owner) = start(Path::new(&path), Clock::system());
        rt().block_on(async {
            let mut grants = Vec::new();
            for k in ["pending", "committed", "released", "later"] {
                grants.push(granted(m.reserve(reserve(&key(k), 3_600_000, 1)).await));
            }
            let [_pending, committed, released, later]: [Grant; 4] = grants.try_into().unwrap();
            let response = Snapshot {
                status: 200,
                body: b"filled".to_vec(),
            };
            m.commit(committed, Some(response)).unwrap();
            m.release(released).unwrap();
            // Commit and release are queued, not answered, and promise no fsync; a ping
            // is answered only once every earlier write is in the journal (a SIGKILL
            // keeps the page cache).
            m.ping().await.unwrap();
            // With nothing to read and nothing granted, the commit rides until the owner
            // has been idle for 2 ms (`CARRY_IDLE`), and is then written on its own: the
            // journal changes, and nothing else writes it here. Wait until it has, and the
            // write has ended (two reads alike).
            let journal = format!("{path}-journal");
            let before = std::fs::read(&journal).unwrap();
            m.commit(later, None).unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            let mut last = before.clone();
            loop {
                std::thread::sleep(std::time::Duration::from_millis(20));
                let now = std::fs::read(&journal).unwrap();
                if now != before && now == last {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the commit was not written when the owner went idle"
                );
                last = now;
            }
            // What the test rests on: redb has had nothing since the open.
            let checkpoints = m.shared().stats.checkpoint_seconds.snapshot().2;
            println!("READY after {checkpoints} checkpoints");
            std::future::pending::<()>().await
        });
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Runs the child on a fresh database and SIGKILLs it once it is done; returns the
    // database's path.
    let crashed = |name: &str| {
        let path = dir.path().join(name);
        let mut c = child(JOURNAL_TEST, path.to_str().unwrap()).spawn().unwrap();
        let lines = BufReader::new(c.stdout.take().unwrap()).lines();
        let ready = lines.map(|l| l.unwrap()).find(|l| l.starts_with("READY"));
        c.kill().unwrap(); // SIGKILL
        c.wait().unwrap();
        assert_eq!(
            ready.as_deref(),
            Some("READY after 0 checkpoints"),
            "the child did not finish, or its state went to redb: the replay is not tested"
        );
        path
    };
    let path = crashed("m.redb");
    let (m, owner) = start(&path, Clock::system());
    rt().block_on(async {
        assert_eq!(m.ping().await.unwrap().live_keys, 3);
        assert_eq!(
            m.get(key("pending")).await.unwrap().unwrap().state,
            State::Pending
        );
        let d = duplicate(m.reserve(reserve(&key("committed"), 3_600_000, 1)).await);
        assert_eq!(d.state, State::Committed);
        assert_eq!(d.response.unwrap().body, b"filled");
        assert_eq!(
            m.get(key("later")).await.unwrap().unwrap().state,
            State::Committed,
            "the commit written when the owner went idle came back"
        );
        assert!(
            matches!(
                m.reserve(reserve(&key("released"), 3_600_000, 1)).await,
                Decision::Proceed(_)
            ),
            "the release came back too"
        );
    });
    owner.stop();

    // The same crash, but the first record (the first reserve, synced before it was
    // answered) damaged on disk while later records are intact: a byte of it flipped, or
    // its whole slot zeroed, so that nothing of it is left to find. Or every record in a
    // newer format, as a newer version would leave them for this one after a rollback.
    type Damage = fn(&mut [u8]);
    let damaged = "journal record 1 is damaged";
    let damages: [(&str, Damage, &str); 3] = [
        ("d.redb", |b| b[40] ^= 0xff, damaged),
        ("z.redb", |b| b[..4096].fill(0), damaged),
        (
            "n.redb",
            |b| {
                for slot in b.chunks_mut(4096).filter(|s| s.starts_with(b"HXJ1")) {
                    slot[3] = b'2';
                }
            },
            "journal record 1 is in a newer format (magic \"HXJ2\")",
        ),
    ];
    for (name, damage, because) in damages {
        let path = crashed(name);
        let journal = dir.path().join(format!("{name}-journal"));
        let mut bytes = std::fs::read(&journal).unwrap();
        assert_eq!(&bytes[..4], b"HXJ1", "a record at the start of the journal");
        damage(&mut bytes);
        std::fs::write(&journal, &bytes).unwrap();
        let (m, owner) = start(&path, Clock::system());
        let d = rt().block_on(m.reserve(reserve(&key("pending"), 3_600_000, 1)));
        assert_not_open(d, because, name);
        owner.stop();
    }
}
