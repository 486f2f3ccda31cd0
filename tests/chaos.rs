//! Chaos: the gateway is killed with SIGKILL at random moments under a load of retried and
//! duplicated webhooks, restarted on the same database, and loaded again. A ledger executor
//! (the mock, a real HTTP server) records every trade it receives. After all cycles:
//! - no key was forwarded twice (the whole run is well inside the TTL);
//! - every key that got a 2xx, and every key forwarded at all (some of them by a gateway
//!   killed before it could answer), is still blocked after the last restart;
//! - the kills did land with trades in flight, and new trades got through in most cycles:
//!   a run in which every kill hit a gateway with nothing left to forward proves nothing.
//!
//! `HOOX_CHAOS_CYCLES` sets the number of cycles (20 by default; `scripts/bench.sh --chaos`
//! runs 60).

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

fn body(k: &str) -> String {
    json!({"exchange":"binance","symbol":"BTCUSDT","action":"LONG","quantity":1,
           "idempotencyKey": k, "apiKey": SECRET})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_never_forwards_a_key_twice() {
    let cycles: usize = std::env::var("HOOX_CHAOS_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    println!("chaos seed {seed}, {cycles} cycles");
    let mut rng = Rng(seed);

    let exec = MockExecutor::start().await;
    // Orders take a little while, so that kills land with orders in flight: long enough for
    // the kill below to land while the order it waited for is still at the mock, even when
    // this task is scheduled late on a loaded machine.
    exec.set_mode(Mode::Slow(Duration::from_millis(50)));
    let setup = Setup::new(Some(&exec.url()));
    let accepted: Arc<Mutex<HashSet<String>>> = Arc::default();
    // Each cycle draws from a window of 400 keys, half of them the previous cycle's: the
    // same trade is retried concurrently, and again across a restart, while half the window
    // is new, so that every cycle still has trades to forward when its kill comes.
    let window = 400u64;
    let (mut progressed, mut cut_off, mut unanswered_before) = (0, 0, 0);

    for cycle in 0..cycles {
        let calls_before = exec.calls();
        let base = cycle as u64 * window / 2;
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
                    let k = format!("chaos-{}", base + r.below(window));
                    match conn.post(&url, &[], body(&k)).await {
                        Ok(reply) => {
                            let s = reply.status.as_u16();
                            assert!(
                                matches!(s, 200 | 409 | 503),
                                "worker {w}: unexpected {s} {:?}",
                                reply.json()
                            );
                            if s == 200 {
                                accepted.lock().unwrap().insert(format!("{STORED}{k}"));
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
        gw.kill9();
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
                    .as_ref()
                    .is_some_and(|k| !accepted_now.contains(k))
            })
            .count();
        println!(
            "cycle {cycle}: {} forwarded, {} accepted, {unanswered} forwarded unanswered",
            exec.calls(),
            accepted_now.len()
        );
        progressed += usize::from(exec.calls() > calls_before);
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
        cut_off * 2 >= cycles,
        "a kill cut off an order at the executor in only {cut_off} of {cycles} cycles"
    );

    // No key forwarded twice.
    let mut seen: HashMap<String, usize> = HashMap::new();
    for r in exec.ledger() {
        *seen
            .entry(r.idempotency_key.unwrap_or_default())
            .or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "forwarded twice: {twice:?}");
    assert!(
        !seen.contains_key(""),
        "an order reached the executor without its key"
    );
    let accepted = accepted.lock().unwrap().clone();
    let lost: Vec<_> = accepted.iter().filter(|k| !seen.contains_key(*k)).collect();
    assert!(
        lost.is_empty(),
        "a 200 for a trade never forwarded: {lost:?}"
    );

    // Every key forwarded (so every key that got a 2xx) is still blocked after a restart.
    let gw = setup.start();
    gw.wait_ready().await;
    let before = exec.calls();
    let mut conn = gw.client.connect(&gw.url()).await.unwrap();
    for k in seen.keys() {
        let client_key = k
            .strip_prefix(STORED)
            .expect("the ledger holds stored keys");
        let r = conn.post(&gw.url(), &[], body(client_key)).await.unwrap();
        assert_eq!(
            (r.status.as_u16(), r.json()["code"].as_str()),
            (409, Some("DUPLICATE")),
            "{k} was forwarded (accepted: {}) before a crash but not blocked after",
            accepted.contains(k)
        );
    }
    assert_eq!(exec.calls(), before);
}
