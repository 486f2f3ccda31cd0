//! The alarm wheel over expiries.
//!
//! A hashed timing wheel: `SLOTS` buckets of `TICK_MS` each, an alarm lands in the bucket
//! of its due tick modulo the wheel, and carries its due tick so that an alarm more than
//! one lap away stays put until its lap comes round. Insert is O(1); a tick visits one
//! bucket.
//!
//! Why hashed and not hierarchical: TTLs span 1 s to 24 h, but nearly all keys share the
//! default TTL (300 s), which fits in one lap (4096 × 100 ms ≈ 410 s), so almost every
//! alarm is touched exactly once, when it fires. A 24 h key is looked at ~210 times over
//! its life, which costs less than the cascading a hierarchical wheel would do for it,
//! and the code is a third of the size. Precision is one tick: expiry is *decided* from
//! both clocks at reserve time (an expired entry counts as absent), so the wheel only
//! reclaims storage and may be late by a tick without changing an answer.
//!
//! The wheel runs on the monotonic clock: a wall clock stepped by NTP must not fire a
//! lap of alarms at once. An occupancy bitmap finds the next non-empty bucket in
//! SLOTS/64 word reads, so the owner can sleep exactly until it.

pub const TICK_MS: u64 = 100;
pub const SLOTS: usize = 4096;

pub struct Wheel<T> {
    tick_ms: u64,
    slots: Vec<Vec<(u64, T)>>,
    occupied: Vec<u64>,
    /// The next tick not yet processed.
    cursor: u64,
    len: usize,
    /// Where `sweep` goes on from, and how many buckets it has looked at in this pass.
    sweep_slot: usize,
    swept: usize,
}

impl<T> Wheel<T> {
    /// A wheel whose first tick is the one containing `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self::with_geometry(now_ms, TICK_MS, SLOTS)
    }

    /// `slots` is rounded up to a multiple of 64 (the bitmap's word), and to 64 at least.
    pub fn with_geometry(now_ms: u64, tick_ms: u64, slots: usize) -> Self {
        let slots = slots.max(64).next_multiple_of(64);
        Wheel {
            tick_ms: tick_ms.max(1),
            slots: (0..slots).map(|_| Vec::new()).collect(),
            occupied: vec![0; slots / 64],
            cursor: now_ms / tick_ms.max(1),
            len: 0,
            sweep_slot: 0,
            swept: 0,
        }
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many alarms it holds, stale ones included.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Keeps only the alarms `keep` says yes to, going on over the buckets from where the
    /// last call stopped until it has looked at `budget` alarms or more (a bucket counts one
    /// besides its alarms, so empty ones are not free), or has ended a pass over every
    /// bucket. In steps, so that a wheel of millions is swept without holding up its owner
    /// for the whole of it; `usize::MAX` ends the pass in one call.
    pub fn sweep(&mut self, budget: usize, mut keep: impl FnMut(&T) -> bool) {
        let mut looked = 0usize;
        while looked < budget {
            let slot = self.sweep_slot;
            let bucket = &mut self.slots[slot];
            let before = bucket.len();
            looked = looked.saturating_add(1 + before);
            bucket.retain(|(_, item)| keep(item));
            self.len -= before - bucket.len();
            if bucket.is_empty() {
                self.occupied[slot / 64] &= !(1 << (slot % 64));
                // A flood's worth of stale alarms must not stay allocated either.
                bucket.shrink_to(0);
            }
            self.sweep_slot = (slot + 1) % self.slots.len();
            self.swept += 1;
            if self.swept == self.slots.len() {
                self.swept = 0;
                return;
            }
        }
    }

    /// Whether a pass of `sweep` is under way: begun, and not yet over every bucket.
    pub fn sweeping(&self) -> bool {
        self.swept > 0
    }

    /// Schedules `item` to fire once the clock reaches `due_ms`. Rounded up to a tick, so
    /// an alarm never fires early; one already due fires at the next tick.
    pub fn insert(&mut self, due_ms: u64, item: T) {
        let tick = due_ms.div_ceil(self.tick_ms).max(self.cursor);
        let slot = self.slot(tick);
        self.slots[slot].push((tick, item));
        self.occupied[slot / 64] |= 1 << (slot % 64);
        self.len += 1;
    }

    /// Moves due alarms (those at or before `now_ms`) into `out`, at most `limit` of them,
    /// so a burst of expiries is spread over several turns of the owner loop. Call again
    /// while it returns `limit` items.
    pub fn poll(&mut self, now_ms: u64, limit: usize, out: &mut Vec<T>) {
        let now = now_ms / self.tick_ms;
        let n = self.slots.len() as u64;
        // One lap visits every bucket: after a long sleep (or a test's clock jump) there
        // is no need to walk each tick in between.
        let end = now.min(self.cursor.saturating_add(n - 1));
        let mut tick = self.cursor;
        while tick <= end {
            let slot = self.slot(tick);
            if self.occupied[slot / 64] & (1 << (slot % 64)) != 0 {
                let bucket = &mut self.slots[slot];
                let mut i = 0;
                while i < bucket.len() {
                    if out.len() >= limit {
                        // Resume at this bucket: it may hold more that are due.
                        self.cursor = tick;
                        return;
                    }
                    if bucket[i].0 <= now {
                        out.push(bucket.swap_remove(i).1);
                        self.len -= 1;
                    } else {
                        i += 1;
                    }
                }
                if bucket.is_empty() {
                    self.occupied[slot / 64] &= !(1 << (slot % 64));
                }
            }
            tick += 1;
        }
        if now >= self.cursor {
            self.cursor = now + 1;
        }
    }

    /// When the next non-empty bucket comes due, in the clock's ms; `None` when empty. It
    /// may hold only alarms of a later lap, in which case the owner wakes for nothing and
    /// asks again: cheap, and rare with TTLs inside one lap.
    pub fn next_due_ms(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let n = self.slots.len();
        let start = self.slot(self.cursor);
        let words = self.occupied.len();
        // Scan the bitmap from the cursor's bucket, wrapping once.
        for step in 0..=words {
            let w = (start / 64 + step) % words;
            let mut bits = self.occupied[w];
            if step == 0 {
                bits &= !0u64 << (start % 64);
            } else if step == words {
                bits &= !(!0u64 << (start % 64));
            }
            if bits != 0 {
                let slot = w * 64 + bits.trailing_zeros() as usize;
                let ahead = (slot + n - start) % n;
                return Some((self.cursor + ahead as u64) * self.tick_ms);
            }
        }
        None
    }

    fn slot(&self, tick: u64) -> usize {
        (tick % self.slots.len() as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(w: &mut Wheel<u32>, now: u64) -> Vec<u32> {
        let mut out = Vec::new();
        w.poll(now, usize::MAX, &mut out);
        out.sort();
        out
    }

    #[test]
    fn a_sweep_drops_alarms_and_keeps_the_rest_due() {
        let mut w = Wheel::with_geometry(0, 10, 64);
        for i in 0..10u32 {
            w.insert(10 + u64::from(i) * 100, i);
        }
        w.sweep(usize::MAX, |i| i % 3 == 0);
        assert!(!w.sweeping());
        assert_eq!(w.len(), 4);
        assert_eq!(w.next_due_ms(), Some(10));
        assert_eq!(drain(&mut w, 10_000), vec![0, 3, 6, 9]);
        assert!(w.is_empty());
        assert_eq!(w.next_due_ms(), None);
    }

    #[test]
    fn a_sweep_goes_in_steps_of_its_budget() {
        // 64 buckets of 10 alarms: 704 to look at in a pass, counting each bucket one.
        let mut w = Wheel::with_geometry(0, 10, 64);
        for i in 0..640u32 {
            w.insert(u64::from(i % 64) * 10, i);
        }
        let mut steps = 0;
        loop {
            let before = w.len();
            steps += 1;
            w.sweep(50, |i| i % 10 == 0);
            // A step ends in the bucket that takes it to its budget: at most 50 + 10.
            assert!(
                before - w.len() <= 60,
                "step {steps} dropped {}",
                before - w.len()
            );
            if !w.sweeping() {
                break;
            }
            assert!(steps < 64, "a pass never ended");
        }
        assert_eq!(steps, 13); // 5 buckets a step: 55 looked at

        assert_eq!(w.len(), 64);
        // The next pass starts where this one ended, and looks at every bucket again.
        w.sweep(usize::MAX, |i| i % 20 == 0);
        assert_eq!(w.len(), 32);
        assert_eq!(
            drain(&mut w, 10_000),
            (0..640).filter(|i| i % 20 == 0).collect::<Vec<_>>()
        );
    }

    #[test]
    fn fires_at_or_after_due_never_before() {
        let mut w = Wheel::with_geometry(0, 10, 64);
        w.insert(25, 1);
        w.insert(30, 2);
        w.insert(31, 3);
        assert_eq!(drain(&mut w, 29), Vec::<u32>::new());
        assert_eq!(drain(&mut w, 30), vec![1, 2]);
        assert_eq!(drain(&mut w, 39), Vec::<u32>::new());
        assert_eq!(drain(&mut w, 40), vec![3]);
        assert!(w.is_empty());
    }

    #[test]
    fn alarms_beyond_one_lap_wait_for_their_lap() {
        // 64 slots of 10 ms: one lap is 640 ms.
        let mut w = Wheel::with_geometry(0, 10, 64);
        w.insert(10, 1);
        w.insert(10 + 640, 2);
        w.insert(10 + 5 * 640, 3);
        assert_eq!(drain(&mut w, 10), vec![1]);
        assert_eq!(drain(&mut w, 649), Vec::<u32>::new());
        assert_eq!(drain(&mut w, 650), vec![2]);
        assert_eq!(drain(&mut w, 3209), Vec::<u32>::new());
        assert_eq!(drain(&mut w, 3210), vec![3]);
    }

    #[test]
    fn a_long_jump_fires_everything_due_in_one_pass() {
        let mut w = Wheel::with_geometry(0, 100, 4096);
        for i in 0..1000u32 {
            w.insert(1000 + u64::from(i) * 86_400, i);
        }
        let got = drain(&mut w, 100 * 86_400_000);
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
        assert!(w.is_empty());
    }

    #[test]
    fn poll_respects_the_limit_and_resumes() {
        let mut w = Wheel::with_geometry(0, 10, 64);
        for i in 0..25u32 {
            w.insert(20 + u64::from(i % 3), i);
        }
        let mut all = Vec::new();
        loop {
            let mut out = Vec::new();
            w.poll(100, 10, &mut out);
            assert!(out.len() <= 10);
            let n = out.len();
            all.extend(out);
            if n < 10 {
                break;
            }
        }
        all.sort();
        assert_eq!(all, (0..25).collect::<Vec<_>>());
    }

    #[test]
    fn past_alarms_fire_on_the_next_tick() {
        let mut w = Wheel::with_geometry(1000, 10, 64);
        w.poll(5000, usize::MAX, &mut Vec::new());
        w.insert(10, 7);
        assert_eq!(w.next_due_ms(), Some(5010));
        assert_eq!(drain(&mut w, 5010), vec![7]);
    }

    #[test]
    fn next_due_finds_the_nearest_bucket_across_the_wrap() {
        let mut w = Wheel::with_geometry(0, 10, 128);
        assert_eq!(w.next_due_ms(), None);
        w.insert(1200, 1); // tick 120, slot 120
        assert_eq!(w.next_due_ms(), Some(1200));
        drain(&mut w, 1100); // cursor at tick 111
        w.insert(1300, 2); // tick 130, slot 2 after the wrap
        assert_eq!(w.next_due_ms(), Some(1200));
        assert_eq!(drain(&mut w, 1200), vec![1]);
        assert_eq!(w.next_due_ms(), Some(1300));
        assert_eq!(drain(&mut w, 1300), vec![2]);
        assert_eq!(w.next_due_ms(), None);

        // The only alarm sits below the cursor in the cursor's own bitmap word: found on
        // the scan's last step, the wrap back into that word.
        let mut w = Wheel::with_geometry(0, 10, 128);
        drain(&mut w, 95); // cursor at tick 10, slot 10 of word 0
        w.insert(1330, 3); // tick 133, slot 5 of word 0, one lap on
        assert_eq!(w.next_due_ms(), Some(1330));
        assert_eq!(drain(&mut w, 1329), Vec::<u32>::new());
        assert_eq!(drain(&mut w, 1330), vec![3]);
    }

    #[test]
    fn never_fires_early_under_random_use() {
        // One bitmap word, alarms up to ~5 laps ahead.
        random_use(64, 3000);
        // Four words, alarms within one lap: the bitmap scan crosses words and wraps.
        random_use(256, 2500);
    }

    /// Random inserts and polls on a wheel of `slots` 10 ms ticks, alarms due up to
    /// `spread` ms ahead. Each alarm fires once, at or after its due time and within a
    /// tick and a step of it; the next due time is never later than the earliest alarm,
    /// and is exactly it whenever every alarm is within one lap.
    fn random_use(slots: usize, spread: u64) {
        // A small deterministic LCG keeps the test reproducible without a dependency.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move |m: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % m
        };
        let mut w = Wheel::with_geometry(0, 10, slots);
        let mut due = std::collections::HashMap::new();
        let mut now = 0u64;
        for id in 0..5000u32 {
            let d = now + rnd(spread);
            w.insert(d, id);
            due.insert(id, d);
            now += rnd(30);
            let mut out = Vec::new();
            w.poll(now, usize::MAX, &mut out);
            for id in out {
                let d = due.remove(&id).expect("fired once");
                assert!(d <= now, "fired {id} at {now}, due {d}");
                assert!(now - d < 10 + 30, "fired {id} late: {now} vs {d}");
            }
            let earliest = due.values().map(|&d| d.div_ceil(10)).min();
            let next = w.next_due_ms();
            assert_eq!(next.is_some(), earliest.is_some());
            if let (Some(next), Some(earliest)) = (next, earliest) {
                assert!(next <= earliest * 10, "wakes at {next}, after {earliest}0");
                let cursor = now / 10 + 1;
                let latest = due.values().map(|&d| d.div_ceil(10)).max().unwrap_or(0);
                if latest < cursor + slots as u64 {
                    assert_eq!(next, earliest * 10, "at {now}, {slots} slots");
                }
            }
        }
        now += 10_000;
        let mut out = Vec::new();
        w.poll(now, usize::MAX, &mut out);
        for id in out {
            due.remove(&id);
        }
        assert!(due.is_empty());
        assert!(w.is_empty());
    }
}
