//! The fsync baseline. A reserve is durable only once its journal record has reached the
//! disk, so one write + fdatasync on the same filesystem is the latency floor the gateway is
//! judged against.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::Error;

/// The size of the mutex's journal file (`mutex::Config::journal_bytes`): on ext4 an
/// fdatasync costs more the larger the file, so the baseline uses the same.
const FILE_BYTES: usize = 1024 * 1024;

pub fn run(
    dir: &Path,
    count: u32,
    size: usize,
    rate: Option<f64>,
    json: bool,
) -> Result<ExitCode, Error> {
    if rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        return Err("--rate must be a positive number of writes per second".into());
    }
    let path = dir.join(format!(".hoox-load-fsync-{}", std::process::id()));
    let result = measure(&path, count, size, rate);
    // Remove the probe file whatever happened; a failed measurement must not leave litter.
    let _ = std::fs::remove_file(&path);
    let hist = result?;
    let us = |q: f64| hist.value_at_quantile(q);
    if json {
        let out = serde_json::json!({
            "dir": dir.display().to_string(), "count": count, "size": size, "rate": rate,
            "p50_us": us(0.5), "p99_us": us(0.99), "max_us": hist.max(),
        });
        println!("{out}");
    } else {
        let paced = rate.map(|r| format!(" at {r}/s")).unwrap_or_default();
        println!(
            "fsync {} x {count}{paced} ({size} B): p50 {} us  p99 {} us  max {} us",
            dir.display(),
            us(0.5),
            us(0.99),
            hist.max()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn measure(
    path: &Path,
    count: u32,
    size: usize,
    rate: Option<f64>,
) -> Result<Histogram<u64>, Error> {
    let mut file = OpenOptions::new().create_new(true).write(true).open(path)?;
    // Overwrites in a file written in full first, as the mutex's journal does: a write that
    // grows a file also syncs its size and new blocks, which no reserve pays.
    let slots = (FILE_BYTES / size.max(1)).max(1) as u64;
    let block = vec![0xa5u8; size];
    for _ in 0..slots {
        file.write_all(&block)?;
    }
    file.sync_all()?;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut n = 0;
    let mut sync = || -> Result<(), Error> {
        file.write_all_at(&block, n % slots * size as u64)?;
        n += 1;
        // SAFETY: the descriptor belongs to `file`, which outlives this call.
        if unsafe { libc::fdatasync(file.as_raw_fd()) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(())
    };
    let Some(rate) = rate else {
        for _ in 0..count {
            let start = Instant::now();
            sync()?;
            hist.saturating_record(start.elapsed().as_micros() as u64);
        }
        return Ok(hist);
    };
    let interval = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now();
    let at = |i: u32| start + interval * i;
    // The first write not yet durable.
    let mut next = 0;
    while next < count {
        wait_until(at(next));
        // Every write scheduled by now shares this sync, as reserves share a batch's.
        let due = ((start.elapsed().as_secs_f64() * rate) as u32 + 1).clamp(next + 1, count);
        sync()?;
        let done = Instant::now();
        for i in next..due {
            hist.saturating_record(done.duration_since(at(i)).as_micros() as u64);
        }
        next = due;
    }
    Ok(hist)
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

    #[test]
    fn paced_times_every_write_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let hist = measure(&dir.path().join("probe"), 40, 4096, Some(2000.0)).unwrap();
        assert_eq!(hist.len(), 40, "one latency per scheduled write");
        let code = run(dir.path(), 10, 4096, Some(1000.0), true).unwrap();
        assert_eq!(code, ExitCode::SUCCESS);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "only `probe`"
        );
        assert!(run(dir.path(), 10, 4096, Some(0.0), true).is_err());
    }
}
