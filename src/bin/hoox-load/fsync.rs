//! The fsync baseline. A reserve is durable only once redb's commit has reached the disk, so one
//! write + fdatasync on the same filesystem is the latency floor the gateway is judged against.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use hdrhistogram::Histogram;

use crate::Error;

pub fn run(dir: &Path, count: u32, size: usize, json: bool) -> Result<ExitCode, Error> {
    let path = dir.join(format!(".hoox-load-fsync-{}", std::process::id()));
    let result = measure(&path, count, size);
    // Remove the probe file whatever happened; a failed measurement must not leave litter.
    let _ = std::fs::remove_file(&path);
    let hist = result?;
    let us = |q: f64| hist.value_at_quantile(q);
    if json {
        let out = serde_json::json!({
            "dir": dir.display().to_string(), "count": count, "size": size,
            "p50_us": us(0.5), "p99_us": us(0.99), "max_us": hist.max(),
        });
        println!("{out}");
    } else {
        println!(
            "fsync {} x {count} ({size} B): p50 {} us  p99 {} us  max {} us",
            dir.display(),
            us(0.5),
            us(0.99),
            hist.max()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn measure(path: &Path, count: u32, size: usize) -> Result<Histogram<u64>, Error> {
    let mut file = OpenOptions::new().create_new(true).write(true).open(path)?;
    let block = vec![0xa5u8; size];
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for _ in 0..count {
        let start = Instant::now();
        file.write_all(&block)?;
        // SAFETY: the descriptor belongs to `file`, which outlives this call.
        if unsafe { libc::fdatasync(file.as_raw_fd()) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        hist.saturating_record(start.elapsed().as_micros() as u64);
    }
    Ok(hist)
}
