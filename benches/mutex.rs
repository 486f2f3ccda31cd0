//! The mutex alone, against the disk it sits on.
//!
//! `cargo bench --bench mutex` prints, in one run and on one filesystem (the system temp
//! directory unless `HOOX_BENCH_DIR` names another):
//! - the reference: the raw latency of a 4 KiB overwrite (in a file of the journal's size)
//!   synced the way the journal syncs a record, one `O_DIRECT | O_DSYNC` write through
//!   `journal::open_direct` where the file system takes it, else write + fdatasync (the
//!   output says which): the floor for anything durable; and, where the reference is the
//!   direct write, the same overwrite made with write + fdatasync beside it;
//! - single-caller reserve latency (every reserve waits for its own fsync), and the round
//!   trip to the owner thread without the disk;
//! - durable reserves per second at 1, 16, 64 and 256 concurrent callers (group commit
//!   shares one fsync among all reserves queued behind it);
//!
//! Each figure is printed next to its ratio against the reference (and against write +
//! fdatasync where that is not the reference).
//! Targets: single reserve p50 ≤ 1.5× the reference p50; ≥ 100k reserves/s at 256 callers.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use hoox_edge::mutex::{self, ClientKey, Clock, Config, Decision, Key, Mode, Reserve, journal};

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
    // moment: latency samples alternate blocks of raw syncs and of reserves; each throughput
    // run is preceded by its own short sample of raw syncs.
    let mut raw = Raw::open(&dir.path().join("raw"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (sync, fdatasync, single, write_mean) =
        rt.block_on(latencies(&mut raw, &dir.path().join("single.redb")));
    let sync_p50 = sync.value_at_quantile(0.5) as f64;
    let mut bases = vec![("reference", sync_p50)];
    report(&format!("reference ({})", raw.kind()), &sync, &bases);
    if let Some(fdatasync) = &fdatasync {
        let p50 = fdatasync.value_at_quantile(0.5) as f64;
        report("write + fdatasync (4 KiB)", fdatasync, &bases);
        bases.push(("write + fdatasync", p50));
    }
    report("reserve, one caller", &single, &bases);
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

    println!(
        "durable reserves/s (ratio to the reserves/s one reference sync each would allow{}):",
        if raw.direct.is_some() {
            "; and one write + fdatasync each"
        } else {
            ""
        }
    );
    for callers in [1, 16, 64, 256] {
        let (mut h, mut f) = (hist(), hist());
        for _ in 0..100 {
            h.record(raw.sync()).ok();
        }
        if raw.take_fallback() {
            // Some of the 100 were direct writes: sample the new reference alone.
            h.reset();
            for _ in 0..100 {
                h.record(raw.sync()).ok();
            }
        }
        if raw.direct.is_some() {
            for _ in 0..100 {
                f.record(raw.fdatasync()).ok();
            }
        }
        let floor = 1e6 / h.value_at_quantile(0.5) as f64;
        let path = dir.path().join(format!("c{callers}.redb"));
        let (rate, batch) = rt.block_on(throughput(&path, callers));
        let also = if f.is_empty() {
            String::new()
        } else {
            let floor = 1e6 / f.value_at_quantile(0.5) as f64;
            format!(", ×{:.1} of {floor:.0}/s (write + fdatasync)", rate / floor)
        };
        println!(
            "  {callers:>3} callers: {rate:>9.0}/s  ×{:.1} of {floor:.0}/s (reference){also}  (mean batch {batch:.1})",
            rate / floor
        );
    }
}

/// One line: p50 and p99, each with its ratio to every base's p50.
fn report(what: &str, h: &Histogram<u64>, bases: &[(&str, f64)]) {
    let p50 = h.value_at_quantile(0.5);
    let p99 = h.value_at_quantile(0.99);
    let ratios = |v: u64| {
        let all: Vec<String> = bases
            .iter()
            .map(|(name, base)| format!("×{:.2} {name}", v as f64 / base))
            .collect();
        all.join(", ")
    };
    println!(
        "{what}: p50 {p50} µs ({}), p99 {p99} µs ({}), n={}",
        ratios(p50),
        ratios(p99),
        h.len()
    );
}

fn hist() -> Histogram<u64> {
    // 1 µs to 10 s, 3 significant digits: these bounds are valid constants.
    Histogram::new_with_bounds(1, 10_000_000, 3).expect("histogram bounds")
}

/// A bare file for the baselines, the size of the journal and written in full first, as
/// the journal is (on ext4 an fdatasync costs more the larger the file: docs/DESIGN.md):
/// a 4 KiB write at the next of its 4 KiB offsets, synced as the journal syncs a record
/// (one `O_DIRECT | O_DSYNC` write, through the journal's own `open_direct`, where the file
/// system takes it), or with write + fdatasync.
struct Raw {
    file: std::fs::File,
    /// The file opened as the journal opens it for synced records; `None` where the file
    /// system refused (then the reference is write + fdatasync, as the journal's is).
    direct: Option<std::fs::File>,
    /// Why there is no direct handle, if there is none.
    refused: Option<String>,
    /// One 4 KiB block, at `at` in it, aligned for direct I/O as the journal's records are.
    spare: Vec<u8>,
    at: usize,
    slots: u64,
    i: u64,
    /// Set when a direct write was refused after the probe (see `take_fallback`).
    fell_back: bool,
}

const BLOCK_BYTES: usize = 4096;

impl Raw {
    fn open(path: &std::path::Path) -> Raw {
        let bytes = Config::default().journal_bytes;
        let mut file = std::fs::File::create(path).expect("raw file");
        file.write_all(&vec![0x5a; bytes]).expect("write");
        file.sync_all().expect("sync");
        let spare = vec![0xa5; 2 * BLOCK_BYTES];
        let at = spare.as_ptr().align_offset(BLOCK_BYTES).min(BLOCK_BYTES);
        // Some file systems open `O_DIRECT` and then refuse the write (EINVAL). One aligned
        // block written at offset 0 settles which sync the reference is before any sample
        // is taken, so that the reference never changes kind within a measurement.
        let (direct, refused) = match journal::open_direct(path) {
            Ok(d) => match d.write_all_at(&spare[at..at + BLOCK_BYTES], 0) {
                Ok(()) => (Some(d), None),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    (None, Some(format!("the probe write: {e}")))
                }
                Err(e) => panic!("direct write (probe): {e}"),
            },
            Err(e) => (None, Some(e.to_string())),
        };
        Raw {
            file,
            direct,
            refused,
            spare,
            at,
            slots: (bytes / BLOCK_BYTES).max(1) as u64,
            i: 0,
            fell_back: false,
        }
    }

    /// Whether the direct write was refused after the probe since the last call, the
    /// reference now write + fdatasync: the samples taken before are of the other kind, and
    /// the caller discards them.
    fn take_fallback(&mut self) -> bool {
        std::mem::take(&mut self.fell_back)
    }

    /// What the reference is here.
    fn kind(&self) -> String {
        match (&self.direct, &self.refused) {
            (Some(_), _) => "O_DIRECT | O_DSYNC write of 4 KiB, as the journal syncs".into(),
            (None, Some(why)) => format!("write + fdatasync of 4 KiB, direct I/O refused: {why}"),
            (None, None) => "write + fdatasync of 4 KiB".into(),
        }
    }

    fn offset(&mut self) -> u64 {
        self.i += 1;
        self.i % self.slots * BLOCK_BYTES as u64
    }

    /// One write synced as the journal syncs a record; its duration in µs. A direct write
    /// the kernel refuses (EINVAL) although the probe in `open` passed is redone with
    /// fdatasync, and so is every later one, as the journal does; `take_fallback` then says
    /// so, for the caller to discard the samples of the other kind.
    fn sync(&mut self) -> u64 {
        let offset = self.offset();
        let Some(direct) = &self.direct else {
            return self.fdatasync_at(offset);
        };
        let block = &self.spare[self.at..self.at + BLOCK_BYTES];
        let t = Instant::now();
        match direct.write_all_at(block, offset) {
            Ok(()) => t.elapsed().as_micros() as u64,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                println!(
                    "  direct write refused ({e}) after the probe passed: the reference is \
                     write + fdatasync, its samples so far discarded"
                );
                self.direct = None;
                self.refused = Some(e.to_string());
                self.fell_back = true;
                self.fdatasync_at(offset)
            }
            Err(e) => panic!("direct write: {e}"),
        }
    }

    /// One write + fdatasync; its duration in µs.
    fn fdatasync(&mut self) -> u64 {
        let offset = self.offset();
        self.fdatasync_at(offset)
    }

    fn fdatasync_at(&self, offset: u64) -> u64 {
        let block = &self.spare[self.at..self.at + BLOCK_BYTES];
        let t = Instant::now();
        self.file.write_all_at(block, offset).expect("write");
        self.file.sync_data().expect("fdatasync");
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

/// Samples of the reference sync, of write + fdatasync (where that is not the reference)
/// and of a single caller's reserve, in alternating blocks of `BLOCK` (the baselines follow
/// the disk's drift; within a block the caller sends each reserve as soon as the last is
/// answered, as one connection with a burst of orders does; the three kinds take turns at
/// going first, so that none always follows the same one), and the mean time the owner
/// spent writing and syncing the journal for them. Were the direct write refused midway,
/// both baselines' samples so far are discarded: a reference of one kind only.
async fn latencies(
    raw: &mut Raw,
    path: &std::path::Path,
) -> (Histogram<u64>, Option<Histogram<u64>>, Histogram<u64>, f64) {
    let (m, owner) = mutex::start(config(path), Clock::system());
    // Warm up: the file's first pages are allocated here, not in the measurement.
    for n in 0..50 {
        m.reserve(req(0, n)).await;
    }
    let (_, s0, n0) = m.shared().stats.fsync_seconds.snapshot();
    let (mut sync, mut fdatasync, mut single) = (hist(), hist(), hist());
    for block in 0..(SAMPLES / BLOCK) as u64 {
        for kind in 0..3 {
            match (block + kind) % 3 {
                0 => {
                    for _ in 0..BLOCK {
                        sync.record(raw.sync()).ok();
                    }
                    if raw.take_fallback() {
                        // This block mixed the two kinds: it is taken again, of the new one.
                        sync.reset();
                        fdatasync.reset();
                        for _ in 0..BLOCK {
                            sync.record(raw.sync()).ok();
                        }
                    }
                }
                1 => {
                    if raw.direct.is_some() {
                        for _ in 0..BLOCK {
                            fdatasync.record(raw.fdatasync()).ok();
                        }
                    }
                }
                _ => {
                    for i in 0..BLOCK as u64 {
                        let t = Instant::now();
                        let d = m.reserve(req(1, block * BLOCK as u64 + i)).await;
                        single.record(t.elapsed().as_micros() as u64).ok();
                        assert!(matches!(d, Decision::Proceed(_)), "{d:?}");
                    }
                }
            }
        }
    }
    let (_, s1, n1) = m.shared().stats.fsync_seconds.snapshot();
    owner.stop();
    let fdatasync = (!fdatasync.is_empty()).then_some(fdatasync);
    (
        sync,
        fdatasync,
        single,
        (s1 - s0) * 1e6 / (n1 - n0).max(1) as f64,
    )
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
