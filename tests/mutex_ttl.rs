//! TTL: expired keys are free again, and the wheel deletes them so the table and the file
//! stay the size of the live set however many TTLs go by.

mod mutex_support;

use std::time::Duration;

use hoox_edge::mutex::{Clock, Decision, Snapshot};
use mutex_support::*;
use redb::{ReadableDatabase, ReadableTableMetadata};

const T0: u64 = 1_800_000_000_000;

fn table_len(path: &std::path::Path) -> u64 {
    let db = redb::Database::create(path).unwrap();
    let t = db.begin_read().unwrap();
    let def: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("entries");
    t.open_table(def).unwrap().len().unwrap()
}

#[test]
fn expiry_frees_keys_and_the_file_does_not_grow() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let (clock, time) = Clock::manual(T0);
    let (m, owner) = start(&path, clock);
    let mut sizes = Vec::new();
    rt().block_on(async {
        for cycle in 0..20 {
            // Concurrent callers, so the reserves share group commits.
            let tasks: Vec<_> = (0..1500)
                .map(|i| {
                    let m = m.clone();
                    tokio::spawn(async move {
                        // Half the names come back every cycle; half are new each time.
                        let name = if i % 2 == 0 {
                            format!("same-{i}")
                        } else {
                            format!("c{cycle}-{i}")
                        };
                        let k = key(&name);
                        let d = m.reserve(reserve(&k, 1_000, (cycle % 2) as u8)).await;
                        let Decision::Proceed(g) = d else {
                            panic!("cycle {cycle}: {name} must be free, got {d:?}");
                        };
                        if i % 3 == 0 {
                            let body = vec![b'x'; 512];
                            m.commit(g, Some(Snapshot { status: 200, body })).unwrap();
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            assert_eq!(m.ping().await.unwrap().live_keys, 1500);
            time.advance_ms(1_000);
            // The wheel deletes in batches, a few turns of the owner loop.
            let purged = eventually(Duration::from_secs(10), async || {
                m.ping().await.unwrap().live_keys == 0
            })
            .await;
            assert!(purged, "cycle {cycle}: expired keys were not purged");
            sizes.push(std::fs::metadata(&path).unwrap().len());
        }
    });
    owner.stop();
    assert_eq!(table_len(&path), 0, "the table holds no expired entries");
    // redb's file breathes as pages are reused (it varies by a factor of two from one
    // cycle to the next here), but it must not trend upward: 30 000 entries were written,
    // several MB if they were kept, against one cycle's worth live at a time.
    let early = sizes[..5].iter().max().unwrap();
    let late = sizes[10..].iter().max().unwrap();
    assert!(
        late <= &(early * 2),
        "file grew from {early} to {late}: {sizes:?}"
    );
    let expired = m
        .shared()
        .stats
        .expired
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(expired, 20 * 1500, "every entry was deleted by the wheel");
}

/// The owner wakes for its alarms by itself: keys expire, and the live-key gauge the
/// metrics read without a round trip falls to zero, while nobody asks the mutex anything.
#[test]
fn keys_expire_while_nobody_asks() {
    let dir = tempfile::tempdir().unwrap();
    let (m, owner) = start(&dir.path().join("m.redb"), Clock::system());
    let live = || {
        m.shared()
            .live_keys
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    rt().block_on(async {
        // 50 reserves at once (a batch or a few, not 50 syncs in a row): none expires
        // before the count below, even on a slow disk.
        let started = std::time::Instant::now();
        let reserves: Vec<_> = (0..50)
            .map(|i| {
                let m = m.clone();
                tokio::spawn(async move {
                    m.reserve(reserve(&key(&format!("idle-{i}")), 3_000, 1))
                        .await
                })
            })
            .collect();
        for r in reserves {
            let d = r.await.unwrap();
            assert!(matches!(d, Decision::Proceed(_)), "{d:?}");
        }
        let reserving = started.elapsed();
        assert_eq!(live(), 50, "reserving took {reserving:?}");
        // No command from here on: only the owner's own wake-ups can expire them.
        let expired = eventually(Duration::from_secs(30), async || live() == 0).await;
        assert!(expired, "{} keys still live with no traffic", live());
    });
    owner.stop();
}
