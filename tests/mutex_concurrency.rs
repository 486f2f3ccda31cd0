//! Many callers race for the same key: exactly one may proceed.

mod mutex_support;

use std::time::Duration;

use hoox_edge::mutex::{Clock, Decision};
use mutex_support::*;

#[test]
fn a_thousand_racers_one_winner_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let (m, owner) = start(&dir.path().join("m.redb"), Clock::system());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for round in 0..20 {
            let k = key(&format!("race-{round}"));
            let tasks: Vec<_> = (0..1000)
                .map(|_| {
                    let m = m.clone();
                    let k = k.clone();
                    tokio::spawn(async move { m.reserve(reserve(&k, 60_000, 1)).await })
                })
                .collect();
            let (mut proceed, mut dup) = (0, 0);
            for t in tasks {
                match t.await.unwrap() {
                    Decision::Proceed(_) => proceed += 1,
                    Decision::Duplicate(d) => {
                        assert_eq!(d.key, k);
                        dup += 1
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            assert_eq!((proceed, dup), (1, 999), "round {round}");
        }
        // Distinct keys racing at once all proceed, each exactly once.
        let tasks: Vec<_> = (0..2000)
            .map(|i| {
                let m = m.clone();
                tokio::spawn(async move {
                    m.reserve(reserve(&key(&format!("many-{}", i % 500)), 60_000, 1))
                        .await
                })
            })
            .collect();
        let mut proceed = 0;
        for t in tasks {
            if matches!(t.await.unwrap(), Decision::Proceed(_)) {
                proceed += 1;
            }
        }
        assert_eq!(proceed, 500);
        assert_eq!(m.ping().await.unwrap().live_keys, 520);
    });
    owner.stop();
}

/// Group commit: reserves that queue while the owner is busy are granted together, one
/// journal record and one sync per batch, and no batch holds more than `batch_limit`.
#[test]
fn queued_reserves_share_syncs_in_batches_of_at_most_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (m, owner) = start_stallable(&dir.path().join("m.redb"), |c| c.batch_limit = 16);
    rt().block_on(async {
        m.ping().await.unwrap();
        let stats = &m.shared().stats;
        let syncs_before = stats.fsync_seconds.snapshot().2;
        // The owner sleeps while 100 reserves queue behind the stall.
        m.stall(Duration::from_secs(1)).await.unwrap();
        let tasks: Vec<_> = (0..100)
            .map(|i| {
                let m = m.clone();
                tokio::spawn(
                    async move { m.reserve(reserve(&key(&format!("g{i}")), 60_000, 1)).await },
                )
            })
            .collect();
        for t in tasks {
            let d = t.await.unwrap();
            assert!(matches!(d, Decision::Proceed(_)), "{d:?}");
        }
        let syncs = stats.fsync_seconds.snapshot().2 - syncs_before;
        let (buckets, _, _) = stats.batch_size.snapshot();
        let size = |bound: f64| buckets.iter().find(|b| b.0 == bound).map_or(0, |b| b.1);
        assert!(size(16.0) > 0, "no batch of 9 to 16: {buckets:?}");
        let above: u64 = buckets.iter().filter(|b| b.0 > 16.0).map(|b| b.1).sum();
        assert_eq!(above, 0, "a batch above the limit: {buckets:?}");
        // ceil(100 / 16) = 7 batches once all are queued; a few more if some queued late.
        assert!(syncs <= 12, "{syncs} syncs for 100 queued reserves");
    });
    owner.stop();
}
