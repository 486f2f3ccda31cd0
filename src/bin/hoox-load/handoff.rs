//! The hand-off baseline. Every reserve crosses threads twice: the gateway's worker wakes the
//! mutex's owner thread with the command, and the owner wakes the worker with the answer.
//! This times that round trip between two bare threads, one bounded channel each way, the
//! owner sleeping between commands as it does when idle: the floor under the mutex's
//! hand-off on this machine, as the fsync baseline is the floor under its sync.
//!
//! What it costs depends on the machine more than on the code. Two threads on one CPU pay a
//! context switch each way. On two CPUs they also pay for waking the other CPU from idle:
//! cheap on bare metal, but on a VM whose idle vCPUs halt, each wake is an inter-processor
//! interrupt through the hypervisor (docs/BENCHMARKS.md has figures for both).

use std::process::ExitCode;
use std::sync::mpsc::sync_channel;
use std::time::Instant;

use hdrhistogram::Histogram;

use crate::Error;

/// Where the two threads may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Wherever the scheduler puts them (as the gateway's threads run).
    Any,
    /// Both on the CPU the command started on: the wake never leaves the CPU.
    OneCpu,
}

pub fn run(count: u32, placement: Placement, json: bool) -> Result<ExitCode, Error> {
    if count == 0 {
        return Err("--count must be at least 1".into());
    }
    let (hist, cpu) = measure(count, placement)?;
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    let on = match cpu {
        Some(c) => format!("one CPU ({c})"),
        None => "any CPU".to_string(),
    };
    if json {
        let out = serde_json::json!({
            "count": count, "cpu": cpu, "p50_us": us(0.5), "p99_us": us(0.99),
            "max_us": hist.max() as f64 / 1000.0,
        });
        println!("{out}");
    } else {
        println!(
            "hand-off round trip x {count}, {on}: p50 {:.1} us  p99 {:.1} us  max {:.1} us",
            us(0.5),
            us(0.99),
            hist.max() as f64 / 1000.0
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One round trip time per command, in nanoseconds, and the CPU both threads were held to.
fn measure(count: u32, placement: Placement) -> Result<(Histogram<u64>, Option<usize>), Error> {
    let cpu = match placement {
        Placement::Any => None,
        Placement::OneCpu => Some(pin_to_current_cpu()?),
    };
    let (to_owner, commands) = sync_channel::<u32>(1);
    let (to_worker, answers) = sync_channel::<u32>(1);
    let owner = std::thread::Builder::new()
        .name("handoff-owner".into())
        .spawn(move || -> Result<(), Error> {
            if let Some(c) = cpu {
                pin(c)?;
            }
            // Ends when the worker side hangs up.
            for n in commands {
                if to_worker.send(n).is_err() {
                    break;
                }
            }
            Ok(())
        })?;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut failed = None;
    for n in 0..count {
        let start = Instant::now();
        let answer = to_owner.send(n).ok().and_then(|()| answers.recv().ok());
        if answer != Some(n) {
            failed = Some(n);
            break;
        }
        hist.saturating_record(start.elapsed().as_nanos() as u64);
    }
    drop(to_owner);
    let joined = owner
        .join()
        .unwrap_or_else(|_| Err("the owner thread panicked".into()));
    joined?;
    if let Some(n) = failed {
        return Err(format!("the owner thread stopped answering at command {n}").into());
    }
    Ok((hist, cpu))
}

/// Holds the calling thread to the CPU it is on now; returns that CPU.
fn pin_to_current_cpu() -> Result<usize, Error> {
    // SAFETY: sched_getcpu takes no arguments and only reads the caller's state.
    let cpu = unsafe { libc::sched_getcpu() };
    let cpu = usize::try_from(cpu)
        .map_err(|_| format!("sched_getcpu: {}", std::io::Error::last_os_error()))?;
    pin(cpu)?;
    Ok(cpu)
}

/// Holds the calling thread to `cpu`.
fn pin(cpu: usize) -> Result<(), Error> {
    // SAFETY: cpu_set_t is plain data, all-zero is the empty set; CPU_SET and
    // sched_setaffinity get a valid pointer to it and its size, and 0 names this thread.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        return Err(format!(
            "sched_setaffinity to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        )
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_round_trip_is_timed() {
        let (hist, cpu) = measure(200, Placement::Any).unwrap();
        assert_eq!(hist.len(), 200);
        assert!(hist.min() > 0, "a round trip between threads takes time");
        assert_eq!(cpu, None);
    }

    #[test]
    fn one_cpu_holds_both_threads_to_the_cpu_it_reports() {
        let (hist, cpu) = measure(200, Placement::OneCpu).unwrap();
        assert_eq!(hist.len(), 200);
        let cpu = cpu.expect("pinned");
        // The measuring thread is still held there afterwards.
        // SAFETY: as in pin_to_current_cpu.
        assert_eq!(unsafe { libc::sched_getcpu() }, cpu as i32);
    }

    #[test]
    fn a_count_of_zero_is_refused() {
        let e = run(0, Placement::Any, true).unwrap_err();
        assert!(e.to_string().contains("--count"), "{e}");
    }
}
