//! Counters the owner keeps for the metrics endpoint. Plain atomics, so the mutex does
//! not depend on a metrics library and a scrape never waits on the owner.

use std::sync::atomic::{AtomicU64, Ordering};

/// A fixed-bucket histogram of non-negative values (cumulative counts are made at render).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((v * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// `(upper bound, count in that bucket alone)`, the last bound being +Inf; the sum; the count.
    pub fn snapshot(&self) -> (Vec<(f64, u64)>, f64, u64) {
        let mut v: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .zip(&self.counts)
            .map(|(b, c)| (*b, c.load(Ordering::Relaxed)))
            .collect();
        v.push((
            f64::INFINITY,
            self.counts[self.bounds.len()].load(Ordering::Relaxed),
        ));
        (
            v,
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
            self.count.load(Ordering::Relaxed),
        )
    }
}

/// Seconds: from 50 µs to 1 s.
pub const LATENCY_BOUNDS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];
/// Commands per owner turn (a turn that grants a key is one group commit).
pub const BATCH_BOUNDS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

#[derive(Debug)]
pub struct Stats {
    pub reserves: AtomicU64,
    pub proceeds: AtomicU64,
    pub duplicates: AtomicU64,
    pub mismatches: AtomicU64,
    pub unavailable: AtomicU64,
    pub commits: AtomicU64,
    pub releases: AtomicU64,
    /// Keys an operator released (`keys release`), counted apart from the gateway's own.
    pub operator_releases: AtomicU64,
    pub release_failures: AtomicU64,
    pub expired: AtomicU64,
    pub reopen_attempts: AtomicU64,
    /// Seconds one group commit took to become durable: its journal record written and synced.
    pub fsync_seconds: Histogram,
    /// Commands applied per batch (one journal record).
    pub batch_size: Histogram,
    /// Seconds one checkpoint (the journal's records into redb, committed durably) took:
    /// the owner answers nobody meanwhile.
    pub checkpoint_seconds: Histogram,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            reserves: AtomicU64::new(0),
            proceeds: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            mismatches: AtomicU64::new(0),
            unavailable: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            releases: AtomicU64::new(0),
            operator_releases: AtomicU64::new(0),
            release_failures: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            reopen_attempts: AtomicU64::new(0),
            fsync_seconds: Histogram::new(LATENCY_BOUNDS),
            batch_size: Histogram::new(BATCH_BOUNDS),
            checkpoint_seconds: Histogram::new(LATENCY_BOUNDS),
        }
    }
}

/// Adds one to a counter.
pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}
