//! The mutex alone, against the disk it sits on.
//!
//! `cargo bench --bench mutex` prints, in one run and on one filesystem (the system temp
//! directory unless `HOOX_BENCH_DIR` names another):
//! - the raw fdatasync latency of a bare write + fdatasync loop (4 KiB overwrites in a file
//!   of the journal's size), the floor for anything durable;
//! - single-caller reserve latency (every reserve waits for its own fsync), and the round
//!   trip to the owner thread without the disk;
//! - durable reserves per second at 1, 16, 64 and 256 concurrent callers (group commit
//!   shares one fsync among all reserves queued behind it);
//!
//! Each figure is printed next to its ratio against the fdatasync baseline.
//! Targets: single reserve p50 ≤ 1.5× fdatasync p50; ≥ 100k reserves/s at 256 callers.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use hoox_edge::mutex::{self, ClientKey, Clock, Config, Decision, Key, Mode, Reserve};

const SAMPLES: usize = 1000;
const BLOCK: usize = 10;
const RUN: Duration = Duration::from_secs(4);

fn main() {
    let base = std::env::var_os("HOOX_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(&base).expect("bench directory");
    println!("mutex bench in {}", dir.path().display());

    // The disk here is shared and its latency swings by two orders of magnitude from one
    // minute to the next, so every figure is paired with a baseline taken at the same
    // moment: latency samples alternate blocks of raw fdatasync and of reserves; each throughput run is
    // preceded by its own short fdatasync sample.
    let mut raw = Raw::open(&dir.path().join("raw"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (sync, single, write_mean) =
        rt.block_on(latencies(&mut raw, &dir.path().join("single.redb")));
    let sync_p50 = sync.value_at_quantile(0.5) as f64;
    report("fdatasync (4 KiB write + fdatasync)", &sync, sync_p50);
    report("reserve, one caller", &single, sync_p50);
    println!(
        "  of which the journal write + sync: mean {write_mean:.0} µs; the rest is the \
         round trip through the owner thread and the batch's bookkeeping"
    );
    let asleep = rt.block_on(round_trips(&dir.path().join("ping.redb")));
    println!(
        "  round trip to the owner, no disk (ping), owner asleep: p50 {} µs, p99 {} µs",
        asleep.value_at_quantile(0.5),
        asleep.value_at_quantile(0.99)
    );

    println!("durable reserves/s (ratio to the reserves/s one fdatasync each would allow):");
    for callers in [1, 16, 64, 256] {
        let mut h = hist();
        for _ in 0..100 {
            h.record(raw.sync()).ok();
        }
        let floor = 1e6 / h.value_at_quantile(0.5) as f64;
        let path = dir.path().join(format!("c{callers}.redb"));
        let (rate, batch) = rt.block_on(throughput(&path, callers));
        println!(
            "  {callers:>3} callers: {rate:>9.0}/s  ×{:.1} of {floor:.0}/s  (mean batch {batch:.1})",
            rate / floor
        );
    }
}

fn report(what: &str, h: &Histogram<u64>, base_p50: f64) {
    let p50 = h.value_at_quantile(0.5);
    let p99 = h.value_at_quantile(0.99);
    println!(
        "{what}: p50 {p50} µs (×{:.2}), p99 {p99} µs (×{:.2}), n={}",
        p50 as f64 / base_p50,
        p99 as f64 / base_p50,
        h.len()
    );
}

fn hist() -> Histogram<u64> {
    // 1 µs to 10 s, 3 significant digits: these bounds are valid constants.
    Histogram::new_with_bounds(1, 10_000_000, 3).expect("histogram bounds")
}

/// A bare file for the baseline, the size of the journal and written in full first, as
/// the journal is (on ext4 an fdatasync costs more the larger the file: docs/DESIGN.md):
/// a 4 KiB write at the next of its 4 KiB offsets, then fdatasync.
struct Raw {
    file: std::fs::File,
    slots: u64,
    i: u64,
}

impl Raw {
    fn open(path: &std::path::Path) -> Raw {
        let bytes = Config::default().journal_bytes;
        let mut file = std::fs::File::create(path).expect("raw file");
        file.write_all(&vec![0x5a; bytes]).expect("write");
        file.sync_all().expect("sync");
        Raw {
            file,
            slots: (bytes / 4096).max(1) as u64,
            i: 0,
        }
    }

    /// One write + fdatasync; its duration in µs.
    fn sync(&mut self) -> u64 {
        let t = Instant::now();
        self.file
            .write_all_at(&[0xa5; 4096], self.i % self.slots * 4096)
            .expect("write");
        self.file.sync_data().expect("fdatasync");
        self.i += 1;
        t.elapsed().as_micros() as u64
    }
}

fn config(path: &std::path::Path) -> Config {
    Config {
        path: path.to_path_buf(),
        capacity: 10_000_000,
        ..Config::default()
    }
}

fn req(caller: usize, n: u64) -> Reserve {
    let ck = ClientKey::parse(&format!("order-{caller}-{n}")).expect("valid key");
    Reserve {
        key: Key::client("bench", Mode::Test, &ck).expect("key fits"),
        ttl: Duration::from_secs(300),
        payload_hash: [1; 32],
        guard: None,
    }
}

/// Samples of a bare fdatasync and of a single caller's reserve, in alternating blocks of
/// `BLOCK` (the baseline follows the disk's drift; within a block the caller sends each
/// reserve as soon as the last is answered, as one connection with a burst of orders
/// does), and the mean time the owner spent writing and syncing the journal for them.
async fn latencies(raw: &mut Raw, path: &std::path::Path) -> (Histogram<u64>, Histogram<u64>, f64) {
    let (m, owner) = mutex::start(config(path), Clock::system());
    // Warm up: the file's first pages are allocated here, not in the measurement.
    for n in 0..50 {
        m.reserve(req(0, n)).await;
    }
    let (_, s0, n0) = m.shared().stats.fsync_seconds.snapshot();
    let (mut sync, mut single) = (hist(), hist());
    for block in 0..(SAMPLES / BLOCK) as u64 {
        for _ in 0..BLOCK {
            sync.record(raw.sync()).ok();
        }
        for i in 0..BLOCK as u64 {
            let t = Instant::now();
            let d = m.reserve(req(1, block * BLOCK as u64 + i)).await;
            single.record(t.elapsed().as_micros() as u64).ok();
            assert!(matches!(d, Decision::Proceed(_)), "{d:?}");
        }
    }
    let (_, s1, n1) = m.shared().stats.fsync_seconds.snapshot();
    owner.stop();
    (sync, single, (s1 - s0) * 1e6 / (n1 - n0).max(1) as f64)
}

/// The round trip to the owner and back with no disk in it (a ping), the owner asleep
/// when it arrives: what a reserve costs beyond its journal write.
async fn round_trips(path: &std::path::Path) -> Histogram<u64> {
    let (m, owner) = mutex::start(config(path), Clock::system());
    let mut asleep = hist();
    for _ in 0..SAMPLES / 4 {
        // Long enough for the owner to be asleep on its channel.
        std::thread::sleep(Duration::from_micros(500));
        let t = Instant::now();
        m.ping().await.expect("ping");
        asleep.record(t.elapsed().as_micros() as u64).ok();
    }
    owner.stop();
    asleep
}

/// Reserves per second over `RUN` with `callers` tasks, and the mean batch size.
async fn throughput(path: &std::path::Path, callers: usize) -> (f64, f64) {
    let (m, owner) = mutex::start(config(path), Clock::system());
    for n in 0..50 {
        m.reserve(req(usize::MAX, n)).await;
    }
    let (_, b0, n0) = m.shared().stats.batch_size.snapshot();
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let (m, done, stop) = (m.clone(), done.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let d = m.reserve(req(c, n)).await;
                    assert!(matches!(d, Decision::Proceed(_)), "caller {c}: {d:?}");
                    done.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
            })
        })
        .collect();
    tokio::time::sleep(RUN).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("caller task");
    }
    let secs = start.elapsed().as_secs_f64();
    let (_, b1, n1) = m.shared().stats.batch_size.snapshot();
    owner.stop();
    let batches = (n1 - n0).max(1) as f64;
    (
        done.load(Ordering::Relaxed) as f64 / secs,
        (b1 - b0) / batches,
    )
}
