//! Many callers race for the same key: exactly one may proceed.

mod mutex_support;

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
