//! The mutex's answers, one rule at a time, on a real redb file.

mod mutex_support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use hoox_edge::mutex::{
    Clock, Decision, Grant, Guard, Key, MAX_RESPONSE, Released, Snapshot, State, Unavailable,
    key::BUCKET_MS,
};
use mutex_support::*;

const T0: u64 = 1_800_000_000_000;

/// The log lines of this test binary, every test's: a test looks for its own.
mod logs {
    use std::sync::Mutex;

    static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

    struct Capture;

    impl log::Log for Capture {
        fn enabled(&self, _: &log::Metadata) -> bool {
            true
        }
        fn log(&self, record: &log::Record) {
            LINES.lock().unwrap().push(record.args().to_string());
        }
        fn flush(&self) {}
    }

    pub fn capture() {
        // Set once per binary; a second test's call finds it set.
        let _ = log::set_logger(&Capture);
        log::set_max_level(log::LevelFilter::Info);
    }

    pub fn lines() -> Vec<String> {
        LINES.lock().unwrap().clone()
    }
}

#[test]
fn reserve_commit_release_and_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, time) = Clock::manual(T0);
    let (m, owner) = start(&dir.path().join("m.redb"), clock);
    rt().block_on(async {
        let a = key("a");
        let ga = granted(m.reserve(reserve(&a, 300_000, 1)).await);
        assert_eq!(ga.key(), &a);
        time.advance_ms(1_000);
        let d = duplicate(m.reserve(reserve(&a, 300_000, 1)).await);
        assert_eq!(d.key, a);
        assert_eq!(d.state, State::Pending);
        assert_eq!(d.age_ms, 1_000);
        assert_eq!(d.expires_in_ms, 299_000);
        assert_eq!(d.response, None);
        assert_eq!(m.reserve(reserve(&a, 300_000, 2)).await, Decision::Mismatch);

        let snap = Snapshot {
            status: 200,
            body: b"{\"success\":true}".to_vec(),
        };
        m.commit(ga, Some(snap.clone())).unwrap();
        let d = duplicate(m.reserve(reserve(&a, 300_000, 1)).await);
        assert_eq!(d.state, State::Committed);
        assert_eq!(d.response, Some(snap.clone()));
        assert_eq!(d.expires_in_ms, 299_000, "commit keeps the expiry");
        let info = m.get(a.clone()).await.unwrap().unwrap();
        assert!(info.has_response);
        assert_eq!(info.expires_at, T0 + 300_000);

        let b = key("b");
        let gb = granted(m.reserve(reserve(&b, 300_000, 1)).await);
        m.release(gb).unwrap();
        assert_eq!(m.get(b.clone()).await.unwrap(), None);
        granted(m.reserve(reserve(&b, 300_000, 1)).await);

        assert_eq!(m.force_release(a.clone(), None).await, Ok(Released::Yes));
        assert_eq!(
            m.force_release(a.clone(), None).await,
            Ok(Released::NotFound)
        );
        // Taken last, and with a shorter TTL: it expires first, and is listed first.
        granted(m.reserve(reserve(&a, 200_000, 9)).await);

        let list = m.list(10).await.unwrap();
        let listed: Vec<_> = list
            .iter()
            .map(|e| (e.key.as_str(), e.expires_at))
            .collect();
        assert_eq!(
            listed,
            [(a.as_str(), T0 + 201_000), (b.as_str(), T0 + 301_000)]
        );
        let s = &m.shared().stats;
        assert_eq!(s.proceeds.load(std::sync::atomic::Ordering::Relaxed), 4);
        assert_eq!(s.mismatches.load(std::sync::atomic::Ordering::Relaxed), 1);
    });
    owner.stop();
}

#[test]
fn expired_keys_are_absent_before_and_after_the_wheel() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, time) = Clock::manual(T0);
    let (m, owner) = start(&dir.path().join("m.redb"), clock);
    rt().block_on(async {
        let a = key("a");
        granted(m.reserve(reserve(&a, 1_000, 1)).await);
        time.advance_ms(999);
        duplicate(m.reserve(reserve(&a, 1_000, 1)).await);
        time.advance_ms(1);
        // Expired at exactly expires_at, whether or not the wheel has run.
        granted(m.reserve(reserve(&a, 1_000, 2)).await);
        time.advance_ms(5_000);
        let st = m.ping().await.unwrap();
        assert_eq!(st.live_keys, 0, "the wheel purged the expired entry");
        assert_eq!(st.fail_closed, None);
    });
    owner.stop();
}

/// SPEC §2: "an identical fingerprint reserved less than 60 s ago is a duplicate whatever
/// its bucket". Of a trade placed (committed); one still pending is held longer (below).
#[test]
fn a_fingerprint_younger_than_a_minute_is_a_duplicate_whatever_its_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let (clock, time) = Clock::manual(T0);
    let (m, owner) = start(&path, clock.clone());
    let stored = |s: &str| Key::from_stored(s).unwrap();
    let duplicate_of = |d: Decision, of: &Key| assert_eq!(&duplicate(d).key, of);
    let ask = |k: &str| m.reserve(reserve(&stored(k), 300_000, 1));
    // The order filled: only a pending trade holds its family past its minute.
    let placed = |g: Grant| m.commit(g, None).unwrap();
    rt().block_on(async {
        // The next minute, 59.999 s later: a retry across the boundary.
        let old = stored("trade:x:BTC:LONG:1:live:100");
        let new = stored("trade:x:BTC:LONG:1:live:101");
        placed(granted(m.reserve(reserve(&old, 300_000, 1)).await));
        time.advance_ms(BUCKET_MS - 1);
        duplicate_of(m.reserve(reserve(&new, 300_000, 1)).await, &old);
        // A minute on, the same trade again is a new trade.
        time.advance_ms(1);
        placed(granted(m.reserve(reserve(&new, 300_000, 1)).await));
        // ... and the latest of its family: a minute before that, the first was.
        time.advance_ms(BUCKET_MS - 1);
        duplicate_of(ask("trade:x:BTC:LONG:1:live:102").await, &new);

        // The minute before: a copy that read the clock just before the boundary but
        // reached the owner after one that read it just after.
        let after = stored("trade:x:ETH:LONG:1:live:201");
        placed(granted(m.reserve(reserve(&after, 300_000, 1)).await));
        duplicate_of(ask("trade:x:ETH:LONG:1:live:200").await, &after);

        // Minutes away, as a wall clock stepped between the two puts it: back two
        // minutes, then forward twelve. The monotonic clock says seconds.
        let first = stored("trade:x:SOL:LONG:1:live:300");
        placed(granted(m.reserve(reserve(&first, 300_000, 1)).await));
        time.advance_ms(5_000);
        time.step_wall_back_ms(2 * BUCKET_MS);
        duplicate_of(ask("trade:x:SOL:LONG:1:live:298").await, &first);
        time.step_wall_ms(12 * BUCKET_MS);
        duplicate_of(ask("trade:x:SOL:LONG:1:live:310").await, &first);
        // A wall clock stepped back ten minutes keeps a key live longer, but does not keep
        // it young: two minutes on, the same trade again is a new trade (SPEC §2: "not
        // after, so deliberate same-size trades later are not blocked").
        placed(granted(ask("trade:x:XRP:LONG:1:live:720").await));
        time.advance_ms(30_000);
        time.step_wall_back_ms(10 * BUCKET_MS);
        time.advance_ms(90_000);
        granted(ask("trade:x:XRP:LONG:1:live:712").await);
        // Stepped back a minute or more, the wall clock names the same minute again: the
        // same key is still the same trade's while it lives, however old (refused, the
        // safe side), and free once both clocks have passed its TTL.
        let same = "trade:x:DOT:LONG:1:live:800";
        placed(granted(ask(same).await));
        time.advance_ms(2 * BUCKET_MS);
        time.step_wall_back_ms(2 * BUCKET_MS);
        duplicate_of(ask(same).await, &stored(same));
        time.advance_ms(300_000);
        granted(ask(same).await);
        // Another trade, or the same in test mode, is not of its family.
        granted(ask("trade:x:SOL:LONG:2:live:310").await);
        granted(ask("trade:x:SOL:LONG:1:test:310").await);
        // Released, the latest no longer holds its family: the order was never sent.
        let g = granted(ask("trade:x:ADA:LONG:1:live:400").await);
        m.release(g).unwrap();
        placed(granted(ask("trade:x:ADA:LONG:1:live:401").await));
    });
    owner.stop();

    // After a restart the family is found again, from the table.
    let (m, owner) = start(&path, clock);
    let ask = |k: &str| m.reserve(reserve(&stored(k), 300_000, 1));
    rt().block_on(async {
        duplicate_of(
            ask("trade:x:ADA:LONG:1:live:399").await,
            &stored("trade:x:ADA:LONG:1:live:401"),
        );
        // Pending (its outcome unknown: a 504 held, a crash), a trade holds its family
        // minutes on, until its TTL: a retry sent after the 504 may double a fill.
        let out = stored("trade:x:LTC:LONG:1:live:500");
        granted(m.reserve(reserve(&out, 300_000, 1)).await);
        time.advance_ms(3 * BUCKET_MS);
        duplicate_of(ask("trade:x:LTC:LONG:1:live:503").await, &out);
        time.advance_ms(2 * BUCKET_MS - 1);
        duplicate_of(ask("trade:x:LTC:LONG:1:live:504").await, &out);
        time.advance_ms(1);
        granted(ask("trade:x:LTC:LONG:1:live:505").await);
    });
    owner.stop();
}

/// The minute is measured from when the retry was asked, not from when a busy owner got
/// to it: a retry 59 s after its trade, behind a slow sync, is still a duplicate.
#[test]
fn a_fingerprint_retry_is_aged_from_when_it_was_asked() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, time) = Clock::manual(T0);
    let (m, owner) = start_stallable_on(&dir.path().join("m.redb"), clock, |c| {
        c.deadline = Duration::from_secs(10)
    });
    rt().block_on(async {
        let old = Key::from_stored("trade:x:BTC:LONG:1:live:100").unwrap();
        let new = Key::from_stored("trade:x:BTC:LONG:1:live:101").unwrap();
        // Placed: a pending trade holds its family whatever its age.
        let g = granted(m.reserve(reserve(&old, 300_000, 1)).await);
        m.commit(g, None).unwrap();
        time.advance_ms(BUCKET_MS - 1_000);
        m.stall(Duration::from_millis(2_000)).await.unwrap();
        let mut retry = Box::pin(m.reserve(reserve(&new, 300_000, 1)));
        queue(retry.as_mut());
        // The owner takes it 2 s later: 61 s after the trade. Still queued here (the stall
        // has not ended), or the owner took it 59 s after and the test proves nothing.
        queue(retry.as_mut());
        time.advance_ms(2_000);
        assert_eq!(duplicate(retry.await).key, old);
        // Asked now, it is a new trade.
        granted(m.reserve(reserve(&new, 300_000, 1)).await);
    });
    owner.stop();
}

/// A wall clock stepped forward (NTP, an operator, a VM resumed) does not free a key
/// early: the monotonic clock still says it lives, and a key lives while either clock says
/// so.
#[test]
fn a_wall_clock_stepped_forward_frees_no_key() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, time) = Clock::manual(T0);
    let (m, owner) = start(&dir.path().join("m.redb"), clock);
    rt().block_on(async {
        let k = key("stepped");
        granted(m.reserve(reserve(&k, 60_000, 1)).await);
        time.step_wall_ms(3_600_000);
        duplicate(m.reserve(reserve(&k, 60_000, 1)).await);
        assert!(m.get(k.clone()).await.unwrap().is_some());
        assert_eq!(m.list(10).await.unwrap().len(), 1);
        // Once the monotonic clock has also run its TTL, the key is free.
        time.advance_ms(60_000);
        granted(m.reserve(reserve(&k, 60_000, 1)).await);
    });
    owner.stop();
}

/// A key taken while the wall clock was ahead (a year: a bad NTP server, a clock set by
/// hand) is free when its TTL has run once the clock is set right, not a year later: a
/// wall clock behind the time a key was stored at says nothing of it, and the monotonic
/// clock decides. Nor does a restart in the same boot hold it longer (its boot deadline),
/// and one after its TTL purges it, so that it takes no place under the capacity.
#[test]
fn a_key_taken_while_the_wall_clock_was_ahead_is_held_its_ttl_once_the_clock_is_set() {
    const YEAR: u64 = 365 * 24 * 3_600_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let (clock, time) = Clock::manual(T0);
    let (a, b) = (key("ahead-a"), key("ahead-b"));
    time.step_wall_ms(YEAR);
    let (m, owner) = start(&path, clock.clone());
    rt().block_on(async {
        granted(m.reserve(reserve(&a, 5_000, 1)).await);
        granted(m.reserve(reserve(&b, 5_000, 1)).await);
        time.step_wall_back_ms(YEAR);
        time.advance_ms(1_000);
        let d = duplicate(m.reserve(reserve(&a, 5_000, 1)).await);
        assert_eq!(d.expires_in_ms, 4_000);
        time.advance_ms(4_000);
        granted(m.reserve(reserve(&a, 5_000, 2)).await);
    });
    owner.stop();
    let (m, owner) = start(&path, clock.clone());
    rt().block_on(async {
        granted(m.reserve(reserve(&b, 5_000, 2)).await);
        time.advance_ms(5_000);
        m.ping().await.unwrap();
        assert!(
            m.list(10).await.unwrap().is_empty(),
            "a key held past its TTL"
        );
    });
    owner.stop();
    // Taken ahead, then a restart within its TTL after the clock was set: held to its
    // boot deadline, and free after it.
    let c = key("ahead-c");
    time.step_wall_ms(YEAR);
    let (m, owner) = start(&path, clock.clone());
    rt().block_on(async { granted(m.reserve(reserve(&c, 5_000, 1)).await) });
    owner.stop();
    time.step_wall_back_ms(YEAR);
    time.advance_ms(2_000);
    let (m, owner) = start(&path, clock.clone());
    rt().block_on(async {
        let d = duplicate(m.reserve(reserve(&c, 5_000, 1)).await);
        assert_eq!(d.expires_in_ms, 3_000);
        time.advance_ms(3_000);
        granted(m.reserve(reserve(&c, 5_000, 2)).await);
    });
    owner.stop();
}

/// A key taken while the wall clock was ahead, and the box rebooted within its TTL with the
/// clock further ahead: that start's deadline for it, from the wall clock, is short by the
/// extra. NTP then sets the clock right, behind the time the key was stored at: the wall
/// clock still holds it (as before 0.2.28), up to its TTL from that start, so it is not
/// freed before its TTL has truly run. (r95 found a first take on 0.2.28 freeing it at
/// the short deadline.)
#[test]
fn a_reboot_further_ahead_then_set_right_frees_no_key_early() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let (clock, time) = Clock::manual(T0);
    let k = key("ahead");
    time.step_wall_ms(600_000);
    let (m, owner) = start(&path, clock.clone());
    rt().block_on(async {
        granted(m.reserve(reserve(&k, 300_000, 1)).await);
    });
    owner.stop();
    // 60 s after the reserve, a reboot, and the clock a minute further ahead.
    time.advance_ms(60_000);
    time.reboot();
    time.step_wall_ms(60_000);
    let (m, owner) = start(&path, clock);
    rt().block_on(async {
        let d = duplicate(m.reserve(reserve(&k, 300_000, 1)).await);
        assert_eq!(d.expires_in_ms, 180_000, "short by the extra minute");
        time.step_wall_back_ms(660_000);
        // 240 s after the reserve: 60 s of its TTL left in truth.
        time.advance_ms(180_000);
        let d = duplicate(m.reserve(reserve(&k, 300_000, 1)).await);
        assert_eq!(d.expires_in_ms, 120_000, "to its TTL from the start");
        time.advance_ms(120_000);
        granted(m.reserve(reserve(&k, 300_000, 2)).await);
    });
    owner.stop();
}

/// A stored response larger than `MAX_RESPONSE` (one a version before 0.2.27 kept) is not
/// given back for a replay: read from the batch's record, from the records since the
/// checkpoint, or, after a restart, from the database. One that fits is.
#[test]
fn a_stored_response_over_the_bound_is_not_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let (clock, _time) = Clock::manual(T0);
    let snap = |len: usize| Snapshot {
        status: 200,
        body: vec![b'x'; len],
    };
    let (fits, over) = (key("fits"), key("over"));
    let responses = |m: &hoox_edge::mutex::Mutex| {
        rt().block_on(async {
            let fits = duplicate(m.reserve(reserve(&fits, 300_000, 1)).await).response;
            let over = duplicate(m.reserve(reserve(&over, 300_000, 1)).await).response;
            (fits, over)
        })
    };
    let (m, owner) = start(&path, clock.clone());
    rt().block_on(async {
        let g = granted(m.reserve(reserve(&fits, 300_000, 1)).await);
        m.commit(g, Some(snap(MAX_RESPONSE))).unwrap();
        let g = granted(m.reserve(reserve(&over, 300_000, 1)).await);
        m.commit(g, Some(snap(MAX_RESPONSE + 1))).unwrap();
    });
    assert_eq!(responses(&m), (Some(snap(MAX_RESPONSE)), None));
    owner.stop();
    let (m, owner) = start(&path, clock.clone());
    assert_eq!(
        responses(&m),
        (Some(snap(MAX_RESPONSE)), None),
        "after a restart"
    );
    owner.stop();
}

/// The same across a restart in the same boot, as a box without a real-time clock gets
/// there: it serves before NTP sets its clock, then restarts (a crash, an upgrade) after.
/// Each entry's boot deadline holds its key, and its age; only a reboot leaves the wall
/// clock to judge alone.
#[test]
fn a_wall_clock_stepped_forward_frees_no_key_across_a_restart_in_the_same_boot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let (clock, time) = Clock::manual(T0);
    let stored = |s: &str| Key::from_stored(s).unwrap();
    let snap = Snapshot {
        status: 200,
        body: b"{\"success\":true}".to_vec(),
    };
    let (pending, committed) = (key("before-ntp"), key("filled"));
    let trade = stored("trade:x:XRP:LONG:1:live:500");
    let now_trade = || {
        stored(&format!(
            "trade:x:ADA:LONG:1:live:{}",
            clock.wall_ms() / BUCKET_MS
        ))
    };
    let (m, owner) = start(&path, clock.clone());
    rt().block_on(async {
        granted(m.reserve(reserve(&pending, 300_000, 1)).await);
        let g = granted(m.reserve(reserve(&committed, 300_000, 1)).await);
        m.commit(g, Some(snap.clone())).unwrap();
        // Placed: a pending trade holds its family whatever its age.
        let g = granted(m.reserve(reserve(&trade, 300_000, 1)).await);
        m.commit(g, None).unwrap();
    });
    owner.stop();
    time.step_wall_ms(3_600_000);
    time.advance_ms(10_000);

    let (m, owner) = start(&path, clock.clone());
    rt().block_on(async {
        let d = duplicate(m.reserve(reserve(&pending, 300_000, 1)).await);
        assert_eq!(d.expires_in_ms, 290_000, "by the boot clock");
        let d = duplicate(m.reserve(reserve(&committed, 300_000, 1)).await);
        assert_eq!(d.response, Some(snap.clone()));
        // A fingerprint is aged by the boot clock too: ten seconds old, whatever minute
        // the wall clock now puts it in.
        let fingerprint = stored("trade:x:XRP:LONG:1:live:561");
        let d = duplicate(m.reserve(reserve(&fingerprint, 300_000, 1)).await);
        assert_eq!(d.key, trade);
        time.advance_ms(290_000);
        granted(m.reserve(reserve(&pending, 300_000, 1)).await);
        let g = granted(m.reserve(reserve(&now_trade(), 300_000, 1)).await);
        m.commit(g, None).unwrap();
    });
    owner.stop();

    // Stepped back ten minutes instead, two minutes on: the wall clock keeps that trade's
    // key live, but the boot clock says it is two minutes old, so the same trade again is
    // a new trade (SPEC §2), after a restart as without one.
    time.advance_ms(30_000);
    time.step_wall_back_ms(10 * BUCKET_MS);
    time.advance_ms(90_000);
    let across = key("across-a-reboot");
    let (m, owner) = start(&path, clock.clone());
    rt().block_on(async {
        granted(m.reserve(reserve(&now_trade(), 300_000, 1)).await);
        granted(m.reserve(reserve(&across, 300_000, 1)).await);
    });
    owner.stop();

    // A reboot, with the wall clock stepped 200 s forward: the last boot's clock means
    // nothing in this one, and the wall clock alone holds the key, for the 100 s it has
    // left by it.
    time.step_wall_ms(200_000);
    time.reboot();
    let (m, owner) = start(&path, clock);
    rt().block_on(async {
        duplicate(m.reserve(reserve(&across, 300_000, 1)).await);
        time.advance_ms(150_000);
        granted(m.reserve(reserve(&across, 300_000, 2)).await);
    });
    owner.stop();
}

/// After a reboot only the wall clock is left, and a box without a real-time clock may come
/// back with it an hour behind (fake-hwclock's saved time): behind the time the key was
/// stored at, it says nothing of the key, and the monotonic clock holds it its TTL from
/// the start, never more; so it is free when that has run, whether NTP has set the clock
/// by then or not, not an hour later.
#[test]
fn after_a_reboot_a_key_is_held_no_longer_than_its_ttl_by_the_monotonic_clock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let (clock, time) = Clock::manual(T0);
    let k = key("rebooted");
    let (m, owner) = start(&path, clock.clone());
    rt().block_on(async {
        granted(m.reserve(reserve(&k, 300_000, 1)).await);
    });
    owner.stop();
    time.reboot();
    time.step_wall_back_ms(3_600_000);
    let (m, owner) = start(&path, clock);
    rt().block_on(async {
        let d = duplicate(m.reserve(reserve(&k, 300_000, 1)).await);
        assert_eq!(d.expires_in_ms, 300_000, "by the monotonic clock");
        time.step_wall_ms(3_600_000);
        let d = duplicate(m.reserve(reserve(&k, 300_000, 1)).await);
        assert_eq!(d.expires_in_ms, 300_000, "by both clocks");
        time.advance_ms(300_000);
        granted(m.reserve(reserve(&k, 300_000, 2)).await);
    });
    owner.stop();
}

/// The same box, the clock set only after the start: the key was taken an hour behind, the
/// reboot comes back an hour behind, and NTP steps the clock while the gateway runs, which
/// holds the key by the deadline its start took. A restart in that boot (a crash, an
/// upgrade) must hold it to that deadline too, not to the wall clock that now says it
/// expired an hour ago.
#[test]
fn a_restart_after_ntp_steps_the_clock_holds_a_key_of_the_last_boot_to_its_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let (clock, time) = Clock::manual(T0);
    let k = key("rebooted");
    time.step_wall_back_ms(3_600_000);
    let (m, owner) = start(&path, clock.clone());
    rt().block_on(async {
        granted(m.reserve(reserve(&k, 300_000, 1)).await);
    });
    owner.stop();
    time.reboot();
    let (m, owner) = start(&path, clock.clone());
    rt().block_on(async {
        duplicate(m.reserve(reserve(&k, 300_000, 1)).await);
    });
    time.step_wall_ms(3_600_000);
    time.advance_ms(10_000);
    owner.stop();
    let (m, owner) = start(&path, clock);
    rt().block_on(async {
        let d = duplicate(m.reserve(reserve(&k, 300_000, 1)).await);
        assert_eq!(
            d.expires_in_ms, 290_000,
            "by the boot clock of the first start"
        );
        time.advance_ms(290_000);
        granted(m.reserve(reserve(&k, 300_000, 2)).await);
    });
    owner.stop();
}

#[test]
fn capacity_refuses_new_keys_but_not_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, time) = Clock::manual(T0);
    // Two keys of three: one place is left, fewer than a signed trade takes, so every
    // new trade is refused, keyed or signed.
    let (m, owner) = start_capped(&dir.path().join("m.redb"), clock, 3);
    rt().block_on(async {
        granted(m.reserve(reserve(&key("a"), 1_000, 1)).await);
        granted(m.reserve(reserve(&key("b"), 5_000, 1)).await);
        assert_eq!(
            m.reserve(reserve(&key("c"), 1_000, 1)).await,
            Decision::Unavailable(Unavailable::Capacity)
        );
        duplicate(m.reserve(reserve(&key("a"), 1_000, 1)).await);
        time.advance_ms(1_000);
        m.ping().await.unwrap();
        granted(m.reserve(reserve(&key("c"), 1_000, 1)).await);
    });
    owner.stop();
}

/// Full is fewer places left than a signed trade takes: at a capacity of two, one key
/// is full, and the status says so (what `/readyz` and the gauges report), halted too: a
/// full gateway behind the kill switch read as one that would serve at `resume`.
#[test]
fn one_key_of_two_is_full() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, time) = Clock::manual(T0);
    let (m, owner) = start_capped(&dir.path().join("m.redb"), clock, 2);
    rt().block_on(async {
        assert!(!m.ping().await.unwrap().at_capacity);
        granted(m.reserve(reserve(&key("a"), 1_000, 1)).await);
        assert!(m.ping().await.unwrap().at_capacity);
        m.set_halted(true).await.unwrap();
        let status = m.ping().await.unwrap();
        assert!(status.halted && status.at_capacity, "{status:?}");
        assert!(
            m.shared()
                .at_capacity
                .load(std::sync::atomic::Ordering::Relaxed)
        );
        m.set_halted(false).await.unwrap();
        assert_eq!(
            m.reserve(reserve(&key("b"), 1_000, 1)).await,
            Decision::Unavailable(Unavailable::Capacity)
        );
        time.advance_ms(1_000);
        m.ping().await.unwrap();
        assert!(!m.ping().await.unwrap().at_capacity);
    });
    owner.stop();
}

#[test]
fn state_and_kill_switch_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let (clock, time) = Clock::manual(T0);
    let (m, owner) = start(&path, clock.clone());
    rt().block_on(async {
        granted(m.reserve(reserve(&key("short"), 2_000, 1)).await);
        let long = granted(m.reserve(reserve(&key("long"), 60_000, 1)).await);
        m.commit(long, None).unwrap();
        m.set_halted(true).await.unwrap();
        assert!(m.is_halted());
    });
    owner.stop();
    time.advance_ms(10_000);
    let (m, owner) = start(&path, clock);
    rt().block_on(async {
        let st = m.ping().await.unwrap();
        assert!(st.halted && m.is_halted());
        assert_eq!(st.live_keys, 1, "the expired key was purged at start");
        assert_eq!(
            m.get(key("long")).await.unwrap().unwrap().state,
            State::Committed
        );
        assert_eq!(
            m.reserve(reserve(&key("short"), 2_000, 1)).await,
            Decision::Halted
        );
        m.set_halted(false).await.unwrap();
        assert!(!m.is_halted());
        granted(m.reserve(reserve(&key("short"), 2_000, 1)).await);
    });
    owner.stop();
}

#[test]
fn a_missing_directory_fails_closed_then_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("later");
    let (m, owner) = start(&sub.join("m.redb"), Clock::system());
    rt().block_on(async {
        match m.reserve(reserve(&key("a"), 1_000, 1)).await {
            Decision::Unavailable(Unavailable::NotOpen(_)) => {}
            other => panic!("expected NotOpen, got {other:?}"),
        }
        assert!(m.ping().await.unwrap().fail_closed.is_some());
        std::fs::create_dir(&sub).unwrap();
        let ok = eventually(Duration::from_secs(5), async || {
            matches!(
                m.reserve(reserve(&key("a"), 1_000, 1)).await,
                Decision::Proceed(_)
            )
        })
        .await;
        assert!(ok, "serves again once the directory exists");
        assert!(
            m.shared()
                .serving
                .load(std::sync::atomic::Ordering::Relaxed)
        );
    });
    owner.stop();
}

/// The kill switch is stored with the keys, so a gateway whose database could not open at
/// start does not know it is on. The owner learns it when the open succeeds, and the
/// reserve that arrives then must not get through.
#[test]
fn the_kill_switch_holds_from_the_open_that_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let (state, away) = (dir.path().join("state"), dir.path().join("away"));
    std::fs::create_dir(&state).unwrap();
    let path = state.join("m.redb");
    let (m, owner) = start(&path, Clock::system());
    rt().block_on(async { m.set_halted(true).await.unwrap() });
    owner.stop();

    std::fs::rename(&state, &away).unwrap();
    let (m, owner) = start(&path, Clock::system());
    rt().block_on(async {
        let d = m.reserve(reserve(&key("k"), 60_000, 1)).await;
        assert!(
            matches!(d, Decision::Unavailable(Unavailable::NotOpen(_))),
            "{d:?}"
        );
        assert!(!m.is_halted(), "nothing read yet");
        std::fs::rename(&away, &state).unwrap();
        let mut d = d;
        let opened = eventually(Duration::from_secs(5), async || {
            d = m.reserve(reserve(&key("k"), 60_000, 1)).await;
            !matches!(d, Decision::Unavailable(_))
        })
        .await;
        assert!(opened, "the database never reopened");
        assert_eq!(d, Decision::Halted);
        assert!(m.is_halted());
    });
    owner.stop();
}

#[test]
fn a_stalled_owner_answers_timeout_and_only_with_the_hook() {
    let dir = tempfile::tempdir().unwrap();
    for hook in [false, true] {
        let mut cfg = config(&dir.path().join(format!("m{hook}.redb")));
        // Long enough for an owner that answers (an fsync on a slow disk included), and
        // well inside the stall, so that a stalled owner surely misses it.
        cfg.deadline = Duration::from_millis(1_500);
        let (m, owner) = hoox_edge::mutex::start_with(cfg, Clock::system(), hook);
        rt().block_on(async {
            m.ping().await.unwrap();
            m.stall(Duration::from_millis(5_000)).await.unwrap();
            let d = m.reserve(reserve(&key("s"), 60_000, 1)).await;
            if hook {
                assert_eq!(d, Decision::Unavailable(Unavailable::Timeout));
                // Its caller gave up before the owner took it, so nobody sent the trade:
                // the owner does not take the key (nothing to release), and the retry runs.
                let absent = async || matches!(m.get(key("s")).await, Ok(None));
                assert!(eventually(Duration::from_secs(20), absent).await);
                let releases = m.shared().stats.releases.load(Ordering::Relaxed);
                assert_eq!(releases, 0, "a reserve nobody waited for was made");
                granted(m.reserve(reserve(&key("s"), 60_000, 1)).await);
            } else {
                granted(d);
            }
        });
        owner.stop();
    }
}

/// A reserve whose caller gave up while it was queued (its deadline passed behind a stall,
/// or its client hung up) is not made: the retry queued behind it in the same batch runs,
/// where it used to find the key held by a trade that was never sent and get a duplicate.
/// (A grant whose caller gives up after the owner applied it is released at the end of
/// the turn, and only if the key still holds its entry: `owner.rs`.)
#[test]
fn a_reserve_given_up_in_the_queue_leaves_the_key_to_its_retry() {
    let dir = tempfile::tempdir().unwrap();
    let (m, owner) = start_stallable(&dir.path().join("m.redb"), |c| {
        c.deadline = Duration::from_secs(10)
    });
    rt().block_on(async {
        let k = key("k");
        m.ping().await.unwrap();
        // Queued behind a stall, so that the owner takes both in one batch.
        m.stall(Duration::from_millis(1_000)).await.unwrap();
        let mut gone = Box::pin(m.reserve(reserve(&k, 60_000, 1)));
        queue(gone.as_mut());
        drop(gone);
        granted(m.reserve(reserve(&k, 60_000, 1)).await);
        assert_eq!(m.shared().stats.releases.load(Ordering::Relaxed), 0);
        duplicate(m.reserve(reserve(&k, 60_000, 1)).await);
    });
    owner.stop();
}

/// A full queue is refused at once (`Busy`), not waited on: the caller answers 503 and
/// the sender retries, while what was queued before is served as usual.
#[test]
fn a_full_queue_is_busy_and_loses_nothing_queued() {
    let dir = tempfile::tempdir().unwrap();
    let (m, owner) = start_stallable(&dir.path().join("m.redb"), |c| c.queue_depth = 4);
    rt().block_on(async {
        m.ping().await.unwrap();
        // Let the owner take the stall and sleep.
        m.stall(Duration::from_millis(1_000)).await.unwrap();
        let mut queued = Vec::new();
        let busy = loop {
            assert!(
                queued.len() <= 4,
                "a queue of 4 took {} reserves",
                queued.len()
            );
            let k = key(&format!("q{}", queued.len()));
            let mut call = Box::pin(m.reserve(reserve(&k, 60_000, 1)));
            match poll_once(call.as_mut()) {
                std::task::Poll::Pending => queued.push(call),
                std::task::Poll::Ready(d) => break d,
            }
        };
        assert_eq!(busy, Decision::Unavailable(Unavailable::Busy));
        assert_eq!(queued.len(), 4, "busy after {} reserves", queued.len());
        for call in queued {
            granted(call.await);
        }
    });
    owner.stop();
}

/// A stallable owner whose queue holds `depth` commands, and whose callers wait long enough
/// (10 s) for a stall to fill it rather than time out.
fn with_a_short_queue(
    path: &std::path::Path,
    depth: usize,
) -> (hoox_edge::mutex::Mutex, hoox_edge::mutex::Owner) {
    start_stallable(path, |c| {
        c.queue_depth = depth;
        c.deadline = Duration::from_secs(10);
    })
}

/// Reserves of keys `q0`, `q1`, ...: each polled once, so queued for the owner in order.
fn queued_reserves(
    m: &hoox_edge::mutex::Mutex,
    n: usize,
) -> Vec<std::pin::Pin<Box<impl std::future::Future<Output = Decision> + '_>>> {
    (0..n)
        .map(|i| {
            let mut call = Box::pin(m.reserve(reserve(&key(&format!("q{i}")), 60_000, 1)));
            queue(call.as_mut());
            call
        })
        .collect()
}

/// A full queue refuses new reserves, but not the end of trades already granted nor the
/// kill switch: a release refused `Busy` held a failed trade's key to its TTL, and a kill
/// switch refused `Busy` did not work under the flood it was thrown for. They go ahead of
/// the backlog, so the reserves queued before the switch was thrown are halted. An
/// operator's release is refused: ahead of a commit queued before it, it could free a
/// trade that had filled.
#[test]
fn a_full_queue_still_takes_settles_and_the_kill_switch() {
    let dir = tempfile::tempdir().unwrap();
    let (m, owner) = with_a_short_queue(&dir.path().join("m.redb"), 4);
    rt().block_on(async {
        let (filled, failed, held) = (key("filled"), key("failed"), key("held"));
        let g_filled = granted(m.reserve(reserve(&filled, 60_000, 1)).await);
        let g_failed = granted(m.reserve(reserve(&failed, 60_000, 1)).await);
        granted(m.reserve(reserve(&held, 60_000, 1)).await);
        m.stall(Duration::from_millis(1_000)).await.unwrap();
        let backlog = queued_reserves(&m, 4);
        let mut refused = Box::pin(m.reserve(reserve(&key("q4"), 60_000, 1)));
        assert_eq!(
            poll_once(refused.as_mut()),
            std::task::Poll::Ready(Decision::Unavailable(Unavailable::Busy)),
            "the queue is full"
        );
        let snap = Snapshot {
            status: 200,
            body: b"{\"success\":true}".to_vec(),
        };
        assert_eq!(m.commit(g_filled, Some(snap.clone())), Ok(()));
        assert_eq!(m.release(g_failed), Ok(()));
        let mut halt = Box::pin(m.set_halted(true));
        queue(halt.as_mut());
        let mut release = Box::pin(m.force_release(held.clone(), None));
        assert_eq!(
            poll_once(release.as_mut()),
            std::task::Poll::Ready(Err(Unavailable::Busy))
        );
        assert_eq!(halt.await, Ok(()));
        for call in backlog {
            assert_eq!(
                call.await,
                Decision::Halted,
                "queued before the switch, applied after"
            );
        }
        assert!(m.is_halted());
        let info = m.get(filled.clone()).await.unwrap().unwrap();
        assert_eq!((info.state, info.has_response), (State::Committed, true));
        assert_eq!(m.get(failed.clone()).await.unwrap(), None);
        assert!(m.get(held.clone()).await.unwrap().is_some());
        assert_eq!(m.shared().stats.release_failures.load(Ordering::Relaxed), 0);
        assert_eq!(m.set_halted(false).await, Ok(()));
        granted(m.reserve(reserve(&failed, 60_000, 1)).await);
        let d = duplicate(m.reserve(reserve(&filled, 60_000, 1)).await);
        assert_eq!(d.response, Some(snap));
    });
    owner.stop();
}

/// The kill switch goes ahead of a backlog that has not filled the queue too: the
/// reserves waiting for the owner when it is thrown are halted, not granted. (Before
/// 0.2.22 only a full queue sent it ahead, and every reserve queued before it went out.)
#[test]
fn the_kill_switch_goes_ahead_of_a_backlog_short_of_a_full_queue() {
    let dir = tempfile::tempdir().unwrap();
    let (m, owner) = with_a_short_queue(&dir.path().join("m.redb"), 64);
    rt().block_on(async {
        m.stall(Duration::from_millis(500)).await.unwrap();
        let backlog = queued_reserves(&m, 8);
        assert_eq!(m.set_halted(true).await, Ok(()));
        for call in backlog {
            assert_eq!(
                call.await,
                Decision::Halted,
                "queued before the switch, applied after"
            );
        }
        assert_eq!(m.get(key("q0")).await.unwrap(), None, "no key was taken");
        assert_eq!(m.set_halted(false).await, Ok(()));
        granted(m.reserve(reserve(&key("q0"), 60_000, 1)).await);
    });
    owner.stop();
}

/// A grant the owner delivered, but its caller never took (the request went away between
/// the owner's answer and its next poll), is released: nobody sent that trade, and its
/// retry must not find the key held for the whole TTL.
#[test]
fn a_grant_delivered_but_never_taken_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let (m, owner) = start(&dir.path().join("m.redb"), Clock::system());
    rt().block_on(async {
        let k = key("k");
        let mut call = Box::pin(m.reserve(reserve(&k, 60_000, 1)));
        queue(call.as_mut());
        // The owner answers in order: once `get` sees the entry, the grant is in the
        // reserve's channel, delivered.
        assert!(m.get(k.clone()).await.unwrap().is_some());
        drop(call);
        let releases = || m.shared().stats.releases.load(Ordering::Relaxed);
        assert!(eventually(Duration::from_secs(5), async || releases() == 1).await);
        assert_eq!(m.get(k.clone()).await.unwrap(), None);
        granted(m.reserve(reserve(&k, 60_000, 1)).await);
    });
    owner.stop();
}

/// An operator write whose caller gave up (the CLI reported a failure) is not applied
/// later: the operator would have been told it did not happen.
#[test]
fn an_operator_write_nobody_waits_for_is_not_applied() {
    let dir = tempfile::tempdir().unwrap();
    // A deadline an answering owner meets (a slow fsync included), and a stall that
    // outlasts the two writes that wait on it, one after the other, by seconds.
    let (m, owner) = start_stallable(&dir.path().join("m.redb"), |c| {
        c.deadline = Duration::from_millis(1_500)
    });
    rt().block_on(async {
        let k = key("held");
        granted(m.reserve(reserve(&k, 60_000, 1)).await);
        m.stall(Duration::from_millis(6_000)).await.unwrap();
        assert_eq!(m.set_halted(true).await, Err(Unavailable::Timeout));
        assert_eq!(
            m.force_release(k.clone(), None).await,
            Err(Unavailable::Timeout)
        );
        assert!(eventually(Duration::from_secs(20), async || m.ping().await.is_ok()).await);
        assert!(
            !m.ping().await.unwrap().halted,
            "a halt reported as failed took effect"
        );
        assert!(
            m.get(k).await.unwrap().is_some(),
            "a release reported as failed took effect"
        );
    });
    owner.stop();
}

/// One taken in time, whose sync then outlasts its caller's deadline, is made all the
/// same (the owner cannot unmake a write in a batch it is syncing): the operator, told it
/// failed, learns from the log that it was made.
#[test]
fn an_operator_write_made_after_its_caller_gave_up_is_logged() {
    logs::capture();
    let dir = tempfile::tempdir().unwrap();
    let (m, owner) = start_stallable(&dir.path().join("m.redb"), |c| {
        c.deadline = Duration::from_millis(1_500)
    });
    rt().block_on(async {
        let k = key("late-release");
        granted(m.reserve(reserve(&k, 60_000, 1)).await);
        m.stall(Duration::from_millis(1_000)).await.unwrap();
        let mut halt = Box::pin(m.set_halted(true));
        queue(halt.as_mut());
        let mut release = Box::pin(m.force_release(k.clone(), None));
        queue(release.as_mut());
        // Taken in the same batch as the two writes, after them: their sync waits for it.
        let slow_sync = m.stall(Duration::from_millis(3_000));
        assert_eq!(halt.await, Err(Unavailable::Timeout));
        assert_eq!(release.await, Err(Unavailable::Timeout));
        slow_sync.await.unwrap();
        assert!(eventually(Duration::from_secs(20), async || m.ping().await.is_ok()).await);
        made_and_logged(&m, &k, "though the caller had given up").await;
    });
    owner.stop();
}

/// Both operator writes of the tests around it made (halted, `k` released), and each
/// logged as made, `said` telling how its caller missed the answer.
async fn made_and_logged(m: &hoox_edge::mutex::Mutex, k: &Key, said: &str) {
    assert!(m.ping().await.unwrap().halted);
    assert_eq!(m.get(k.clone()).await.unwrap(), None);
    let logged = |what: &str| logs::lines().iter().any(|l| l.contains(what));
    assert!(logged(&format!("operator set the kill switch, {said}")));
    assert!(logged(&format!("operator released key {k}, {said}")));
}

/// One made and answered in time, whose answer its caller never took (its deadline passed
/// in the poll that would have taken it, or the operator's request went away): logged as
/// made, as one the owner could not deliver is.
#[test]
fn an_operator_write_whose_answer_was_not_taken_is_logged() {
    logs::capture();
    let dir = tempfile::tempdir().unwrap();
    let (m, owner) = start(&dir.path().join("m.redb"), Clock::system());
    rt().block_on(async {
        let k = key("untaken-release");
        granted(m.reserve(reserve(&k, 60_000, 1)).await);
        let mut halt = Box::pin(m.set_halted(true));
        queue(halt.as_mut());
        let mut release = Box::pin(m.force_release(k.clone(), None));
        queue(release.as_mut());
        // Behind both: once it is answered, so are they, their answers left unread.
        m.ping().await.unwrap();
        drop((halt, release));
        made_and_logged(&m, &k, "though its caller stopped waiting").await;
    });
    owner.stop();
}

#[test]
fn an_idle_owner_checkpoints_and_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let (m, owner) = start(&dir.path().join("m.redb"), Clock::system());
    rt().block_on(async {
        let checkpoints = || m.shared().stats.checkpoint_seconds.snapshot().2;
        assert_eq!(checkpoints(), 0, "opening is not counted");
        // One record per reserve, answered one at a time: the test journal's 16 slots
        // make 8 records a checkpoint's worth, which an idle owner takes at once.
        for i in 0..10 {
            let k = key(&format!("k{i}"));
            granted(m.reserve(reserve(&k, 300_000, 1)).await);
        }
        let taken = eventually(Duration::from_secs(5), async || checkpoints() >= 1).await;
        assert!(taken, "no checkpoint counted after 10 records");
        let (_, seconds, n) = m.shared().stats.checkpoint_seconds.snapshot();
        assert!(
            seconds > 0.0 && seconds < 5.0 * n as f64,
            "{seconds} s over {n}"
        );
        // The checkpointed keys still hold.
        duplicate(m.reserve(reserve(&key("k0"), 300_000, 1)).await);
    });
    owner.stop();
}

/// A grant settles only the entry it made. After an operator release (or an expiry), a
/// retry may reserve the key again while the first trade is still executing: the first
/// trade's release must not free the retry's reservation, which would let a third delivery
/// through while the second is in flight, and its commit must not mark it.
#[test]
fn a_grant_settles_only_its_own_entry() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, time) = Clock::manual(T0);
    let (m, owner) = start(&dir.path().join("m.redb"), clock);
    let snap = |body: &str| Snapshot {
        status: 200,
        body: body.as_bytes().to_vec(),
    };
    rt().block_on(async {
        let k = key("released-by-the-operator");
        let first = granted(m.reserve(reserve(&k, 300_000, 1)).await);
        assert_eq!(m.force_release(k.clone(), None).await, Ok(Released::Yes));
        let second = granted(m.reserve(reserve(&k, 300_000, 1)).await);
        assert_eq!(m.force_release(k.clone(), None).await, Ok(Released::Yes));
        let third = granted(m.reserve(reserve(&k, 300_000, 1)).await);

        m.release(first).unwrap();
        let d = duplicate(m.reserve(reserve(&k, 300_000, 1)).await);
        assert_eq!(d.state, State::Pending);
        m.commit(second, Some(snap("second"))).unwrap();
        let info = m.get(k.clone()).await.unwrap().unwrap();
        assert_eq!(info.state, State::Pending, "a stale commit marked it");
        assert!(!info.has_response);
        let s = &m.shared().stats;
        assert_eq!(s.releases.load(Ordering::Relaxed), 0);
        assert_eq!(s.commits.load(Ordering::Relaxed), 0);

        // Its own grant still settles it.
        m.commit(third, Some(snap("third"))).unwrap();
        let d = duplicate(m.reserve(reserve(&k, 300_000, 1)).await);
        assert_eq!(d.state, State::Committed);
        assert_eq!(d.response, Some(snap("third")));

        // The same after an expiry: the expired grant's release leaves the new one held.
        let e = key("expired");
        let old = granted(m.reserve(reserve(&e, 1_000, 1)).await);
        time.advance_ms(1_000);
        let new = granted(m.reserve(reserve(&e, 1_000, 1)).await);
        m.release(old).unwrap();
        duplicate(m.reserve(reserve(&e, 1_000, 1)).await);
        m.release(new).unwrap();
        granted(m.reserve(reserve(&e, 1_000, 1)).await);
    });
    owner.stop();
}

/// A signed request's guard: checked after the trade's own key, so that a resend inside
/// the minute gets the trade's answer; the holder once the trade's key has moved on (a
/// fingerprint of a later minute); committed with the trade and released with it; gone
/// at its own TTL; and counted against the capacity.
#[test]
fn a_guard_holds_a_signature_beside_its_trade() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, time) = Clock::manual(T0);
    let (m, owner) = start_capped(&dir.path().join("m.redb"), clock, 5);
    let guarded = |k: &Key, sig: u8| {
        let mut r = reserve(k, 300_000, 1);
        r.guard = Some(Guard {
            key: Key::signature(&[sig; 32]),
            ttl: Duration::from_secs(600),
            when_turned_away: true,
        });
        r
    };
    let sig = |n: u8| Key::signature(&[n; 32]);
    rt().block_on(async {
        let (minute_1, minute_3) = (key("minute-1"), key("minute-3"));
        let g = granted(m.reserve(guarded(&minute_1, 1)).await);
        let d = duplicate(m.reserve(guarded(&minute_1, 1)).await);
        assert_eq!(d.key, minute_1, "the trade's key answers first");
        time.advance_ms(120_000);
        let d = duplicate(m.reserve(guarded(&minute_3, 1)).await);
        assert_eq!(d.key, sig(1));
        assert_eq!(d.state, State::Pending);
        m.commit(g, None).unwrap();
        assert_eq!(
            m.get(sig(1)).await.unwrap().unwrap().state,
            State::Committed,
            "committed with its trade"
        );

        // Released with its trade: the same request may be sent again.
        let other = key("other");
        let g = granted(m.reserve(guarded(&other, 2)).await);
        m.release(g).unwrap();
        assert_eq!(m.get(sig(2)).await.unwrap(), None);
        granted(m.reserve(guarded(&other, 2)).await);

        // Four entries live (two trades, two guards) of five: a guarded request needs
        // two places, and is refused; so is a plain one, which would fit: full is one rule
        // for every new trade, the one `/readyz` and `status` report.
        assert_eq!(
            m.reserve(guarded(&key("full"), 3)).await,
            Decision::Unavailable(Unavailable::Capacity)
        );
        assert_eq!(
            m.get(sig(3)).await.unwrap(),
            None,
            "a refusal stores nothing"
        );
        assert_eq!(
            m.reserve(reserve(&key("plain"), 300_000, 1)).await,
            Decision::Unavailable(Unavailable::Capacity)
        );
        assert!(m.ping().await.unwrap().at_capacity);

        // The guard lives its own TTL: past it, the signature holds nothing.
        time.advance_ms(600_000);
        granted(m.reserve(guarded(&minute_3, 1)).await);
    });
    owner.stop();
}

/// A start that reads the kill switch set is no reopen: it does not warn that a failed
/// write's change of the switch reached the disk (there was no failed write); nor, the
/// boot's id known, that it is not.
#[test]
fn a_start_that_reads_the_kill_switch_set_warns_of_nothing() {
    logs::capture();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let (m, owner) = start(&path, Clock::manual(T0).0);
    rt().block_on(async { m.set_halted(true).await.unwrap() });
    owner.stop();
    let (m, owner) = start(&path, Clock::manual(T0).0);
    rt().block_on(async { assert!(m.ping().await.unwrap().halted) });
    owner.stop();
    let logged = |what: &str| logs::lines().iter().any(|l| l.contains(what));
    assert!(
        !logged("the kill switch reads set after the reopen"),
        "a first open warned of a lost write"
    );
    assert!(
        !logged("this boot's id is not readable"),
        "warned of an unknown boot that is known"
    );
}

/// Settles that overflowed while operations are carried (applied, not yet written) are
/// taken with the channel's at once: the owner is not idle, so it does not wait for a
/// record to carry them in, and the command it already took from the channel is applied,
/// not replaced by the next one.
#[test]
fn an_overflow_behind_carried_operations_loses_no_settle() {
    let dir = tempfile::tempdir().unwrap();
    let (m, owner) = with_a_short_queue(&dir.path().join("m.redb"), 2);
    rt().block_on(async {
        let keys: Vec<Key> = (0..4).map(|i| key(&format!("carried{i}"))).collect();
        let mut grants = Vec::new();
        for k in &keys {
            grants.push(granted(m.reserve(reserve(k, 60_000, 1)).await));
        }
        let mut grants = grants.into_iter();
        // A commit carried: taken in a batch of its own with a second stall, which holds
        // the owner with that commit applied and not yet written.
        m.stall(Duration::from_millis(500)).await.unwrap();
        m.commit(grants.next().unwrap(), None).unwrap();
        let stalled = m.stall(Duration::from_millis(1_000));
        stalled.await.unwrap();
        // Two fill the channel; the third overflows (the channel full, as a reserve finds
        // it: refused at once, where a commit takes the lane).
        for g in grants {
            m.commit(g, None).unwrap();
        }
        let mut probe = Box::pin(m.reserve(reserve(&key("probe"), 60_000, 1)));
        assert_eq!(
            poll_once(probe.as_mut()),
            std::task::Poll::Ready(Decision::Unavailable(Unavailable::Busy)),
            "the channel is full"
        );
        // The stall over, the channel drained: every settle applied.
        let until = std::time::Instant::now() + Duration::from_secs(10);
        for k in &keys {
            loop {
                // Busy while the channel is still full.
                match m.get(k.clone()).await {
                    Ok(Some(e)) if e.state == State::Committed => break,
                    Ok(Some(_)) | Err(Unavailable::Busy) => {}
                    other => panic!("{k:?}: {other:?}"),
                }
                assert!(std::time::Instant::now() < until, "{k:?} not committed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    owner.stop();
}
