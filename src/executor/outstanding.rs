//! The orders at an executor right now, by entry: what an operator must not release blindly.
//!
//! A pending key is one of two things: a trade whose order is still out, its outcome not
//! yet known, or one held after an unknown outcome (a 504) or a crash. Only the second is
//! the operator's to release after checking the exchange. Releasing the first lets a retry
//! through while the first order may still fill, and that order's commit then finds the
//! key gone, leaving the rest of its TTL unguarded. So the admin face tells the two apart
//! (`in_flight`), and refuses to release the first unless forced.
//!
//! A webhook marks its key (and its signature guard's) before its reserve is sent, and
//! binds each mark to the entry the reserve made once it is granted: a mark is about one
//! entry, not about whatever holds the key. A retry of a held trade marks the key while
//! its reserve is asked and lets go at its 409; bound to nothing, that mark never makes the
//! held entry read as out. A mark not bound yet may be the reserve that made the entry
//! an operator looks at, answered but not yet bound: `orders_out` waits for the marks
//! unbound when it asks, a reserve's round trip, rather than guess.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::mutex::{Grant, Key};

/// How much longer than a reserve can take (the mutex's deadline, `store.timeout`)
/// `orders_out` waits for a mark to be bound or let go. A mark still unbound then reads as
/// out: refusing an unforced release is the safe answer.
const BIND_SLACK: Duration = Duration::from_secs(1);

/// The marks of each key, by mark. A `Key` is inline: a webhook's marks cost it an
/// uncontended lock to take (one mark, two with a signature guard), one to bind, and one
/// to drop.
#[derive(Debug)]
pub struct Outstanding {
    marks: Mutex<HashMap<Key, Vec<Mark>>>,
    next: AtomicU64,
    /// The longest `orders_out` waits: the mutex's deadline and [`BIND_SLACK`].
    bind_wait: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Mark {
    id: u64,
    /// The entry the reserve made (its sequence number), once granted.
    entry: Option<u64>,
}

impl Outstanding {
    /// Marks a trade's `key`, and its signature `guard` if it has one, until the returned
    /// value is dropped: after the order's commit or release is queued.
    pub fn begin(self: &Arc<Self>, key: &Key, guard: Option<&Key>) -> Out {
        let mut map = self.map();
        let marks = std::iter::once(key)
            .chain(guard)
            .map(|key| {
                let id = self.next.fetch_add(1, Ordering::Relaxed);
                map.entry(key.clone())
                    .or_default()
                    .push(Mark { id, entry: None });
                (key.clone(), id)
            })
            .collect();
        Out {
            set: self.clone(),
            marks,
        }
    }

    /// For a mutex whose reserves take `deadline` at most (`Mutex::deadline`).
    pub fn for_deadline(deadline: Duration) -> Self {
        Outstanding {
            marks: Mutex::default(),
            next: AtomicU64::default(),
            bind_wait: deadline + BIND_SLACK,
        }
    }

    /// Whether the order that made each entry (`key`, its sequence number) is out. Waits
    /// for the marks of those keys not yet bound to be bound or let go (at most
    /// `bind_wait`, for all of them together): one of them may be the reserve that made
    /// the entry. Marks taken after the call cannot be: the entry is made already.
    pub async fn orders_out(&self, entries: &[(&Key, u64)]) -> Vec<bool> {
        let unbound: Vec<Vec<u64>> = {
            let map = self.map();
            entries
                .iter()
                .map(|(key, _)| {
                    let marks = map.get(*key).map_or(&[][..], Vec::as_slice);
                    marks
                        .iter()
                        .filter(|m| m.entry.is_none())
                        .map(|m| m.id)
                        .collect()
                })
                .collect()
        };
        let until = tokio::time::Instant::now() + self.bind_wait;
        let mut answers: Vec<Option<bool>> = vec![None; entries.len()];
        loop {
            // Each entry decided under one look at the map (a mark bound between two looks
            // would be in neither), and only those not decided yet looked at again.
            {
                let map = self.map();
                let undecided = answers.iter_mut().zip(entries).zip(&unbound);
                for ((answer, (key, entry)), waited) in undecided.filter(|a| a.0.0.is_none()) {
                    let marks = map.get(*key).map_or(&[][..], Vec::as_slice);
                    *answer = decide(marks, *entry, waited);
                }
            }
            if answers.iter().all(Option::is_some) || tokio::time::Instant::now() >= until {
                // Still unbound at the end: out, the answer that refuses a release.
                return answers.into_iter().map(|a| a.unwrap_or(true)).collect();
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// How many orders are out now: reserves granted whose order is not settled yet (a
    /// signature guard's mark is its trade's, not an order of its own). What an operator
    /// waits to see at 0 before a restart.
    pub fn count(&self) -> usize {
        self.map()
            .iter()
            .filter(|(key, _)| !key.is_guard())
            .map(|(_, marks)| marks.iter().filter(|m| m.entry.is_some()).count())
            .sum()
    }

    /// `orders_out` for one entry.
    pub async fn order_out(&self, key: &Key, entry: u64) -> bool {
        self.orders_out(&[(key, entry)]).await == [true]
    }

    // The map is whole after any panic (each change is one call), so a poisoned lock is
    // still served.
    fn map(&self) -> MutexGuard<'_, HashMap<Key, Vec<Mark>>> {
        self.marks.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether the order that made `entry` is out, given its key's `marks` and the ids of the
/// marks that were unbound when asked (`waited`): yes if a mark is bound to it, no once
/// none of those is still unbound, else not known yet.
fn decide(marks: &[Mark], entry: u64, waited: &[u64]) -> Option<bool> {
    if marks.iter().any(|m| m.entry == Some(entry)) {
        Some(true)
    } else if marks
        .iter()
        .any(|m| m.entry.is_none() && waited.contains(&m.id))
    {
        None
    } else {
        Some(false)
    }
}

/// One order's marks; dropping it says the order is settled.
#[derive(Debug)]
pub struct Out {
    set: Arc<Outstanding>,
    marks: Vec<(Key, u64)>,
}

impl Out {
    /// The reserve was granted: each mark is bound to the entry it made for its key.
    pub fn granted(&self, grant: &Grant) {
        let guard = grant.guard();
        for (key, _) in &self.marks {
            let entry = if key == grant.key() {
                Some(grant.seq())
            } else {
                guard.filter(|g| g.key() == key).map(Grant::seq)
            };
            if let Some(entry) = entry {
                self.bind(key, entry);
            }
        }
    }

    /// Binds this order's mark of `key` to the entry `entry`.
    pub fn bind(&self, key: &Key, entry: u64) {
        let mut map = self.set.map();
        let ids = self
            .marks
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, id)| id);
        if let Some(marks) = map.get_mut(key) {
            for id in ids {
                for m in marks.iter_mut().filter(|m| m.id == *id) {
                    m.entry = Some(entry);
                }
            }
        }
    }
}

impl Drop for Out {
    fn drop(&mut self) {
        let mut map = self.set.map();
        for (key, id) in &self.marks {
            if let Some(marks) = map.get_mut(key) {
                marks.retain(|m| m.id != *id);
                if marks.is_empty() {
                    map.remove(key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Key {
        Key::from_stored(&format!("client:psk:live:{k}")).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn an_entry_is_out_while_an_order_bound_to_it_is() {
        let set = Arc::new(Outstanding::for_deadline(crate::mutex::DEADLINE));
        let (k, j) = (key("k"), key("j"));
        let a = set.begin(&k, None);
        a.bind(&k, 7);
        let b = set.begin(&k, None);
        b.bind(&k, 8);
        assert!(set.order_out(&k, 7).await && set.order_out(&k, 8).await);
        assert!(!set.order_out(&k, 9).await && !set.order_out(&j, 7).await);
        drop(a);
        assert!(!set.order_out(&k, 7).await && set.order_out(&k, 8).await);
        drop(b);
        assert!(!set.order_out(&k, 8).await);
        assert!(set.map().is_empty(), "{:?}", set.map());
    }

    /// Decided under one look: a mark bound since the question is the entry's order.
    #[test]
    fn a_mark_bound_since_the_question_is_out() {
        let mark = |id, entry| Mark { id, entry };
        assert_eq!(decide(&[mark(1, None)], 7, &[1]), None);
        assert_eq!(decide(&[mark(1, Some(7))], 7, &[1]), Some(true));
        assert_eq!(decide(&[mark(1, Some(8))], 7, &[1]), Some(false));
        assert_eq!(decide(&[], 7, &[1]), Some(false));
        // Taken after the question: not waited for.
        assert_eq!(decide(&[mark(2, None)], 7, &[1]), Some(false));
    }

    /// Unbound marks are waited for: a retry's 409 lets go, and the entry is not out; the
    /// reserve that made the entry binds, and it is; one that never says reads as out.
    #[tokio::test(start_paused = true)]
    async fn an_unbound_mark_is_waited_for() {
        let set = Arc::new(Outstanding::for_deadline(crate::mutex::DEADLINE));
        let k = key("k");

        let retry = set.begin(&k, None);
        let ask = tokio::spawn({
            let (set, k) = (set.clone(), k.clone());
            async move { set.order_out(&k, 7).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!ask.is_finished(), "answered before the mark was settled");
        drop(retry);
        assert!(!ask.await.unwrap());

        let maker = set.begin(&k, None);
        let ask = tokio::spawn({
            let (set, k) = (set.clone(), k.clone());
            async move { set.order_out(&k, 7).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        maker.bind(&k, 7);
        assert!(ask.await.unwrap());
        drop(maker);

        let silent = set.begin(&k, None);
        let started = tokio::time::Instant::now();
        assert!(set.order_out(&k, 7).await);
        assert!(started.elapsed() >= crate::mutex::DEADLINE + BIND_SLACK);
        // A longer store.timeout is waited out too: a reserve may take that long.
        let slow = Arc::new(Outstanding::for_deadline(Duration::from_secs(5)));
        let _silent = slow.begin(&k, None);
        let started = tokio::time::Instant::now();
        assert!(slow.order_out(&k, 7).await);
        assert!(
            started.elapsed() >= Duration::from_secs(6),
            "{:?}",
            started.elapsed()
        );
        // Bound to another entry, it is not this one's.
        silent.bind(&k, 3);
        assert!(!set.order_out(&k, 7).await);
    }

    /// A grant binds each of its trade's marks to the entry it made for that mark's key:
    /// the trade's key to the trade's entry, the signature guard's to the guard's. Only
    /// the trade's mark counts as an order out (`count`), once bound.
    #[tokio::test]
    async fn a_grant_binds_each_mark_to_its_own_entry() {
        use crate::mutex::{Clock, Config, Decision, Guard, Reserve};
        let dir = tempfile::tempdir().unwrap();
        let config = Config {
            path: dir.path().join("m.redb"),
            ..Config::default()
        };
        let (m, owner) = crate::mutex::start(config, Clock::system());
        let (k, g) = (key("k"), Key::signature(&[1; 32]));
        let set = Arc::new(Outstanding::for_deadline(crate::mutex::DEADLINE));
        let out = set.begin(&k, Some(&g));
        assert_eq!(set.count(), 0, "not granted yet");
        let req = Reserve {
            key: k.clone(),
            ttl: Duration::from_secs(60),
            payload_hash: [1; 32],
            guard: Some(Guard {
                key: g.clone(),
                ttl: Duration::from_secs(60),
                when_turned_away: true,
            }),
        };
        let grant = match m.reserve(req).await {
            Decision::Proceed(grant) => grant,
            d => panic!("not granted: {d:?}"),
        };
        out.granted(&grant);
        assert_eq!(set.count(), 1, "the trade is out; its guard is no order");
        let guard = grant.guard().expect("the guard's entry");
        assert!(set.order_out(&k, grant.seq()).await);
        assert!(set.order_out(&g, guard.seq()).await);
        assert!(!set.order_out(&k, guard.seq()).await);
        assert!(!set.order_out(&g, grant.seq()).await);
        // A plain trade bound too: two orders out.
        let plain = key("plain");
        let other = set.begin(&plain, None);
        other.bind(&plain, grant.seq() + 100);
        assert_eq!(set.count(), 2);
        drop((out, other));
        assert_eq!(set.count(), 0);
        drop(m);
        owner.stop();
    }
}
