//! Storm: 1000 concurrent identical webhooks, repeated over trials (20 by default,
//! `HOOX_STORM_TRIALS` to change; `scripts/bench.sh --storm` runs 100), each trial a fresh
//! trade. Exactly one forward each. Trials alternate: a trade with no key of its own (its
//! fingerprint decides) and one with its `idempotencyKey` (the client's key decides), so
//! that neither path races where the other does not.

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use support::client::{Alpn, TlsClient};
use support::executor::{MockExecutor, Mode};
use support::gateway::{SECRET, Setup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_identical_webhooks_forward_once_per_trial() {
    let trials: usize = std::env::var("HOOX_STORM_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let exec = MockExecutor::start().await;
    exec.set_mode(Mode::Slow(Duration::from_millis(50)));
    let mut setup = Setup::new(Some(&exec.url()));
    // As in tests/webhook.rs's 500-webhook test: connections wait idle for the barrier, and
    // the mock executor shares this runtime with the clients, so on a loaded machine the
    // tests' usual 1 s limits would end the trial early, for reasons it is not about.
    setup.set("server", "header_timeout", "30s");
    setup.set("executor", "timeout", "20s");
    let gw = setup.start();
    gw.wait_ready().await;
    let client = TlsClient::with(&setup.pki.ca_cert, Alpn::Http2, None);
    // 63 HTTP/2 connections carry up to 16 streams each (the gateway's limit), so that
    // all 1000 are in flight at once.
    let mut conns = Vec::new();
    for _ in 0..63 {
        conns.push(client.connect(&gw.url()).await.unwrap());
    }
    for trial in 0..trials {
        // Even trials: no client key, the fingerprint decides, as for a signal engine that
        // sends none. Odd ones: the client's key.
        let mut body = json!({"exchange":"bybit","symbol":format!("T{trial}USDT"),"action":"LONG",
                              "quantity":1,"apiKey":SECRET});
        if trial % 2 == 1 {
            body["idempotencyKey"] = json!(format!("storm-{trial}"));
        }
        let body = body.to_string();
        let before = exec.calls();
        let barrier = Arc::new(tokio::sync::Barrier::new(1000));
        let mut tasks = Vec::new();
        for i in 0..1000 {
            let mut conn = conns[i % conns.len()]
                .try_clone()
                .expect("an HTTP/2 connection");
            let url = gw.url();
            let body = body.clone();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let r = conn.post(&url, &[], body).await.unwrap();
                let state = r.json()["state"].as_str().map(str::to_owned);
                (r.status.as_u16(), state)
            }));
        }
        let (mut ok, mut while_out) = (0, 0);
        for t in tasks {
            match t.await.unwrap() {
                (200, _) => ok += 1,
                (409, state) => while_out += usize::from(state.as_deref() == Some("pending")),
                (s, _) => panic!("trial {trial}: unexpected status {s}"),
            }
        }
        assert_eq!(ok, 1, "trial {trial}");
        // Some duplicates met the trade while it was at the executor: the storm did overlap
        // the forward, rather than arrive one by one after it.
        assert!(
            while_out > 0,
            "trial {trial}: no duplicate saw the trade pending"
        );
        assert_eq!(exec.calls(), before + 1, "trial {trial}");
        // Forwarded under the key that decided: the client's, or the fingerprint.
        let key = exec.ledger().last().and_then(|r| r.idempotency_key.clone());
        let key = key.expect("the order carried its key");
        let client_key = key.ends_with(&format!(":storm-{trial}"));
        assert_eq!(client_key, trial % 2 == 1, "trial {trial}: {key}");
    }
}
