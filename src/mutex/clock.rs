//! Time, as the mutex sees it.
//!
//! Two clocks, for two jobs. Persisted times (`stored_at`, `expires_at`) are unix
//! milliseconds from the wall clock, because they must survive a restart. The alarm wheel
//! runs on a monotonic clock, because a wall clock stepped by NTP must not fire a whole
//! wheel of alarms at once. Tests swap both for a [`ManualClock`] and move time without
//! sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The clock the owner reads. Cheap to clone.
#[derive(Clone, Debug)]
pub enum Clock {
    /// The operating system's clocks.
    System(Instant),
    /// A clock that only moves when a test says so.
    Manual(Arc<ManualClock>),
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl Clock {
    pub fn system() -> Self {
        Clock::System(Instant::now())
    }

    /// A manual clock starting at `wall_ms`; returns the handle tests advance.
    pub fn manual(wall_ms: u64) -> (Self, Arc<ManualClock>) {
        let m = Arc::new(ManualClock {
            wall: AtomicU64::new(wall_ms),
            mono: AtomicU64::new(0),
        });
        (Clock::Manual(m.clone()), m)
    }

    /// Wall-clock unix milliseconds.
    pub fn wall_ms(&self) -> u64 {
        match self {
            Clock::System(_) => unix_ms(),
            Clock::Manual(m) => m.wall.load(Ordering::SeqCst),
        }
    }

    /// Monotonic milliseconds since this clock was made.
    pub fn mono_ms(&self) -> u64 {
        match self {
            Clock::System(start) => start.elapsed().as_millis() as u64,
            Clock::Manual(m) => m.mono.load(Ordering::SeqCst),
        }
    }
}

/// The wall clock in unix milliseconds. A clock before 1970 reads as 0.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[derive(Debug)]
pub struct ManualClock {
    wall: AtomicU64,
    mono: AtomicU64,
}

impl ManualClock {
    /// Moves both clocks forward together.
    pub fn advance_ms(&self, ms: u64) {
        self.wall.fetch_add(ms, Ordering::SeqCst);
        self.mono.fetch_add(ms, Ordering::SeqCst);
    }

    /// Steps the wall clock alone, forward, as NTP or an operator can.
    pub fn step_wall_ms(&self, ms: u64) {
        self.wall.fetch_add(ms, Ordering::SeqCst);
    }

    /// Steps the wall clock alone, back, as NTP or an operator can too.
    pub fn step_wall_back_ms(&self, ms: u64) {
        self.wall.fetch_sub(ms, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_clock_reads_unix_milliseconds() {
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let clock = Clock::system();
        let (wall, free) = (clock.wall_ms(), unix_ms());
        let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        for ms in [wall, free] {
            assert!(
                before.as_millis() as u64 <= ms && ms <= after.as_millis() as u64,
                "{ms} outside [{before:?}, {after:?}]"
            );
        }
    }

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let (clock, hand) = Clock::manual(5_000);
        assert_eq!((clock.wall_ms(), clock.mono_ms()), (5_000, 0));
        hand.advance_ms(250);
        assert_eq!((clock.wall_ms(), clock.mono_ms()), (5_250, 250));
        hand.step_wall_ms(1_000);
        assert_eq!((clock.wall_ms(), clock.mono_ms()), (6_250, 250));
        hand.step_wall_back_ms(6_000);
        assert_eq!((clock.wall_ms(), clock.mono_ms()), (250, 250));
    }
}
