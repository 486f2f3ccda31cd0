//! The fsync baseline. A reserve is durable only once its journal record has reached the
//! disk, so one write + fdatasync on the same filesystem is the latency floor the gateway is
//! judged against. With `--direct`, the write is made as the journal makes it where the
//! file system allows: `O_DIRECT | O_DSYNC`, one call that returns once it is on disk.
//!
//! A closed loop also reports the CPU time its writer threads spent per sync, nearly all of
//! it in the kernel. The gateway pays that once per batch of reserves; on the VM of
//! docs/BENCHMARKS.md it came to three or four bare TLS responses.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use hoox_edge::mutex::journal;

use crate::Error;

/// The size of the mutex's journal file (`mutex::Config::journal_bytes`): on ext4 an
/// fdatasync costs more the larger the file, so the baseline uses the same.
const FILE_BYTES: usize = 1024 * 1024;

/// How the writes are driven: by how many threads, each syncing its own writes in its own
/// pages of the one file, and whether to a schedule.
#[derive(Debug, Clone, Copy)]
pub struct Mode {
    /// Open loop: `count` writes scheduled this many per second (group commit: a free
    /// writer syncs every write due by then). Closed loop if `None`: each writer syncs one
    /// write after another, `count` in all.
    pub rate: Option<f64>,
    /// Threads, at least one. More than one, paced, is a group commit with that many syncs
    /// in flight; closed, it shows whether the disk overlaps flushes at all.
    pub writers: u32,
    /// Each write through an `O_DIRECT | O_DSYNC` descriptor instead of write + fdatasync.
    pub direct: bool,
}

/// Direct I/O wants memory, offsets and lengths aligned to the device's block; the journal
/// uses this.
const ALIGN: usize = 4096;

pub fn run(dir: &Path, count: u32, size: usize, mode: Mode, json: bool) -> Result<ExitCode, Error> {
    if mode.writers == 0 {
        return Err("--writers must be at least 1".into());
    }
    // The file is written whole before it is measured, and each write is one buffer: a
    // size past the journal's file would measure something the gateway never does.
    if size == 0 || size > FILE_BYTES {
        return Err(format!("--size must be from 1 to {FILE_BYTES} bytes").into());
    }
    if mode.direct && !size.is_multiple_of(ALIGN) {
        return Err(format!("--direct needs --size to be a multiple of {ALIGN}").into());
    }
    let path = dir.join(format!(".hoox-load-fsync-{}", std::process::id()));
    let result = measure(&path, count, size, mode).map_err(|e| format!("{}: {e}", dir.display()));
    // Remove the probe file whatever happened; a failed measurement must not leave litter.
    let _ = std::fs::remove_file(&path);
    let Measured { hist, took, cpu } = result?;
    let us = |q: f64| hist.value_at_quantile(q);
    // Closed loop only: how many syncs the disk completed per second (paced, it is the
    // rate), and the CPU each cost (paced, the writers also spin to meet the schedule).
    let closed = mode.rate.is_none();
    let syncs_per_s = closed.then(|| f64::from(count) / took.as_secs_f64());
    let cpu_us_per_sync = closed.then(|| cpu.as_secs_f64() * 1e6 / f64::from(count.max(1)));
    if json {
        let out = serde_json::json!({
            "dir": dir.display().to_string(), "count": count, "size": size, "rate": mode.rate,
            "writers": mode.writers, "direct": mode.direct, "syncs_per_s": syncs_per_s.map(f64::round),
            "p50_us": us(0.5), "p99_us": us(0.99), "max_us": hist.max(),
            "cpu_us_per_sync": cpu_us_per_sync.map(|c| (c * 10.0).round() / 10.0),
        });
        println!("{out}");
    } else {
        let paced = mode.rate.map(|r| format!(" at {r}/s")).unwrap_or_default();
        let how = if mode.direct { "direct " } else { "" };
        let by = if mode.writers > 1 {
            format!(" by {} writers", mode.writers)
        } else {
            String::new()
        };
        let per_s = syncs_per_s
            .map(|s| format!(", {s:.0} syncs/s"))
            .unwrap_or_default();
        let cpu = cpu_us_per_sync
            .map(|c| format!(", cpu {c:.1} us per sync"))
            .unwrap_or_default();
        println!(
            "fsync {how}{} x {count}{paced}{by} ({size} B): p50 {} us  p99 {} us  max {} us{per_s}{cpu}",
            dir.display(),
            us(0.5),
            us(0.99),
            hist.max()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// What the writes took; the file's preparation is not counted.
struct Measured {
    /// One latency per write.
    hist: Histogram<u64>,
    /// From the first write to the last sync.
    took: Duration,
    /// The CPU time, user and system, the writer threads spent, together.
    cpu: Duration,
}

/// Overwrites and syncs `count` blocks of `size` bytes in a fresh file at `path`, driven as
/// `mode` says, and times each.
fn measure(path: &Path, count: u32, size: usize, mode: Mode) -> Result<Measured, Error> {
    let mut file = OpenOptions::new().create_new(true).write(true).open(path)?;
    // Overwrites in a file written in full first, as the mutex's journal does: a write that
    // grows a file also syncs its size and new blocks, which no reserve pays.
    let slots = (FILE_BYTES / size.max(1)).max(1) as u64;
    // One block at an address aligned for direct I/O, written either way.
    let spare = vec![0xa5u8; size + ALIGN];
    let at = spare.as_ptr().align_offset(ALIGN).min(ALIGN);
    let block = &spare[at..at + size];
    for _ in 0..slots {
        file.write_all(block)?;
    }
    file.sync_all()?;
    let direct = if mode.direct {
        let d = journal::open_direct(path)
            .map_err(|e| format!("--direct: this file system refuses O_DIRECT: {e}"))?;
        Some(d)
    } else {
        None
    };
    // Write slot `n` (modulo the file) and sync it.
    let sync = |n: u64| -> Result<(), Error> {
        let offset = n % slots * size as u64;
        match &direct {
            Some(d) => d.write_all_at(block, offset)?,
            None => {
                file.write_all_at(block, offset)?;
                file.sync_data()?;
            }
        }
        Ok(())
    };
    let w = mode.writers.max(1);
    let started = Instant::now();
    let schedule = mode.rate.map(|rate| Schedule {
        rate,
        start: Instant::now(),
        interval: Duration::from_secs_f64(1.0 / rate),
        next: std::sync::Mutex::new(0),
    });
    let parts = std::thread::scope(|s| {
        let threads: Vec<_> = (0..w)
            .map(|t| {
                let (sync, schedule) = (&sync, schedule.as_ref());
                s.spawn(move || -> Result<(Histogram<u64>, Duration), Error> {
                    let mut h = histogram()?;
                    let cpu_before = thread_cpu()?;
                    match schedule {
                        Some(plan) => plan.follow(count, &mut h, sync)?,
                        None => {
                            // Writer t owns its own run of slots: no two threads write one
                            // page. `count` in all, the remainder over the first writers.
                            let each = count / w + u32::from(t < count % w);
                            let run = (slots / u64::from(w)).max(1);
                            for i in 0..each {
                                let start = Instant::now();
                                sync(u64::from(t) * run + u64::from(i) % run)?;
                                h.saturating_record(start.elapsed().as_micros() as u64);
                            }
                        }
                    }
                    Ok((h, thread_cpu()?.saturating_sub(cpu_before)))
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a writer thread panicked".into()))
            })
            .collect::<Vec<_>>()
    });
    let took = started.elapsed();
    let mut hist = histogram()?;
    let mut cpu = Duration::ZERO;
    for part in parts {
        let (h, c) = part?;
        hist.add(h)?;
        cpu += c;
    }
    Ok(Measured { hist, took, cpu })
}

/// The CPU time the calling thread has used so far, user and system. Per thread, so that
/// nothing else in the process (another test, say) is counted; and the thread's CPU clock,
/// not `getrusage`, whose count moves only when the thread sleeps or a tick lands, and so
/// reads no time at all for writes that never sleep (a sync on tmpfs).
fn thread_cpu() -> Result<Duration, Error> {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only into the struct it is given, which is ours.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } != 0 {
        return Err(format!("clock_gettime: {}", std::io::Error::last_os_error()).into());
    }
    Ok(Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    ))
}

fn histogram() -> Result<Histogram<u64>, Error> {
    Ok(Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?)
}

/// The open loop's timetable, shared by its writers.
struct Schedule {
    rate: f64,
    start: Instant,
    interval: Duration,
    /// The first write no writer has taken yet.
    next: std::sync::Mutex<u32>,
}

impl Schedule {
    fn at(&self, i: u32) -> Instant {
        self.start + self.interval * i
    }

    /// One writer's part: wait for the next write due, take it and every other write due
    /// by then, sync them (in the page of the first: two groups in flight never share one),
    /// and time each from its schedule, so a write that waited for a free writer counts its
    /// wait, as a reserve queued behind a slow sync does.
    fn follow(
        &self,
        count: u32,
        hist: &mut Histogram<u64>,
        sync: impl Fn(u64) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let next = || self.next.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let first = *next();
            if first >= count {
                return Ok(());
            }
            wait_until(self.at(first));
            let (first, due) = {
                let mut n = next();
                let first = *n;
                // Another writer took it meanwhile: wait for the next one due.
                if first >= count || self.at(first) > Instant::now() {
                    continue;
                }
                let due = ((self.start.elapsed().as_secs_f64() * self.rate) as u32 + 1)
                    .clamp(first + 1, count);
                *n = due;
                (first, due)
            };
            sync(u64::from(first))?;
            let done = Instant::now();
            for i in first..due {
                hist.saturating_record(done.duration_since(self.at(i)).as_micros() as u64);
            }
        }
    }
}

/// Sleeps, then spins the last stretch: a sleeping thread on these VMs wakes up to ~140 µs
/// late, which would be charged to the disk.
fn wait_until(t: Instant) {
    const SPIN: Duration = Duration::from_micros(300);
    let now = Instant::now();
    if t > now + SPIN {
        std::thread::sleep(t - now - SPIN);
    }
    while Instant::now() < t {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    fn mode(rate: Option<f64>, writers: u32, direct: bool) -> Mode {
        Mode {
            rate,
            writers,
            direct,
        }
    }

    #[test]
    fn paced_times_every_write_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let paced = |rate, writers| mode(Some(rate), writers, false);
        let hist = measure(&dir.path().join("probe"), 40, 4096, paced(2000.0, 1))
            .unwrap()
            .hist;
        assert_eq!(hist.len(), 40, "one latency per scheduled write");
        let hist = measure(&dir.path().join("probe2"), 40, 4096, paced(2000.0, 2))
            .unwrap()
            .hist;
        assert_eq!(
            hist.len(),
            40,
            "two writers: still one latency per scheduled write"
        );
        let code = run(dir.path(), 10, 4096, paced(1000.0, 1), true).unwrap();
        assert_eq!(code, ExitCode::SUCCESS);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            2,
            "only the probes: `run` leaves nothing"
        );
        // A rate is held to its range where it is read (`run::parse_rate`).
        assert!(run(dir.path(), 10, 4096, paced(10.0, 0), true).is_err());
        assert!(run(dir.path(), 10, 0, paced(10.0, 1), true).is_err());
        assert!(run(dir.path(), 10, 2 << 20, paced(10.0, 1), true).is_err());
    }

    #[test]
    fn concurrent_writers_time_every_sync_between_them() {
        let dir = tempfile::tempdir().unwrap();
        let closed = |writers| mode(None, writers, false);
        let hist = measure(&dir.path().join("probe"), 30, 4096, closed(3))
            .unwrap()
            .hist;
        assert_eq!(hist.len(), 30, "one latency per sync, over all writers");
        // A count that does not divide among the writers is still the count.
        let hist = measure(&dir.path().join("probe2"), 10, 4096, closed(4))
            .unwrap()
            .hist;
        assert_eq!(hist.len(), 10);
        // One writer syncs one write after another: the writes' time is at least the sum of
        // their latencies, and syncs/s is counted over it.
        let Measured { hist, took, cpu } =
            measure(&dir.path().join("probe3"), 20, 4096, closed(1)).unwrap();
        let sum_us = hist.mean() * hist.len() as f64;
        assert!(took.as_micros() as f64 >= sum_us, "{took:?} < {sum_us} us");
        // One writer: its syscalls cost some CPU, and no more than the writes' time, inside
        // which the writer's whole life falls.
        assert!(cpu > Duration::ZERO, "a write and a sync cost no CPU?");
        assert!(cpu <= took, "{cpu:?} > {took:?}");
        // Two writers: their CPU is summed, so it may pass the wall time, never twice it.
        let Measured { took, cpu, .. } =
            measure(&dir.path().join("probe4"), 20, 4096, closed(2)).unwrap();
        assert!(
            cpu > Duration::ZERO && cpu <= 2 * took,
            "{cpu:?} against {took:?}"
        );
    }

    /// A thread that computes without a pause for 20 ms of CPU has used at least 20 ms of
    /// wall time, and not much more on any machine that runs tests: a clock in the wrong
    /// unit, or one that moves only when the thread sleeps, fails one bound or the other.
    #[test]
    fn the_thread_clock_counts_cpu_in_seconds_while_it_runs() {
        // The wall interval encloses the CPU one: read first, read last. And 1% of slack:
        // the two clocks tick from different sources, and once read 19.9988 ms of wall
        // around 20 ms of CPU (CI, 2026-12-01) when the CPU clock was read first.
        let wall = Instant::now();
        let cpu = thread_cpu().unwrap();
        while thread_cpu().unwrap() - cpu < Duration::from_millis(20) {
            assert!(
                wall.elapsed() < Duration::from_secs(10),
                "the clock did not move"
            );
        }
        let elapsed = wall.elapsed();
        assert!(elapsed >= Duration::from_micros(19_800), "{elapsed:?}");
    }

    #[test]
    fn direct_writes_land_where_the_file_system_allows_them() {
        let dir = tempfile::tempdir().unwrap();
        let direct = |writers| mode(None, writers, true);
        let refused = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_DIRECT)
            .open(dir.path().join("can"))
            .is_err();
        let got = measure(&dir.path().join("probe"), 12, 8192, direct(2));
        assert_eq!(got.is_err(), refused, "{:?}", got.err());
        if let Ok(m) = got {
            assert_eq!(m.hist.len(), 12);
        }
        assert!(
            run(dir.path(), 10, 1000, direct(1), true).is_err(),
            "unaligned size"
        );
    }
}
