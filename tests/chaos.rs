//! Chaos: the gateway is killed with SIGKILL at random moments under a load of retried and
//! duplicated webhooks, restarted on the same database, and loaded again. A ledger executor
//! (the mock, a real HTTP server) records every trade it receives. After all cycles:
//! - no key was forwarded twice (the whole run is well inside the TTL);
//! - every key that got a 2xx is still blocked after the last restart.
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
    // Orders take a little while, so that kills land with orders in flight.
    exec.set_mode(Mode::Slow(Duration::from_millis(20)));
    let setup = Setup::new(Some(&exec.url()));
    let accepted: Arc<Mutex<HashSet<String>>> = Arc::default();
    let pool = 400u64;

    for cycle in 0..cycles {
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
                // Keys come from a pool shared by all workers and all cycles: the same trade
                // is retried concurrently, and again after restarts.
                let Ok(mut conn) = client.connect(&url).await else {
                    return;
                };
                for _ in 0..10_000 {
                    let k = format!("chaos-{}", r.below(pool));
                    match conn.post(&url, &[], body(&k)).await {
                        Ok(reply) => {
                            let s = reply.status.as_u16();
                            assert!(
                                matches!(s, 200 | 409 | 503),
                                "worker {w}: unexpected {s} {:?}",
                                reply.json()
                            );
                            if s == 200 {
                                accepted.lock().unwrap().insert(k);
                            }
                        }
                        // The gateway was killed under us.
                        Err(_) => return,
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(150 + rng.below(600))).await;
        gw.kill9();
        for w in workers {
            w.await.unwrap();
        }
        println!(
            "cycle {cycle}: {} forwarded, {} accepted",
            exec.calls(),
            accepted.lock().unwrap().len()
        );
    }

    // No key forwarded twice.
    let mut seen: HashMap<String, usize> = HashMap::new();
    for r in exec.ledger() {
        *seen
            .entry(r.idempotency_key.unwrap_or_default())
            .or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "forwarded twice: {twice:?}");
    assert!(exec.calls() > 0, "the load never got through");

    // Every key that got a 2xx is still blocked after a restart.
    let gw = setup.start();
    gw.wait_ready().await;
    let accepted = accepted.lock().unwrap().clone();
    let before = exec.calls();
    let mut conn = gw.client.connect(&gw.url()).await.unwrap();
    for k in &accepted {
        let r = conn.post(&gw.url(), &[], body(k)).await.unwrap();
        assert_eq!(
            r.status, 409,
            "{k} was accepted before the crash but not blocked after"
        );
    }
    assert_eq!(exec.calls(), before);
}
