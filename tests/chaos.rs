//! Chaos: the gateway is killed with SIGKILL at random moments under a load of retried and
//! duplicated webhooks, restarted on the same database, and loaded again. A ledger executor
//! (the mock, a real HTTP server) records every trade it receives. After all cycles:
//! - no key was forwarded twice (the whole run is well inside the TTL);
//! - every key that got a 2xx, and every key forwarded at all (some of them by a gateway
//!   killed before it could answer), is still blocked after the last restart;
//! - the kills did land with trades in flight, and new trades got through in most cycles:
//!   a run in which every kill hit a gateway with nothing left to forward proves nothing.
//!
//! A quarter of the trades carry no key of their own: the gateway takes their fingerprint,
//! whose minute bucket the ledger's key carries, so those are counted by trade, and held to
//! the fingerprint's promise (no second forward less than 60 s after the first).
//!
//! `HOOX_CHAOS_CYCLES` sets the number of cycles (20 by default; `scripts/bench.sh --chaos`
//! runs 60). `HOOX_CHAOS_SEED` replays a run's random choices (each run prints its seed);
//! the machine's timing is its own.
//!
//! A third of the cycles also kill a gateway a few ms after its start, with nothing sent to
//! it: often mid-open (the journal replayed into the database, the checkpoint after it; each
//! such kill prints how far the log got), so that a start that loses what it replays is
//! caught too. Every kill is asserted to be one: the
//! gateway was running, and ended by SIGKILL, not by itself.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use support::executor::{MockExecutor, Mode};
use support::gateway::{SECRET, Setup};

/// xorshift64*: reproducible from the printed seed, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// How the gateway stores (and forwards) a client's key: the executor's ledger has this form.
const STORED: &str = "client:psk:live:";

/// A fingerprint's stored key, but its minute bucket: the trade's quantity follows.
const FINGERPRINT: &str = "trade:binance:BTCUSDT:LONG:";

/// How long a fingerprint blocks its trade: the spec's minute.
const FINGERPRINT_HOLD: Duration = Duration::from_secs(60);

/// Trade number `n`: every fourth has no key, and its quantity (`n`) makes it a trade of
/// its own, blocked by its fingerprint; the others carry the key `chaos-n`.
fn fingerprinted(n: u64) -> bool {
    n % 4 == 3
}

fn body(n: u64) -> String {
    let mut b = json!({"exchange":"binance","symbol":"BTCUSDT","action":"LONG","quantity":1,
           "apiKey": SECRET});
    if fingerprinted(n) {
        b["quantity"] = json!(n);
    } else {
        b["idempotencyKey"] = json!(format!("chaos-{n}"));
    }
    b.to_string()
}

/// The trade number a key the executor received stands for: `chaos-n` as stored, or a
/// fingerprint of quantity `n` in any minute bucket.
fn trade_of(stored: &str) -> u64 {
    let n = match stored.strip_prefix(STORED) {
        Some(client) => client.strip_prefix("chaos-"),
        None => stored
            .strip_prefix(FINGERPRINT)
            .and_then(|rest| rest.split(':').next()),
    };
    n.and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a key of this test: {stored}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_never_forwards_a_key_twice() {
    let cycles: usize = std::env::var("HOOX_CHAOS_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let seed = std::env::var("HOOX_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
        | 1;
    println!("chaos seed {seed} (HOOX_CHAOS_SEED), {cycles} cycles");
    let mut rng = Rng(seed);

    let exec = MockExecutor::start().await;
    // Orders take a little while, so that kills land with orders in flight: long enough for
    // the kill below to land while the order it waited for is still at the mock, even when
    // this task is scheduled late on a loaded machine.
    exec.set_mode(Mode::Slow(Duration::from_millis(50)));
    let setup = Setup::new(Some(&exec.url()));
    // Trade numbers answered 200.
    let accepted: Arc<Mutex<HashSet<u64>>> = Arc::default();
    // Each cycle draws from a window of 400 keys, half of them the previous cycle's: the
    // same trade is retried concurrently, and again across a restart, while half the window
    // is new, so that every cycle still has trades to forward when its kill comes.
    let window = 400u64;
    let (mut progressed, mut cut_off, mut unanswered_before) = (0, 0, 0);
    // Cycles in which some new trade was answered 200: the claim about keys that got a 2xx
    // holds only if there are such keys, every cycle adding some before its kill.
    let mut answered = 0;
    let mut early_kills = 0;

    for cycle in 0..cycles {
        let calls_before = exec.calls();
        let accepted_before = accepted.lock().unwrap().len();
        let base = cycle as u64 * window / 2;
        if rng.below(3) == 0 {
            let mut early = setup.start();
            let after = rng.below(40);
            tokio::time::sleep(Duration::from_millis(after)).await;
            assert_sigkilled(early.kill9(), &early.stderr());
            // Where it was: its log says how far it got (the reading thread may lag).
            let log = early.stderr();
            let got = if log.contains("ready: database open") {
                "ready"
            } else if log.contains("mutex: replayed") {
                "replayed its journal, not ready"
            } else {
                "not yet through its open"
            };
            println!("cycle {cycle}: killed {after} ms after its start: {got}");
            early_kills += 1;
        }
        let mut gw = setup.start();
        gw.wait_ready().await;
        let url = gw.url();
        let mut workers = Vec::new();
        for w in 0..8 {
            let client = gw.client.clone();
            let url = url.clone();
            let accepted = accepted.clone();
            let mut r = Rng(rng.next() | 1);
            workers.push(tokio::spawn(async move {
                let Ok(mut conn) = client.connect(&url).await else {
                    return;
                };
                for _ in 0..10_000 {
                    let n = base + r.below(window);
                    match conn.post(&url, &[], body(n)).await {
                        Ok(reply) => {
                            let s = reply.status.as_u16();
                            assert!(
                                matches!(s, 200 | 409 | 503),
                                "worker {w}: unexpected {s} {:?}",
                                reply.json()
                            );
                            if s == 200 {
                                accepted.lock().unwrap().insert(n);
                            }
                        }
                        // The gateway was killed under us.
                        Err(_) => return,
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(150 + rng.below(600))).await;
        // Then the next order to reach the executor: it is at the mock (Slow) when the kill
        // lands, so the kill cuts it off however the scheduler interleaved the workers until
        // now. If none comes (nothing left to forward), the kill lands anyway.
        let arrived = exec.calls();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while exec.calls() == arrived && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_sigkilled(gw.kill9(), &gw.stderr());
        for w in workers {
            w.await.unwrap();
        }
        // Forwarded, but its sender got no 200: the kill came while it was at the executor.
        let accepted_now = accepted.lock().unwrap().clone();
        let unanswered = exec
            .ledger()
            .iter()
            .filter(|r| {
                r.idempotency_key
                    .as_deref()
                    .is_some_and(|k| !accepted_now.contains(&trade_of(k)))
            })
            .count();
        println!(
            "cycle {cycle}: {} forwarded, {} accepted, {unanswered} forwarded unanswered",
            exec.calls(),
            accepted_now.len()
        );
        progressed += usize::from(exec.calls() > calls_before);
        answered += usize::from(accepted_now.len() > accepted_before);
        cut_off += usize::from(unanswered > unanswered_before);
        unanswered_before = unanswered;
    }
    // Loose bounds, for a noisy machine: here every cycle forwards new trades, and its kill
    // cuts off ~8 orders at the executor.
    assert!(
        progressed * 2 >= cycles,
        "new trades reached the executor in only {progressed} of {cycles} cycles"
    );
    assert!(
        answered * 2 >= cycles,
        "new trades were answered 200 in only {answered} of {cycles} cycles"
    );
    assert!(
        cut_off * 2 >= cycles,
        "a kill cut off an order at the executor in only {cut_off} of {cycles} cycles"
    );
    println!("{early_kills} of {cycles} cycles also killed a gateway just after its start");

    // No trade forwarded twice: a key within its TTL (the whole run), a fingerprint within
    // its minute, whatever its bucket.
    let mut seen: HashMap<u64, Vec<(String, std::time::Instant)>> = HashMap::new();
    for r in exec.ledger() {
        let k = r
            .idempotency_key
            .expect("an order reached the executor without its key");
        seen.entry(trade_of(&k)).or_default().push((k, r.at));
    }
    let twice: Vec<_> = seen
        .values()
        .filter(|orders| {
            orders.windows(2).any(|w| {
                // Timed at the executor, not at the reserve: a second's slack either way.
                let hold = FINGERPRINT_HOLD - Duration::from_secs(2);
                !w[1].0.starts_with(FINGERPRINT) || w[1].1 - w[0].1 < hold
            })
        })
        .collect();
    assert!(twice.is_empty(), "forwarded twice: {twice:?}");
    let fingerprints = seen.keys().filter(|n| fingerprinted(**n)).count();
    assert!(
        fingerprints * 8 >= seen.len(),
        "{fingerprints} of {} trades forwarded were fingerprinted",
        seen.len()
    );
    let accepted = accepted.lock().unwrap().clone();
    let lost: Vec<_> = accepted.iter().filter(|n| !seen.contains_key(*n)).collect();
    assert!(
        lost.is_empty(),
        "a 200 for a trade never forwarded: {lost:?}"
    );

    // Every trade forwarded (so every one that got a 2xx) is still blocked after a restart:
    // all of the keyed ones, and the fingerprinted ones still inside their minute (with a
    // margin for the replay's own time).
    let gw = setup.start();
    gw.wait_ready().await;
    let before = exec.calls();
    let mut conn = gw.client.connect(&gw.url()).await.unwrap();
    let mut replayed = 0;
    for (n, orders) in &seen {
        let last = orders.last().map(|o| o.1).expect("one order at least");
        if fingerprinted(*n) && last.elapsed() > FINGERPRINT_HOLD - Duration::from_secs(10) {
            continue;
        }
        replayed += 1;
        let r = conn.post(&gw.url(), &[], body(*n)).await.unwrap();
        assert_eq!(
            (r.status.as_u16(), r.json()["code"].as_str()),
            (409, Some("DUPLICATE")),
            "trade {n} was forwarded ({orders:?}, accepted: {}) before a crash but not \
             blocked after",
            accepted.contains(n)
        );
    }
    assert!(
        replayed * 2 >= seen.len(),
        "{replayed} of {} replayed",
        seen.len()
    );
    assert_eq!(exec.calls(), before);
}

/// A kill that was one: the gateway was still running (it had not ended by itself, as one
/// that aborts on concurrent duplicates would) and SIGKILL ended it.
fn assert_sigkilled(status: std::process::ExitStatus, stderr: &str) {
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the gateway ended before its kill ({status}); stderr:\n{stderr}"
    );
}
