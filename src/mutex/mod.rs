//! The two-phase idempotency mutex (SPEC §1): reserve before the order is sent, commit on
//! true success, release on failure.
//!
//! One thread, the owner (`owner.rs`), owns the redb database, the index of live keys and
//! the alarm wheel. Everyone else holds a cheap, cloneable [`Mutex`] handle that sends a
//! [`Command`] over a bounded channel and, for a reserve or a read, awaits a one-shot
//! reply; a commit or a release is queued and not answered. No lock guards the
//! state: the owner's order is the order of truth.
//!
//! A full channel refuses new work (`Busy`), but never the end of work already begun (a
//! commit, a release): those go to an unbounded overflow lane instead, which the owner
//! takes ahead of the channel. The kill switch always goes that way (`Command::route`).
//!
//! This module knows nothing of HTTP.

pub mod clock;
pub mod journal;
pub mod key;
mod owner;
pub mod stats;
mod store;
mod wheel;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Sender, SyncSender, TrySendError};
use std::time::Duration;

use tokio::sync::oneshot;

pub use clock::Clock;
pub use key::{ClientKey, Fingerprint, Key, KeyError, Mode};
pub use owner::full;
pub use stats::Stats;
pub use store::{BootTime, DecodeError, Entry, decode_entry, encode_entry};

/// A SHA-256 of the canonical trade, recorded with each entry so that the same client key
/// with a different trade is recognised (SPEC §2, 422).
pub type PayloadHash = [u8; 32];

/// How the mutex is set up. `Default` gives the production defaults.
#[derive(Debug, Clone)]
pub struct Config {
    /// The redb file. Its directory must exist; the file is created on first open.
    pub path: PathBuf,
    /// Most live keys held at once. A new trade is refused (`Unavailable::Capacity`) with
    /// fewer places free than a signed trade takes (two); at least 2.
    pub capacity: usize,
    /// Most commands taken from the channel for one batch (one journal record; a batch
    /// that does not fit the journal costs a checkpoint too). Commits, releases and kill
    /// switches from the overflow lane ride along beyond it: they were refused a place.
    pub batch_limit: usize,
    /// Depth of the command channel; a full channel is `Unavailable::Busy`.
    pub queue_depth: usize,
    /// How long a caller waits for the owner before answering `Unavailable::Timeout`
    /// ([`DEADLINE`] unless the config's `store.timeout` or a test says otherwise).
    pub deadline: Duration,
    /// Longest pause between two attempts to reopen a failed database.
    pub reopen_backoff_max: Duration,
    /// Size of the journal file beside the database (`NAME-journal`), written in full at
    /// creation. When a batch no longer fits, redb takes a checkpoint and the journal
    /// starts over; bigger means rarer checkpoints and a longer replay after a crash, but
    /// on ext4 a bigger file also makes every fdatasync slower (docs/DESIGN.md).
    pub journal_bytes: usize,
}

/// How long a caller waits for the owner by default (`store.timeout`): long enough for a
/// slow sync, short enough that a stalled disk is a 503 in seconds, not a hung webhook. A
/// reserve may wait out the sync in progress, then its own: syncs up to ~1 s fit in it.
pub const DEADLINE: Duration = Duration::from_secs(2);

impl Default for Config {
    fn default() -> Self {
        Config {
            path: PathBuf::from("mutex.redb"),
            capacity: 1_000_000,
            batch_limit: 1024,
            queue_depth: 16 * 1024,
            deadline: DEADLINE,
            reopen_backoff_max: Duration::from_secs(5),
            journal_bytes: 1024 * 1024,
        }
    }
}

/// Ask to reserve a key.
#[derive(Debug, Clone)]
pub struct Reserve {
    pub key: Key,
    pub ttl: Duration,
    pub payload_hash: PayloadHash,
    /// For a request whose HMAC signature verified: a key of the signature's own.
    pub guard: Option<Guard>,
}

/// A key held beside the trade's own for as long as a credential stays replayable (an
/// HMAC signature: until its timestamp leaves the window), so that the same request
/// replayed later, once the trade's key no longer matches (a fingerprint's minute has
/// passed), is a duplicate. The owner checks it after the trade's key and its family,
/// so a resend inside the minute still gets the trade's own answer; it stores it in the
/// same record as the trade's entry; and the trade's [`Grant`] commits and releases it, so
/// that a request that was never sent may be sent again.
#[derive(Debug, Clone)]
pub struct Guard {
    pub key: Key,
    pub ttl: Duration,
    /// Written too when the trade's key turns the request away (409), as the owner's
    /// `turned_away` says why. False when its sender may write no more such guards now
    /// (`webhook::Gateway::guard_limiter` has no token for it): that 409 goes out
    /// unguarded, as at capacity. A request that proceeds writes its guard whatever this
    /// says, and one that finds its guard (a resend) writes nothing.
    pub when_turned_away: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum State {
    Pending,
    Committed,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Committed => "committed",
        }
    }
}

/// The answer the executor gave for a committed key, kept so that a duplicate can be
/// answered with it (`duplicate_response = "replay"`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub status: u16,
    pub body: Vec<u8>,
}

/// What the owner decided for a reserve.
// `Proceed` and `Duplicate` carry a `Key` inline (bounded, no allocation); a decision is made
// once per request and moved through one channel, so its size costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq)]
pub enum Decision {
    /// The key is ours, and that is durable on disk. Settle it with [`Mutex::commit`] or
    /// [`Mutex::release`], which take the grant.
    Proceed(Grant),
    /// A live entry holds the key.
    Duplicate(Duplicate),
    /// A live entry holds the key with a different payload hash.
    Mismatch,
    /// The kill switch is on. The gateway checks it before it reserves; the owner checks
    /// again, for the switch it learns only when it opens the database (at start, or at a
    /// reopen), after the gateway's check.
    Halted,
    /// The mutex cannot guarantee anything right now: refuse the trade.
    Unavailable(Unavailable),
}

/// A reservation the owner granted: the entry it made, not only its key. Commit and
/// release take it, and act only while the key still holds that entry. Between the grant
/// and its settling, an operator may release the key (`keys release`) and a retry may
/// reserve it again while the first trade is still executing; the first trade's commit or
/// release must not touch that newer reservation, or its release would let a third
/// delivery through while the second is in flight. Not `Clone`: each grant is settled at
/// most once.
#[derive(Debug, PartialEq, Eq)]
pub struct Grant {
    key: Key,
    /// The entry's sequence number, unique for the life of the process (the owner never
    /// hands one out twice, across reopens too).
    seq: u64,
    /// The [`Guard`]'s entry, made in the same batch, settled with this one.
    guard: Option<Box<Grant>>,
}

impl Grant {
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The entry it was granted with, as [`EntryInfo::seq`] names it.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The signature guard's grant, settled with this one.
    pub fn guard(&self) -> Option<&Grant> {
        self.guard.as_deref()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Duplicate {
    /// The key that blocked: the requested one, its family's latest (a fingerprint reserved
    /// less than a minute ago), or the request's signature guard.
    pub key: Key,
    pub state: State,
    /// How long ago it was reserved, by the monotonic clock (no wall clock step moves it).
    pub age_ms: u64,
    /// Until it is free: until both clocks say it has expired.
    pub expires_in_ms: u64,
    /// Present for a committed key whose answer was stored.
    pub response: Option<Snapshot>,
    /// Which entry blocked ([`EntryInfo::seq`]): whether its order is out is asked by it.
    pub seq: u64,
    /// As [`EntryInfo::follows`], for a duplicate a follower guard caught.
    pub follows: Option<(Key, u64)>,
    /// This request's own signature guard was written now (`Guard::when_turned_away`):
    /// what its sender's guard pace is charged for, and nothing else.
    pub guarded: bool,
}

/// Why the mutex refused. Every variant means: do not forward the trade.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error("database is not open: {0}")]
    NotOpen(String),
    #[error("commit failed: {0}")]
    CommitFailed(String),
    #[error("the mutex did not answer in time")]
    Timeout,
    #[error("the mutex queue is full")]
    Busy,
    #[error("live-key capacity reached")]
    Capacity,
    #[error("the mutex is shutting down")]
    Stopped,
}

impl Unavailable {
    /// A stable label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Unavailable::NotOpen(_) => "not_open",
            Unavailable::CommitFailed(_) => "commit_failed",
            Unavailable::Timeout => "timeout",
            Unavailable::Busy => "busy",
            Unavailable::Capacity => "capacity",
            Unavailable::Stopped => "stopped",
        }
    }
}

/// One live entry, for operators.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryInfo {
    pub key: Key,
    pub state: State,
    /// Wall clock unix ms, as stored.
    pub stored_at: u64,
    pub expires_at: u64,
    /// As in [`Duplicate`]: by the monotonic clock, and until both clocks say it is free.
    pub age_ms: u64,
    pub expires_in_ms: u64,
    pub has_response: bool,
    /// Which entry this is: unique for the life of the process. An operator release given
    /// it removes this entry only, not one that took the key since ([`Mutex::force_release`]).
    pub seq: u64,
    /// Which load of the index from the disk it was seen in: another after every open (a
    /// reopen, a restart), which may have lost a commit that was carried in memory.
    pub load: u32,
    /// For the guard of a signed retry turned away by a pending trade (it is settled with
    /// that trade): the trade's key and entry, whose order is the one this entry waits on.
    pub follows: Option<(Key, u64)>,
}

/// An entry as an operator looked at it ([`Mutex::force_release`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub seq: u64,
    pub state: State,
    pub load: u32,
}

impl EntryInfo {
    /// The entry whose order this one's is ([`order_entry`]).
    pub fn order(&self) -> (&Key, u64) {
        order_entry(&self.key, self.seq, self.follows.as_ref())
    }
}

impl Duplicate {
    /// The entry whose order the blocking entry's is ([`order_entry`]).
    pub fn order(&self) -> (&Key, u64) {
        order_entry(&self.key, self.seq, self.follows.as_ref())
    }
}

/// The entry (its key and number) whose order is the one an entry waits on: its own, or,
/// for the guard of a signed retry turned away, the trade's that settles it (`follows`).
/// What `executor::outstanding` is asked, by the admin face and by a duplicate's 409 alike.
fn order_entry<'a>(key: &'a Key, seq: u64, follows: Option<&'a (Key, u64)>) -> (&'a Key, u64) {
    follows.map_or((key, seq), |(k, s)| (k, *s))
}

impl From<&EntryInfo> for Seen {
    fn from(e: &EntryInfo) -> Self {
        Seen {
            seq: e.seq,
            state: e.state,
            load: e.load,
        }
    }
}

/// What an operator release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The live entry was removed.
    Yes,
    /// The key had no live entry.
    NotFound,
    /// The key holds another entry than the one asked for: it was freed and taken again
    /// since the operator looked. Nothing was changed.
    Changed,
}

/// The owner's health, as a watchdog ping sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub live_keys: usize,
    pub halted: bool,
    /// `None` while serving; the reason while failing closed.
    pub fail_closed: Option<Unavailable>,
    /// Fewer places are left under `capacity` than a signed trade takes (two: its key and
    /// its guard), so new trades are refused (`Capacity`) until keys expire or are
    /// released, while duplicates are still answered. False while failing closed, which
    /// says so itself; true while halted too, for the kill switch once hid a full gateway
    /// until `resume` found it full.
    pub at_capacity: bool,
}

impl Status {
    /// Why every new trade is refused, if it is: failing closed, or at capacity. This is
    /// what readiness and `status` report; being halted is the operator's own doing, and
    /// told apart.
    pub fn refusing(&self) -> Option<Unavailable> {
        self.fail_closed
            .clone()
            .or(self.at_capacity.then_some(Unavailable::Capacity))
    }
}

/// What travels over the channel to the owner.
///
/// Keys are inline and bounded (no allocation to build one), which makes them ~400 bytes.
/// The channel preallocates and touches every slot, and a slot is as large as the largest
/// variant: inline, 16k slots would cost ~14 MB of resident memory before the first trade.
/// So the key-bearing payloads travel boxed, one small allocation per command, and a slot
/// is a few dozen bytes.
pub(crate) enum Command {
    /// With when it was asked, on the owner's monotonic clock: a fingerprint's minute is
    /// measured from there, not from when a busy owner got to it.
    Reserve(Box<Reserve>, oneshot::Sender<Decision>, u64),
    /// Commit and release are not answered: the channel keeps their order, so every later
    /// command sees them, and no answer could promise more (they are never made durable
    /// on their own; see `owner.rs`).
    Commit(Box<Grant>, Option<Snapshot>),
    Release(Box<Grant>),
    Get(
        Box<Key>,
        oneshot::Sender<Result<Option<EntryInfo>, Unavailable>>,
    ),
    List(usize, oneshot::Sender<Result<Vec<EntryInfo>, Unavailable>>),
    /// How many live client keys each client identity holds (`Mutex::clients`).
    Clients(oneshot::Sender<Result<Vec<(String, usize)>, Unavailable>>),
    /// Operator release: like `Release`, but durable before it answers, and says whether
    /// a live entry was removed.
    /// Given the entry as seen, only while the key still holds that entry in that state.
    ForceRelease(
        Box<Key>,
        Option<Seen>,
        oneshot::Sender<Result<Released, Unavailable>>,
    ),
    /// Kill switch, persisted durably.
    SetHalted(bool, oneshot::Sender<Result<(), Unavailable>>),
    Ping(oneshot::Sender<Status>),
    /// Test hook: the owner sleeps, as if the disk stalled. Only honoured when the
    /// process was started with the stall hook enabled (see `owner.rs`). Answered as the
    /// owner takes it, before it sleeps.
    Stall(Duration, oneshot::Sender<()>),
    /// Flush, close the database cleanly, and end the thread.
    Shutdown,
    /// Nothing: wakes an owner asleep on the channel for what took the overflow lane
    /// (`Mutex::overflow`).
    Wake,
}

/// Which way a command goes to the owner (`Mutex::enqueue`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    /// The bounded channel; refused `Busy` when it is full.
    Channel,
    /// The channel, or the overflow lane when the channel is full.
    LaneWhenFull,
    /// The overflow lane, always.
    Lane,
}

impl Command {
    /// Which way it goes. The owner applies the overflow lane ahead of the channel.
    ///
    /// - The kill switch always takes the lane: it does not wait its turn behind a
    ///   backlog, full or not, as the reserves queued before it are the ones it is thrown
    ///   to stop. Refused `Busy`, it would not work under the flood it was thrown for.
    /// - A commit or a release takes it when the channel is full: refused `Busy`, it was
    ///   lost, and a trade that failed held its key to the TTL, refusing the retry that
    ///   should have placed it.
    /// - Reserves and reads stay refusable: they are what a flood is made of, and a retry
    ///   is their remedy.
    ///
    /// The lane is bounded without the channel's help: a grant is settled once, and an
    /// operator's write waits for its answer. Going ahead of what the channel held when it
    /// was sent is harmless for these three: a commit or a release settles its own grant's
    /// entry only. Not for an operator's release: ahead of a commit queued before it (a
    /// trade that filled as the operator looked), it would free a filled trade's key. It
    /// stays `Busy`, and the operator runs it again.
    fn route(&self) -> Route {
        match self {
            Command::SetHalted(..) => Route::Lane,
            Command::Commit(..) | Command::Release(..) => Route::LaneWhenFull,
            _ => Route::Channel,
        }
    }
}

/// The handle every caller holds. Cloning it is cheap.
#[derive(Clone)]
pub struct Mutex {
    tx: SyncSender<Command>,
    /// The overflow lane (`Command::route`).
    spill: Sender<Command>,
    /// The owner's clock, to tell it when a reserve was asked.
    clock: Clock,
    deadline: Duration,
    shared: Arc<Shared>,
}

/// What the owner publishes for readers that must not wait on it (the kill-switch check on
/// every request, metrics, `STATUS=`).
#[derive(Debug, Default)]
pub struct Shared {
    pub halted: std::sync::atomic::AtomicBool,
    pub live_keys: std::sync::atomic::AtomicUsize,
    /// The database is open.
    pub serving: std::sync::atomic::AtomicBool,
    /// As [`Status::at_capacity`]: new trades refused, until keys expire or are released.
    pub at_capacity: std::sync::atomic::AtomicBool,
    /// While at capacity, when the wheel next comes due on the owner's monotonic clock:
    /// the earliest a key expires and frees a place. 0 otherwise, or with no alarm set.
    pub next_free_mono_ms: std::sync::atomic::AtomicU64,
    /// Set while the owner fails closed. Unlike `!serving`, false before the owner's first
    /// open: commands queued then are applied once it is open.
    pub failing: std::sync::atomic::AtomicBool,
    /// Turns the owner has finished. It moves while the owner works, however deep its
    /// queue: the watchdog's sign of life when a ping cannot get through a backlog.
    pub turns: std::sync::atomic::AtomicU64,
    pub stats: Stats,
}

/// The largest response a duplicate is answered with (`Duplicate::response`), as large as a
/// webhook. Each duplicate answered holds a copy until it is written, and an HTTP/2
/// connection may have 16 at once: at 1 MiB (what the executor client reads) a duplicate
/// storm cost 16 MiB a connection. The gateway keeps no larger one (its duplicates get the
/// 409); one a version before 0.2.27 kept is read as none.
pub const MAX_RESPONSE: usize = 64 * 1024;

/// The owner thread. Dropping it without [`Owner::stop`] leaves the thread to finish on
/// its own when every handle is gone.
pub struct Owner {
    tx: SyncSender<Command>,
    thread: Option<std::thread::JoinHandle<Closed>>,
}

/// How the owner left the database at its stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closed {
    /// Every journal record is in the database, and the file closed.
    Clean,
    /// It never opened one in this run (a folder not there, a broken file).
    NotOpen,
    /// The final checkpoint or the close failed, or it was failing closed after having
    /// opened the database (why). Nothing synced is lost: the journal still holds it, and
    /// the next open replays it; but the database file alone is not up to date, which a
    /// downgrade to a version before the journal relies on.
    Failed(String),
}

impl Owner {
    /// Flushes what is pending, closes the database and joins the thread.
    pub fn stop(mut self) -> Closed {
        // A full channel still accepts this blocking send once the owner drains it.
        let _ = self.tx.send(Command::Shutdown);
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(closed)) => closed,
            Some(Err(_)) => Closed::Failed("the owner thread panicked".into()),
            None => Closed::NotOpen,
        }
    }
}

/// Starts the owner thread. Never fails: a database that cannot be opened leaves the owner
/// failing closed and retrying with backoff, so the caller can still bind its listener
/// and answer 503 (SPEC §1).
pub fn start(config: Config, clock: Clock) -> (Mutex, Owner) {
    start_with(config, clock, false)
}

/// As [`start`], with the test-only stall hook enabled when `stall_hook` is true.
pub fn start_with(config: Config, clock: Clock, stall_hook: bool) -> (Mutex, Owner) {
    // Tests' and benches' starts: a machine that cannot make one thread fails them anyway.
    try_start_with(config, clock, stall_hook).expect("cannot spawn the mutex owner thread")
}

/// As [`start_with`]; an error only when the OS will not make the owner's thread (a limit
/// on processes and threads), for `serve` to say so and exit, not panic.
pub fn try_start_with(
    config: Config,
    clock: Clock,
    stall_hook: bool,
) -> std::io::Result<(Mutex, Owner)> {
    // At least one place: a rendezvous channel (0) takes nothing while the owner is busy,
    // not even the `Wake` that follows an overflow (`Mutex::overflow`).
    let (tx, rx) = std::sync::mpsc::sync_channel(config.queue_depth.max(1));
    let (spill, spilled) = std::sync::mpsc::channel();
    let shared = Arc::new(Shared::default());
    let deadline = config.deadline;
    let thread = owner::spawn(
        config,
        clock.clone(),
        rx,
        spilled,
        shared.clone(),
        stall_hook,
    )?;
    Ok((
        Mutex {
            tx: tx.clone(),
            spill,
            clock,
            deadline,
            shared,
        },
        Owner {
            tx,
            thread: Some(thread),
        },
    ))
}

impl Mutex {
    /// Reserve `req.key`. `Proceed` means the reservation is durable on disk.
    pub async fn reserve(&self, req: Reserve) -> Decision {
        // A grant that reaches a caller who stopped waiting (timed out, or its request went
        // away) is released here; one that cannot reach it, by the owner.
        let unclaimed = |m: &Mutex, d: Decision| {
            if let Decision::Proceed(grant) = d {
                log::warn!(key = grant.key.as_str(); "mutex: reserve granted after its caller gave up; released");
                let _ = m.release(grant);
            }
        };
        let d = match self
            .call_settling(
                |tx| Command::Reserve(Box::new(req), tx, self.clock.mono_ms()),
                unclaimed,
            )
            .await
        {
            Ok(d) => d,
            Err(u) => Decision::Unavailable(u),
        };
        // Counted here, where every answer passes, including Busy and Timeout.
        let s = &self.shared.stats;
        stats::inc(&s.reserves);
        stats::inc(match d {
            Decision::Proceed(_) => &s.proceeds,
            Decision::Duplicate(_) => &s.duplicates,
            Decision::Mismatch => &s.mismatches,
            Decision::Halted | Decision::Unavailable(_) => &s.unavailable,
        });
        d
    }

    /// The grant's entry becomes committed; the expiry does not move. Queued, not awaited:
    /// `Ok` means every later command to the mutex, from any caller, sees the key
    /// committed, unless the key no longer holds this grant's entry (it was released by
    /// an operator, or expired), in which case nothing changes. It rides in the next
    /// journal record, so a crash, or a failed write before that record, can undo it; the
    /// key is then pending until its TTL, which blocks a retry just as well.
    pub fn commit(&self, grant: Grant, response: Option<Snapshot>) -> Result<(), Unavailable> {
        self.send(Command::Commit(Box::new(grant), response))
    }

    /// Frees the grant's entry so that a retry may reserve the key; queued like
    /// [`Mutex::commit`], and like it a no-op once the key holds another entry. A failure
    /// is counted and logged; the key stays held meanwhile, which is safe.
    ///
    /// While the owner fails closed the release is queued all the same: the owner keeps
    /// it and makes it when the database opens again (`Owner::void`), before it serves
    /// anything. It is still reported as failed, for it is not made now, and a stop or a
    /// crash before that reopen leaves the key held until its TTL.
    pub fn release(&self, grant: Grant) -> Result<(), Unavailable> {
        use std::sync::atomic::Ordering::Relaxed;
        let key = grant.key.clone();
        let failing = self.shared.failing.load(Relaxed);
        let r = self
            .enqueue(Command::Release(Box::new(grant)))
            .and_then(|()| {
                if failing {
                    Err(Unavailable::NotOpen("the mutex is not serving".into()))
                } else {
                    Ok(())
                }
            });
        if let Err(u) = &r {
            stats::inc(&self.shared.stats.release_failures);
            log::warn!(
                "mutex: release of {key} failed ({u}); it stays held until the database \
                 reopens, or its TTL"
            );
        }
        r
    }

    pub async fn get(&self, key: Key) -> Result<Option<EntryInfo>, Unavailable> {
        self.call(|tx| Command::Get(Box::new(key), tx)).await?
    }

    /// Up to `limit` live entries, oldest expiry first.
    pub async fn list(&self, limit: usize) -> Result<Vec<EntryInfo>, Unavailable> {
        self.call(|tx| Command::List(limit, tx)).await?
    }

    /// The client identities (`psk`, `psk.NAME`, `cert.NAME`) that client keys were under
    /// at the last open, with how many each, in the identities' order: at a start, which
    /// of them no sender of the config is named any more (`app`).
    pub async fn clients(&self) -> Result<Vec<(String, usize)>, Unavailable> {
        self.call(Command::Clients).await?
    }

    /// Operator release of a held key. Given `only`, the entry as the operator looked at
    /// it, it removes that entry only, and only in the state it was seen in: between a
    /// look and a release, the key may be freed and taken again by a new order, or its
    /// order may settle (a pending trade that filled), and an operator who judged the
    /// entry as it was must not release what it has become.
    pub async fn force_release(
        &self,
        key: Key,
        only: Option<Seen>,
    ) -> Result<Released, Unavailable> {
        let shown = key.as_str().to_owned();
        // Made, and answered, but the answer not taken (the deadline passed in the same
        // poll, or the operator's request went away): the log is where they learn it.
        let unclaimed = move |_: &Mutex, r: Result<Released, Unavailable>| {
            if r == Ok(Released::Yes) {
                log::warn!(
                    "operator released key {shown}, though its caller stopped waiting {UNTAKEN}"
                );
            }
        };
        self.call_settling(
            |tx| Command::ForceRelease(Box::new(key), only, tx),
            unclaimed,
        )
        .await?
    }

    pub async fn set_halted(&self, halted: bool) -> Result<(), Unavailable> {
        let unclaimed = move |_: &Mutex, r: Result<(), Unavailable>| {
            if r.is_ok() {
                let did = if halted { "set" } else { "lifted" };
                log::warn!(
                    "operator {did} the kill switch, though its caller stopped waiting {UNTAKEN}"
                );
            }
        };
        self.call_settling(|tx| Command::SetHalted(halted, tx), unclaimed)
            .await?
    }

    /// A round trip through the owner, for the watchdog: `Err` if it did not answer in time.
    pub async fn ping(&self) -> Result<Status, Unavailable> {
        self.call(Command::Ping).await
    }

    /// Test hook; ignored unless the owner was started with it enabled. Resolves once the
    /// owner has taken it (and, with the hook, begun to sleep), so that what a test queues
    /// next waits behind the stall, in a batch of its own; `Err` if it could not be queued.
    pub fn stall(&self, d: Duration) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.try_send(Command::Stall(d, tx));
        rx
    }

    /// The kill switch as last published by the owner. No round trip.
    pub fn is_halted(&self) -> bool {
        self.shared
            .halted
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How long a caller waits for an answer before it gives up.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// While new trades are refused at capacity: how long until the next key's alarm, the
    /// earliest a place frees by itself (a release frees one sooner; an alarm for a key
    /// since taken again frees none, and the next is the one after). `None` otherwise.
    pub fn next_free_in(&self) -> Option<Duration> {
        use std::sync::atomic::Ordering::Relaxed;
        let due = self.shared.next_free_mono_ms.load(Relaxed);
        (due != 0).then(|| Duration::from_millis(due.saturating_sub(self.clock.mono_ms())))
    }

    /// Published counters and gauges. No round trip.
    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Queues a command that is not answered. A failing-closed owner would drop it, so
    /// that is said now rather than never.
    fn send(&self, cmd: Command) -> Result<(), Unavailable> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.shared.failing.load(Relaxed) {
            return Err(Unavailable::NotOpen("the mutex is not serving".into()));
        }
        self.enqueue(cmd)
    }

    fn enqueue(&self, cmd: Command) -> Result<(), Unavailable> {
        let route = cmd.route();
        if route == Route::Lane {
            return self.overflow(cmd);
        }
        match self.tx.try_send(cmd) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(cmd)) if route == Route::LaneWhenFull => self.overflow(cmd),
            Err(TrySendError::Full(_)) => Err(Unavailable::Busy),
            Err(TrySendError::Disconnected(_)) => Err(Unavailable::Stopped),
        }
    }

    /// Queues on the overflow lane, which the owner applies ahead of the channel.
    fn overflow(&self, cmd: Command) -> Result<(), Unavailable> {
        self.spill.send(cmd).map_err(|_| Unavailable::Stopped)?;
        // The owner may be asleep on an empty channel; or the channel was full a moment
        // ago, but this thread may have been preempted since, and the owner may have
        // drained it all and gone to sleep before the lane held this. A wake that finds
        // the channel full is not needed: the owner takes the lane after each drain of
        // the channel.
        match self.tx.try_send(Command::Wake) {
            Ok(()) | Err(TrySendError::Full(_)) => Ok(()),
            Err(TrySendError::Disconnected(_)) => Err(Unavailable::Stopped),
        }
    }

    async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, Unavailable> {
        self.call_settling(make, |_, _| {}).await
    }

    /// A round trip to the owner. An answer sent but never taken (the deadline passed, or
    /// the caller dropped this future, between the owner's send and the caller's next
    /// poll) goes to `unclaimed` instead of being dropped unseen.
    async fn call_settling<T, F: FnOnce(&Mutex, T)>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
        unclaimed: F,
    ) -> Result<T, Unavailable> {
        let (tx, rx) = oneshot::channel();
        self.enqueue(make(tx))?;
        let mut waiting = Waiting {
            rx,
            mutex: self,
            unclaimed: Some(unclaimed),
        };
        match tokio::time::timeout(self.deadline, &mut waiting.rx).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) => Err(Unavailable::Stopped),
            Err(_) => Err(Unavailable::Timeout),
        }
    }
}

/// How an operator's write whose answer was sent but not taken is logged: made, though the
/// caller was told otherwise, or nothing.
const UNTAKEN: &str = "(it was answered 503, or its client had gone, as the answer came)";

/// The receiving end of a call, which settles an answer nobody took when dropped.
struct Waiting<'a, T, F: FnOnce(&Mutex, T)> {
    rx: oneshot::Receiver<T>,
    mutex: &'a Mutex,
    unclaimed: Option<F>,
}

impl<T, F: FnOnce(&Mutex, T)> Drop for Waiting<'_, T, F> {
    fn drop(&mut self) {
        // Closed first: from here on the owner's send fails, and the owner settles the
        // answer itself (`Reply::send`). Whatever it sent before is still in the channel.
        self.rx.close();
        if let (Ok(v), Some(unclaimed)) = (self.rx.try_recv(), self.unclaimed.take()) {
            unclaimed(self.mutex, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `/readyz`, `status` and systemd's `STATUS=` say: failing closed wins, then a
    /// mutex at capacity; only a mutex that takes new trades refuses nothing.
    #[test]
    fn refusing_says_failing_closed_first_then_capacity() {
        let status = |fail_closed: Option<Unavailable>, at_capacity| Status {
            live_keys: 0,
            halted: false,
            fail_closed,
            at_capacity,
        };
        let closed = Unavailable::NotOpen("disk gone".into());
        assert_eq!(status(None, false).refusing(), None);
        assert_eq!(status(None, true).refusing(), Some(Unavailable::Capacity));
        assert_eq!(
            status(Some(closed.clone()), false).refusing(),
            Some(closed.clone())
        );
        assert_eq!(status(Some(closed.clone()), true).refusing(), Some(closed));
    }
}
