//! Time, as the mutex sees it.
//!
//! Three clocks, for three jobs. Persisted times (`stored_at`, `expires_at`) are unix
//! milliseconds from the wall clock, because they must survive a reboot. The alarm wheel
//! runs on a monotonic clock, because a wall clock stepped by NTP must not fire a whole
//! wheel of alarms at once. An entry also keeps its deadline on the boot clock
//! (`CLOCK_BOOTTIME`, with the kernel's boot id): it survives a restart of the process
//! within the same boot, and no step of the wall clock moves it. Tests swap all three for a
//! [`ManualClock`] and move time without sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The clock the owner reads. Cheap to clone.
#[derive(Clone, Debug)]
pub enum Clock {
    /// The operating system's clocks.
    System {
        start: Instant,
        /// This boot's id, read once: `None` where `/proc/sys` is not readable.
        boot_id: Option<u128>,
    },
    /// A clock that only moves when a test says so.
    Manual(Arc<ManualClock>),
}

/// Which boot this is, and how long since it began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Boot {
    /// The kernel's random id for this boot: another boot has another.
    pub id: u128,
    /// Milliseconds since the boot, counting suspend (`CLOCK_BOOTTIME`).
    pub ms: u64,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl Clock {
    pub fn system() -> Self {
        Clock::System {
            start: Instant::now(),
            boot_id: read_boot_id(),
        }
    }

    /// A manual clock starting at `wall_ms`; returns the handle tests advance.
    pub fn manual(wall_ms: u64) -> (Self, Arc<ManualClock>) {
        let m = Arc::new(ManualClock {
            wall: AtomicU64::new(wall_ms),
            mono: AtomicU64::new(0),
            boot: AtomicU64::new(new_boot_id()),
        });
        (Clock::Manual(m.clone()), m)
    }

    /// Wall-clock unix milliseconds.
    pub fn wall_ms(&self) -> u64 {
        match self {
            Clock::System { .. } => unix_ms(),
            Clock::Manual(m) => m.wall.load(Ordering::SeqCst),
        }
    }

    /// Monotonic milliseconds since this clock was made.
    pub fn mono_ms(&self) -> u64 {
        match self {
            Clock::System { start, .. } => start.elapsed().as_millis() as u64,
            Clock::Manual(m) => m.mono.load(Ordering::SeqCst),
        }
    }

    /// This boot and the time since it began; `None` if the system does not say which
    /// boot this is (then only the wall clock survives a restart).
    pub fn boot(&self) -> Option<Boot> {
        match self {
            Clock::System { boot_id, .. } => Some(Boot {
                id: (*boot_id)?,
                ms: boottime_ms()?,
            }),
            // One boot per manual clock, until a test reboots it; its boot clock runs with
            // its monotonic one, an hour ahead, as a process started after the boot sees.
            Clock::Manual(m) => Some(Boot {
                id: u128::from(m.boot.load(Ordering::SeqCst)),
                ms: m.mono.load(Ordering::SeqCst) + MANUAL_UPTIME_MS,
            }),
        }
    }
}

/// The kernel's boot id (`/proc/sys/kernel/random/boot_id`, a UUID), as a number.
fn read_boot_id() -> Option<u128> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
    u128::from_str_radix(&hex, 16)
        .ok()
        .filter(|_| hex.len() == 32)
}

/// `CLOCK_BOOTTIME` in milliseconds.
fn boottime_ms() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).ok().filter(|_| rc == 0)?;
    let millis = u64::try_from(ts.tv_nsec / 1_000_000).ok()?;
    secs.checked_mul(1_000)?.checked_add(millis)
}

/// How long a manual clock's boot had run when the clock was made.
const MANUAL_UPTIME_MS: u64 = 3_600_000;

/// A boot id no other manual clock has.
fn new_boot_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::SeqCst)
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
    boot: AtomicU64,
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

    /// Makes this a new boot, as a power cut or a reboot does: the boot clock of the last
    /// one means nothing in this one.
    pub fn reboot(&self) {
        self.boot.store(new_boot_id(), Ordering::SeqCst);
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
        let boot = clock.boot().unwrap();
        assert_eq!(boot.ms, 250 + MANUAL_UPTIME_MS, "with the monotonic clock");
        hand.reboot();
        assert_ne!(clock.boot().unwrap().id, boot.id);
        let (other, _) = Clock::manual(5_000);
        assert_ne!(other.boot().unwrap().id, clock.boot().unwrap().id);
    }

    /// The boot this test runs in, as the kernel tells it, and its clock, as
    /// `/proc/uptime` (the same clock, in hundredths of a second) reads it.
    #[test]
    fn the_system_clock_knows_its_boot() {
        let boot = Clock::system().boot().expect("boot id and CLOCK_BOOTTIME");
        let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        assert_eq!(format!("{:032x}", boot.id), id.trim().replace('-', ""));
        let uptime: f64 = std::fs::read_to_string("/proc/uptime")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let again = Clock::system().boot().unwrap().ms;
        let uptime_ms = (uptime * 1000.0) as u64;
        assert!(
            boot.ms <= uptime_ms + 20 && uptime_ms <= again + 20,
            "{} ≤ {uptime_ms} ≤ {again}",
            boot.ms
        );
    }
}
