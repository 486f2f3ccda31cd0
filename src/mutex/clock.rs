//! Time, as the mutex sees it.
//!
//! Two clocks, for two jobs. Persisted times (`stored_at`, `expires_at`) are unix
//! milliseconds from the wall clock, because they must survive a reboot. The alarm wheel
//! runs on a monotonic clock, because a wall clock stepped by NTP must not fire a whole
//! wheel of alarms at once. The monotonic clock is the boot clock (`CLOCK_BOOTTIME`:
//! milliseconds since the boot, counting suspend), so it also reads the same in the next
//! process of the same boot: an entry keeps its deadline on it too, with the boot's id,
//! and a restart after a wall clock step frees no key early. Tests swap both for a
//! [`ManualClock`] and move time without sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The clock the owner reads. Cheap to clone.
#[derive(Clone, Debug)]
pub enum Clock {
    /// The operating system's clocks.
    System {
        /// The monotonic clock's origin where `CLOCK_BOOTTIME` cannot be read (never on
        /// Linux since 2.6.39).
        start: Instant,
        /// This boot, read once: `None` where `/proc/sys` is not readable, or the boot
        /// clock is not there.
        boot: Option<u32>,
    },
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
        Clock::System {
            start: Instant::now(),
            boot: read_boot_id().filter(|_| boottime_ms().is_some()),
        }
    }

    /// A manual clock starting at `wall_ms`; returns the handle tests advance.
    pub fn manual(wall_ms: u64) -> (Self, Arc<ManualClock>) {
        let m = Arc::new(ManualClock {
            wall: AtomicU64::new(wall_ms),
            mono: AtomicU64::new(0),
            boot: AtomicU32::new(new_boot_id()),
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

    /// Monotonic milliseconds: since the boot (`CLOCK_BOOTTIME`), the same in every
    /// process of it; since this clock was made only where that clock does not exist
    /// (Linux before 2.6.39), and then [`Clock::boot`] is `None`. A read of it cannot fail
    /// once one has succeeded (it fails only for an unknown clock or a bad pointer), so
    /// the two sources never take turns.
    pub fn mono_ms(&self) -> u64 {
        match self {
            Clock::System { start, .. } => {
                boottime_ms().unwrap_or_else(|| start.elapsed().as_millis() as u64)
            }
            Clock::Manual(m) => m.mono.load(Ordering::SeqCst),
        }
    }

    /// Which boot this is: 32 bits of the kernel's random boot id, so another boot has
    /// another but once in 2^32 (and then only holds its keys longer). `None` if the
    /// system does not say: then only the wall clock survives a restart.
    pub fn boot(&self) -> Option<u32> {
        match self {
            Clock::System { boot, .. } => *boot,
            // One boot per manual clock, until a test reboots it; 0 once it forgot it.
            Clock::Manual(m) => Some(m.boot.load(Ordering::SeqCst)).filter(|b| *b != 0),
        }
    }
}

/// The low 32 bits of the kernel's boot id (`/proc/sys/kernel/random/boot_id`, a random
/// UUID: those bits are all random).
fn read_boot_id() -> Option<u32> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
    let id = u128::from_str_radix(&hex, 16)
        .ok()
        .filter(|_| hex.len() == 32)?;
    Some(id as u32)
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

/// A boot id no other manual clock has.
fn new_boot_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::SeqCst)
}

/// The wall clock in unix milliseconds. A clock before 1970 reads as 0.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The wall clock in unix seconds, as certificates and signatures count time.
pub fn unix_s() -> i64 {
    (unix_ms() / 1000) as i64
}

#[derive(Debug)]
pub struct ManualClock {
    wall: AtomicU64,
    mono: AtomicU64,
    boot: AtomicU32,
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

    /// Makes this a new boot, as a power cut or a reboot does: the boot clock, which is
    /// the monotonic one, starts again from 0, and the last boot's means nothing in this
    /// one. Between two owners only: a running one would see its clock go back.
    pub fn reboot(&self) {
        self.boot.store(new_boot_id(), Ordering::SeqCst);
        self.mono.store(0, Ordering::SeqCst);
    }

    /// Makes the boot unknown, as on a system whose boot id cannot be read.
    pub fn forget_boot(&self) {
        self.boot.store(0, Ordering::SeqCst);
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
        hand.reboot();
        assert_ne!(clock.boot().unwrap(), boot);
        assert_eq!((clock.wall_ms(), clock.mono_ms()), (250, 0));
        let (other, _) = Clock::manual(5_000);
        assert_ne!(other.boot().unwrap(), clock.boot().unwrap());
        hand.forget_boot();
        assert_eq!(clock.boot(), None);
    }

    /// The boot this test runs in, as the kernel tells it, and the monotonic clock, which
    /// is the boot clock: this process started after the boot, at a time the kernel gives
    /// on that clock too (`/proc/self/stat`'s start time, in clock ticks since the boot),
    /// so the clock reads past it, by less than an hour. Not `/proc/uptime`:
    /// LXCFS gives a container its own there.
    #[test]
    fn the_system_clock_knows_its_boot() {
        let clock = Clock::system();
        let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        let id = id.trim().replace('-', "");
        assert_eq!(
            clock.boot().map(|b| format!("{b:08x}")).as_deref(),
            Some(&id[24..])
        );
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        // Fields after the command's closing parenthesis: state is field 3, start time 22.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let ticks: u64 = after.split(' ').nth(22 - 3).unwrap().parse().unwrap();
        // SAFETY: sysconf only reads a configuration value.
        let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap();
        let started_ms = ticks * 1000 / hz;
        let now = clock.mono_ms();
        // A test binary runs for seconds, not an hour.
        assert!(
            started_ms <= now + 20 && now < started_ms + 3_600_000,
            "this process started {started_ms} ms after the boot; the clock reads {now}"
        );
    }
}
