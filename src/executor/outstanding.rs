//! The orders at an executor right now, by key: what an operator must not release blindly.
//!
//! A pending key is one of two things: a trade whose order is still out, its outcome not
//! yet known, or one held after an unknown outcome (a 504) or a crash. Only the second is
//! the operator's to release after checking the exchange. Releasing the first lets a retry
//! through while the first order may still fill, and that order's commit then finds the
//! key gone, leaving the rest of its TTL unguarded. So the admin face tells the two apart
//! (`in_flight`), and refuses to release the first unless forced.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::mutex::Key;

/// Keys with an order out, each with how many (one, unless an operator forced a release
/// and a retry went out beside it). A `Key` is inline (no allocation): the mark costs a
/// webhook one uncontended lock and a map entry each way.
#[derive(Debug, Default)]
pub struct Outstanding(Mutex<HashMap<Key, u32>>);

impl Outstanding {
    /// Marks an order for `key` as out until the returned guard is dropped: after its
    /// commit or release is queued.
    pub fn begin(self: &Arc<Self>, key: &Key) -> Out {
        *self.map().entry(key.clone()).or_insert(0) += 1;
        Out {
            set: self.clone(),
            key: key.clone(),
        }
    }

    /// Whether an order for `key` is out.
    pub fn contains(&self, key: &Key) -> bool {
        self.map().contains_key(key)
    }

    // The map is whole after any panic (each change is one call), so a poisoned lock is
    // still served.
    fn map(&self) -> MutexGuard<'_, HashMap<Key, u32>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One order out; dropping it says the order is settled.
#[derive(Debug)]
pub struct Out {
    set: Arc<Outstanding>,
    key: Key,
}

impl Drop for Out {
    fn drop(&mut self) {
        let mut map = self.set.map();
        if let Some(n) = map.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_out_while_any_of_its_orders_is() {
        let key = |k: &str| Key::from_stored(&format!("client:psk:live:{k}")).unwrap();
        let set = Arc::new(Outstanding::default());
        let a = set.begin(&key("k"));
        let b = set.begin(&key("k"));
        assert!(set.contains(&key("k")) && !set.contains(&key("j")));
        drop(a);
        assert!(set.contains(&key("k")));
        drop(b);
        assert!(!set.contains(&key("k")));
    }
}
