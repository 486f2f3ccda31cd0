//! Helpers shared by the mutex integration tests.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use hoox_edge::mutex::{
    self, ClientKey, Clock, Config, Decision, Duplicate, Grant, Key, Mode, Reserve, Unavailable,
};

pub fn config(path: &Path) -> Config {
    Config {
        path: path.to_path_buf(),
        deadline: Duration::from_secs(10),
        reopen_backoff_max: Duration::from_millis(200),
        // 16 records: the journal fills and checkpoints every few batches, so every test
        // runs the checkpoint and wrap-around path, not only the append path.
        journal_bytes: 64 * 1024,
        ..Config::default()
    }
}

pub fn key(name: &str) -> Key {
    let ck = ClientKey::parse(name).expect("test key is valid");
    Key::client("tester", Mode::Live, &ck).expect("test key fits")
}

pub fn reserve(k: &Key, ttl_ms: u64, hash: u8) -> Reserve {
    Reserve {
        key: k.clone(),
        ttl: Duration::from_millis(ttl_ms),
        payload_hash: [hash; 32],
        guard: None,
    }
}

/// The grant of a Proceed. Panics, naming the decision, on anything else.
pub fn granted(d: Decision) -> Grant {
    match d {
        Decision::Proceed(g) => g,
        other => panic!("expected Proceed, got {other:?}"),
    }
}

/// The answer of a Duplicate. Panics, naming the decision, on anything else.
pub fn duplicate(d: Decision) -> Duplicate {
    match d {
        Decision::Duplicate(d) => d,
        other => panic!("expected Duplicate, got {other:?}"),
    }
}

/// Panics unless `d` refuses because the database is not open, for a reason that says
/// `because`. `what` names the reserve in the message.
pub fn assert_not_open(d: Decision, because: &str, what: &str) {
    match d {
        Decision::Unavailable(Unavailable::NotOpen(why)) => {
            assert!(why.contains(because), "{what}: {why}")
        }
        other => panic!("{what}: expected NotOpen ({because}), got {other:?}"),
    }
}

pub fn start(path: &Path, clock: Clock) -> (mutex::Mutex, mutex::Owner) {
    mutex::start(config(path), clock)
}

/// As [`start`], holding at most `capacity` keys.
pub fn start_capped(path: &Path, clock: Clock, capacity: usize) -> (mutex::Mutex, mutex::Owner) {
    let mut cfg = config(path);
    cfg.capacity = capacity;
    mutex::start(cfg, clock)
}

/// A mutex on the system clock with the stall hook on, its test config changed by `tune`.
pub fn start_stallable(
    path: &Path,
    tune: impl FnOnce(&mut Config),
) -> (mutex::Mutex, mutex::Owner) {
    start_stallable_on(path, Clock::system(), tune)
}

/// As [`start_stallable`], on `clock`.
pub fn start_stallable_on(
    path: &Path,
    clock: Clock,
    tune: impl FnOnce(&mut Config),
) -> (mutex::Mutex, mutex::Owner) {
    let mut cfg = config(path);
    tune(&mut cfg);
    mutex::start_with(cfg, clock, true)
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Polls `f` every 20 ms until it returns true or `limit` passes.
pub async fn eventually(limit: Duration, mut f: impl AsyncFnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + limit;
    while std::time::Instant::now() < end {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Polls a call to the mutex once, which queues its command, and asserts it is still
/// waiting for the answer: a command known to be queued, without sleeping on it.
pub fn queue<F: Future>(call: std::pin::Pin<&mut F>) {
    assert!(poll_once(call).is_pending(), "answered at once");
}

/// Polls a call to the mutex once, without a waker: it queues its command, or is refused.
pub fn poll_once<F: Future>(call: std::pin::Pin<&mut F>) -> std::task::Poll<F::Output> {
    call.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
}

/// When set, the test binary was re-executed as a child process with this role.
pub const CHILD_ENV: &str = "HOOX_MUTEX_TEST_CHILD";

/// Marks the start of a child's report. libtest prints `test name ... ` without a newline
/// before the test runs, which would otherwise prefix the child's first line.
pub fn child_begin() {
    println!();
}

/// Re-executes this very test (by exact name) as a child process with `role` set.
pub fn child(test: &str, role: &str) -> std::process::Command {
    let mut c = hoox_edge::testing::rerun(test).expect("test binary path");
    c.env(CHILD_ENV, role)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    c
}
