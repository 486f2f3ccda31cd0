//! The owner thread: the one place that reads and writes the mutex's state.
//!
//! Each turn of the loop: wait for a command (or the next alarm, or the next reopen
//! attempt), drain what else is queued up to `batch_limit`, apply it all to the in-memory
//! index and to ONE journal record, and only then answer. A batch that granted a key or
//! holds an operator write has its record written and synced first (one direct write, or
//! a write and an fdatasync), so no Proceed leaves this thread before it is on disk.
//! Anything else (commit, release, expiry) is carried into the next record, or written
//! unsynced when the owner goes idle: a crash that loses it leaves a key pending until its
//! TTL, which only ever blocks a retry, never lets one through. redb is written only at
//! checkpoints (`store.rs`); docs/DESIGN.md has the whole protocol.
//!
//! Any storage error drops the database and the index, and the owner fails closed until a
//! reopen (with exponential backoff) rebuilds both from disk.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::key::{self, BUCKET_MS};
use super::stats::inc;
use super::store::{self, Batch, BootTime, Entry, Store, WriteError};
use super::wheel::Wheel;
use super::{
    Clock, Closed, Command, Config, Decision, Duplicate, EntryInfo, Grant, Key, PayloadHash,
    Released, Reserve, Shared, Snapshot, State, Status, Unavailable,
};

/// The most keys one trade takes: its own, and a signed request's guard.
const MOST_KEYS_PER_TRADE: usize = 2;

/// Whether `live` keys leave no place under `capacity` for a new trade: fewer places than
/// a signed trade takes. The rule `reserve` refuses new trades by, and what the reload
/// warns of when the file lowers `limits.capacity`.
pub fn full(live: usize, capacity: usize) -> bool {
    live + MOST_KEYS_PER_TRADE > capacity
}

/// First pause after a failure; doubled up to `Config::reopen_backoff_max`.
const BACKOFF_START: Duration = Duration::from_millis(50);

/// The most a carried record may hold before it is written anyway: a few journal slots,
/// so a stream of commits with no reserve among them still reaches the journal.
const CARRY_MAX: usize = 16 * 1024;

/// How long an idle owner waits for a record to carry its operations in before it writes
/// them on their own. A webhook's commit comes just after its reserve's answer, when the
/// owner often has nothing else to do: written at once, it took a `pwrite` and a journal
/// slot of its own, which fills the journal and brings the next checkpoint closer. At 16
/// connections the owner made 3.0 `pwrite`s per `fdatasync` that way, 1.2 with the wait
/// (strace); a process crash within the wait loses only what a crash always could.
const CARRY_IDLE: Duration = Duration::from_millis(2);

/// How many alarms beyond twice the indexed keys the wheel may hold before the stale ones
/// are swept (`Owner::sweep_stale_alarms`).
const STALE_ALARMS: usize = 4096;

/// How often the owner looks that its files are still the ones it opened
/// (`Owner::check_files`): two `stat`s. A little under the supervisor's ping, once a
/// second, so that every ping to an idle owner finds a check due: at exactly a second, a
/// ping a hair early found the last check not a second old, and the next look came 2 s on.
const FILES_CHECK: Duration = Duration::from_millis(900);

/// How many alarms a turn's step of that sweep looks at, at least (a step takes whole
/// buckets). With a million live keys a bucket holds ~1,000 alarms: a step of one took
/// 0.11 ms (p50) where the whole pass at once held the owner 300–350 ms.
const SWEEP_STEP: usize = 512;

pub(super) fn spawn(
    config: Config,
    clock: Clock,
    rx: Receiver<Command>,
    spilled: Receiver<Command>,
    shared: Arc<Shared>,
    stall_hook: bool,
) -> std::io::Result<std::thread::JoinHandle<Closed>> {
    std::thread::Builder::new()
        .name("hoox-mutex".into())
        .spawn(move || Owner::new(config, clock, shared, stall_hook).run(rx, spilled))
}

/// What the index keeps per key: everything a decision needs, but not the response body,
/// which is read back (from the batch, the records since the checkpoint, or redb) only
/// when a duplicate asks for it.
#[derive(Debug, Clone)]
struct Live {
    /// Where the entry sits in the table.
    seq: u64,
    state: State,
    stored_at: u64,
    expires_at: u64,
    payload_hash: PayloadHash,
    has_response: bool,
    /// When the monotonic clock says it expires: the wheel's alarm.
    due_mono: u64,
    /// Until when, on the monotonic clock, the wall clock may hold it past `due_mono`:
    /// `due_mono` itself where that is exact (reserved in this boot), else its TTL from
    /// when this process took it from the disk, which no key read there has left
    /// (`Live::live`).
    hold: u64,
}

/// An entry's deadlines, kept through a failure (`Owner::dues`).
#[derive(Debug, Clone, Copy)]
struct Due {
    mono: u64,
    wall: u64,
    hold: u64,
}

impl Due {
    /// As `Live::live`.
    fn live(&self, (now_wall, now_mono): (u64, u64)) -> bool {
        self.mono > now_mono || (self.wall > now_wall && self.hold > now_mono)
    }
}

impl Live {
    /// How long ago it was stored, by the monotonic clock: a wall clock stepped forward
    /// must not age a key, nor one stepped back keep it young for the length of the step.
    /// The monotonic time it was stored at follows from its monotonic deadline less its
    /// TTL: later than it was, if a reopen kept a later deadline (younger, which is safe);
    /// after a restart, from the entry's boot deadline if it was written in this boot, else
    /// from the deadline the wall clock of the open guessed. What the 409 and `keys show`
    /// say; the fingerprint rule takes [`Live::age_at_least_ms`].
    fn age_ms(&self, now_mono: u64) -> u64 {
        self.age_from(self.due_mono, now_mono)
    }

    /// How long ago it was stored, at least: as [`Live::age_ms`], but for a key whose
    /// deadline is a guess, no older than the time since the process read it (its `hold`
    /// less its TTL). From the guess, a wall clock stepped forward between a trade and a
    /// restart aged its fingerprint by the step, and a retry that crossed the minute
    /// (another fingerprint) was taken for a new trade, a second after it.
    fn age_at_least_ms(&self, now_mono: u64) -> u64 {
        self.age_from(self.due_mono.max(self.hold), now_mono)
    }

    fn age_from(&self, due: u64, now_mono: u64) -> u64 {
        let ttl = self.expires_at.saturating_sub(self.stored_at);
        now_mono.saturating_sub(due.saturating_sub(ttl))
    }

    /// Live until its monotonic deadline, and after it while the wall clock says so, up
    /// to `hold`. A wall clock stepped forward (NTP, an operator, a VM resumed) must not
    /// free a key early, and the monotonic clock is not stepped. Where that deadline is a
    /// guess (a key read from the disk in another boot, or one unknown: from the wall
    /// clock of that moment, which may have been ahead), only the wall clock survives the
    /// reboot to say more; but never past `hold`, a TTL from when the key was read, by
    /// which it has expired whatever the clocks said. Uncapped, a clock a year ahead when
    /// a key was taken, set right, held it for the year.
    fn live(&self, (now_wall, now_mono): (u64, u64)) -> bool {
        self.due_mono > now_mono || self.wall_holds((now_wall, now_mono))
    }

    fn wall_holds(&self, (now_wall, now_mono): (u64, u64)) -> bool {
        self.expires_at > now_wall && self.hold > now_mono
    }

    /// How long until it is free (`live`).
    fn expires_in_ms(&self, now @ (now_wall, now_mono): (u64, u64)) -> u64 {
        let by_wall = match self.wall_holds(now) {
            true => (self.expires_at - now_wall).min(self.hold - now_mono),
            false => 0,
        };
        by_wall.max(self.due_mono.saturating_sub(now_mono))
    }
}

/// A fingerprint's key, hashed and compared as its family (`key::family`), so that a set
/// of them holds one key per family and is searched by the family.
struct Latest(Rc<str>);

impl Latest {
    fn family(&self) -> &str {
        key::family(&self.0).unwrap_or(&self.0)
    }
}

impl PartialEq for Latest {
    fn eq(&self, other: &Self) -> bool {
        self.family() == other.family()
    }
}

impl Eq for Latest {}

impl Hash for Latest {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.family().hash(h)
    }
}

impl Borrow<str> for Latest {
    fn borrow(&self) -> &str {
        self.family()
    }
}

/// An answer computed inside a batch, sent only once the batch's commit has returned.
enum Reply {
    /// A Proceed, kept apart in case nobody is left to take it.
    Granted(oneshot::Sender<Decision>, Grant),
    Decision(oneshot::Sender<Decision>, Decision),
    /// The kill switch, as set.
    Halted(oneshot::Sender<Result<(), Unavailable>>, bool),
    Entry(
        oneshot::Sender<Result<Option<EntryInfo>, Unavailable>>,
        Option<EntryInfo>,
    ),
    List(
        oneshot::Sender<Result<Vec<EntryInfo>, Unavailable>>,
        Vec<EntryInfo>,
    ),
    Clients(
        oneshot::Sender<Result<Vec<(String, usize)>, Unavailable>>,
        Vec<(String, usize)>,
    ),
    Released(
        oneshot::Sender<Result<Released, Unavailable>>,
        Released,
        Box<Key>,
    ),
    Status(oneshot::Sender<Status>, Status),
}

/// How an operator's write that outlasted its caller's deadline is logged: made, though
/// the caller was told otherwise.
const LATE: &str =
    "(it was answered 503: the write was taken in time, but its sync outlasted the deadline)";

impl Reply {
    /// Returns the grant of a Proceed whose caller had already given up (its deadline
    /// passed, or its client went away): the trade was never sent, and its key must be
    /// freed for a retry (`Owner::release_abandoned`). Any other answer nobody takes is
    /// simply dropped.
    fn send(self) -> Option<Grant> {
        let _ = match self {
            Reply::Granted(tx, grant) => {
                return match tx.send(Decision::Proceed(grant)) {
                    Err(Decision::Proceed(grant)) => Some(grant),
                    _ => None,
                };
            }
            Reply::Decision(tx, d) => tx.send(d).map_err(drop),
            // An operator's write, made though its caller gave up (taken in time, but its
            // sync outlasted the deadline): the operator was told it failed, so the log
            // is where they learn it was made.
            Reply::Halted(tx, on) => tx.send(Ok(())).map_err(drop).inspect_err(|()| {
                let did = if on { "set" } else { "lifted" };
                log::warn!("operator {did} the kill switch, though the caller had given up {LATE}");
            }),
            Reply::Entry(tx, e) => tx.send(Ok(e)).map_err(drop),
            Reply::List(tx, l) => tx.send(Ok(l)).map_err(drop),
            Reply::Clients(tx, c) => tx.send(Ok(c)).map_err(drop),
            Reply::Released(tx, r, key) => tx.send(Ok(r)).map_err(drop).inspect_err(|()| {
                if r == Released::Yes {
                    log::warn!(
                        "operator released key {key}, though the caller had given up {LATE}"
                    );
                }
            }),
            Reply::Status(tx, s) => tx.send(s).map_err(drop),
        };
        None
    }

    /// The batch did not commit: whatever was decided is void. Returns the grant of a
    /// Proceed so voided: its entry may yet be on the disk (`Owner::void`).
    fn fail(self, u: &Unavailable) -> Option<Grant> {
        let _ = match self {
            Reply::Granted(tx, grant) => {
                let _ = tx.send(Decision::Unavailable(u.clone()));
                return Some(grant);
            }
            Reply::Decision(tx, _) => tx.send(Decision::Unavailable(u.clone())).map_err(drop),
            Reply::Halted(tx, _) => tx.send(Err(u.clone())).map_err(drop),
            Reply::Entry(tx, _) => tx.send(Err(u.clone())).map_err(drop),
            Reply::List(tx, _) => tx.send(Err(u.clone())).map_err(drop),
            Reply::Clients(tx, _) => tx.send(Err(u.clone())).map_err(drop),
            Reply::Released(tx, ..) => tx.send(Err(u.clone())).map_err(drop),
            Reply::Status(tx, mut s) => {
                s.fail_closed = Some(u.clone());
                tx.send(s).map_err(drop)
            }
        };
        None
    }
}

struct Owner {
    config: Config,
    clock: Clock,
    shared: Arc<Shared>,
    stall_hook: bool,
    /// `None` while failing closed.
    store: Option<Store>,
    /// Writes not yet in the journal: commits, releases and expiries, which promise no
    /// durability, ride in the next record instead of costing one of their own (see
    /// `write_batch`). Empty between batches otherwise, its buffers kept for reuse.
    carry: Batch,
    /// Grants sent this turn that nobody took, released at its end.
    abandoned: Vec<Grant>,
    /// Expired entries this turn's reserves replaced before the wheel reaped them (an
    /// expired entry is absent at once): counted with the reaped ones once written.
    replaced: u64,
    /// Grants released since the last record was written: their releases are only in
    /// `carry` (or in the batch being built). A failed write drops those, so `fail` moves
    /// the grants to `void`, to be released again.
    released: Vec<Grant>,
    /// Grants whose trade was never sent, or whose release a failed write dropped: made
    /// before a write failed, their entries may be on the disk all the same (a sync that
    /// fails after its write landed, or an earlier record), and a reopen would find the
    /// keys held. Released by the reopen that succeeds, so that the retry is let through.
    void: Vec<Grant>,
    index: HashMap<Rc<str>, Live>,
    /// The guards of signed requests turned away by a pending trade (`Owner::turned_away`),
    /// by that trade's grant (its entry's number): settled when it is, as its own guard is,
    /// whether or not the trade's entry is still there, with that trade's key: a guard's
    /// order is its trade's (`Owner::leader_of`). Pruned, at each idle checkpoint and
    /// each reopen, of the guards no longer held (a grant that never settles: its owner
    /// stopped, or the gateway could not queue its commit).
    followers: HashMap<u64, (Key, Vec<Grant>)>,
    /// Each fingerprint's latest key in `index`, found by its family (the key without its
    /// minute): what makes a fingerprint reserved less than a minute ago a duplicate
    /// whatever its bucket.
    latest: HashSet<Latest>,
    /// The client identities of the index's keys at the last open, with how many each
    /// (`clients_of`): a start's check of them against the config (`Mutex::clients`).
    clients: Vec<(String, usize)>,
    /// This boot (`Clock::boot`), whose clock the monotonic one is: an entry's boot
    /// deadline is its monotonic one. `None` when the boot is not known (entries then
    /// carry none).
    boot: Option<u32>,
    /// While failing closed: the deadlines of the entries the index held live, by entry
    /// number. The reopen reads the table by the wall clock and the entries' boot
    /// deadlines; an entry without one of this boot has only the wall clock, which may
    /// have been stepped forward meanwhile: the monotonic deadlines kept here keep a key
    /// live as the index did. `live_keys` counts those either clock still holds.
    dues: HashMap<u64, Due>,
    /// The kill switch as last written, beside `halted`, which a batch sets before it is
    /// written (`fail`).
    halted_written: bool,
    /// Alarms carry the expiry they were set for, so an alarm left behind by a released and
    /// re-reserved key is recognised as stale and ignored.
    wheel: Wheel<(Rc<str>, u64)>,
    halted: bool,
    /// The table key of the next reserved entry.
    next_seq: u64,
    /// `Some` while failing closed: what every reserve is answered.
    failure: Option<Unavailable>,
    backoff: Duration,
    /// Real time, not the injected clock: the disk comes back in the real world.
    retry_at: Instant,
    /// When the files were last found in place (`Owner::check_files`).
    files_checked: Instant,
    /// Whether the database has been open in this process: from then on a file that is
    /// gone was lost (an unmounted disk, say), never new, and is not created again.
    opened: bool,
    /// Whether this process has found a file of the database here, open or not: from then
    /// on it makes none either (`store::Create`).
    found: bool,
    /// Which load of the index from the disk this is: drawn at random at each open. An
    /// operator's look names it (`EntryInfo::load`), so that a look from before a reopen or
    /// a restart, either of which may have lost a commit carried in memory (its entry
    /// pending again), never matches after it.
    load: u32,
}

impl Owner {
    fn new(config: Config, clock: Clock, shared: Arc<Shared>, stall_hook: bool) -> Self {
        let wheel = Wheel::new(clock.mono_ms());
        Owner {
            config,
            clock,
            shared,
            stall_hook,
            store: None,
            carry: Batch::default(),
            abandoned: Vec::new(),
            replaced: 0,
            released: Vec::new(),
            void: Vec::new(),
            index: HashMap::new(),
            followers: HashMap::new(),
            latest: HashSet::new(),
            clients: Vec::new(),
            boot: None,
            dues: HashMap::new(),
            halted_written: false,
            wheel,
            halted: false,
            next_seq: 0,
            failure: Some(Unavailable::NotOpen("not opened yet".into())),
            backoff: Duration::ZERO,
            retry_at: Instant::now(),
            files_checked: Instant::now(),
            opened: false,
            found: false,
            load: 0,
        }
    }

    fn run(mut self, rx: Receiver<Command>, spilled: Receiver<Command>) -> Closed {
        self.reopen();
        let limit = self.config.batch_limit.max(1);
        let mut batch = Vec::with_capacity(limit);
        let mut early = Vec::new();
        loop {
            // What took the overflow lane (a full channel's commits and releases, and the
            // kill switch) does not wait for a turn of its own, and the owner does not
            // sleep while any is left. (One sent while it sleeps is followed by a `Wake`
            // on the channel: `Mutex::overflow`.)
            early.extend(spilled.try_iter());
            let overflowed = !early.is_empty();
            // Nothing queued and a checkpoint's worth of records kept: take it now, while
            // idle, rather than when the journal is full, in front of some caller.
            let mut first = Err(RecvTimeoutError::Timeout);
            if overflowed || self.store.as_ref().is_some_and(Store::checkpoint_due) {
                first = rx.try_recv().map_err(|e| match e {
                    TryRecvError::Empty => RecvTimeoutError::Timeout,
                    TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
                });
                if !overflowed && matches!(first, Err(RecvTimeoutError::Timeout)) {
                    self.checkpoint();
                }
            }
            let idle = !overflowed && matches!(first, Err(RecvTimeoutError::Timeout));
            if idle && !self.carry.record().is_empty() {
                // Idle with operations carried: wait a little for a record to carry them
                // in, then write them on their own, unsynced, so that a crash of this
                // process (the page cache survives it) keeps them. The loop comes back
                // here with nothing carried, and sleeps.
                let grace = self.next_wake().map_or(CARRY_IDLE, |t| t.min(CARRY_IDLE));
                first = rx.recv_timeout(grace);
                if matches!(first, Err(RecvTimeoutError::Timeout)) {
                    self.maintain("journal write", |o, store| {
                        let w = std::mem::take(&mut o.carry);
                        o.write_record(store, w, false, &mut Vec::new())
                    });
                }
            } else if idle {
                first = match self.next_wake() {
                    None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                    Some(t) => rx.recv_timeout(t),
                };
            }
            match first {
                Ok(cmd) => batch.push(cmd),
                Err(RecvTimeoutError::Timeout) => {}
                // Every handle is gone: nobody can ask anything again, once what
                // overflowed (up to the last handle's drop) is applied.
                Err(RecvTimeoutError::Disconnected) => {
                    early.extend(spilled.try_iter());
                    if early.is_empty() {
                        break;
                    }
                }
            }
            while batch.len() < limit && !matches!(batch.last(), Some(Command::Shutdown)) {
                match rx.try_recv() {
                    Ok(cmd) => batch.push(cmd),
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                }
            }
            // Taken again, after the channel and applied before it: a command that
            // overflowed before one in this batch was sent is in this batch, ahead of it,
            // as the channel would have kept them. The channel's own order is kept.
            early.extend(spilled.try_iter());
            if !early.is_empty() {
                batch.splice(0..0, early.drain(..));
            }
            if self.store.is_none() && Instant::now() >= self.retry_at {
                self.reopen();
            } else if self.files_checked.elapsed() >= FILES_CHECK {
                self.check_files();
            }
            let stop = self.turn(&mut batch);
            self.shared.turns.fetch_add(1, Ordering::Relaxed);
            if stop {
                break;
            }
        }
        self.close()
    }

    /// How long the loop may sleep: until the next alarm, or the next reopen attempt.
    fn next_wake(&self) -> Option<Duration> {
        let alarm = self
            .wheel
            .next_due_ms()
            .map(|due| Duration::from_millis(due.saturating_sub(self.clock.mono_ms()).max(1)));
        let reopen = self
            .store
            .is_none()
            .then(|| self.retry_at.saturating_duration_since(Instant::now()));
        match (alarm, reopen) {
            (Some(a), Some(r)) => Some(a.min(r)),
            (a, r) => a.or(r),
        }
    }

    /// One batch: expiries that are due plus the queued commands. Returns true on Shutdown.
    fn turn(&mut self, batch: &mut Vec<Command>) -> bool {
        let Holds {
            stop,
            reads,
            writes,
        } = Holds::of(batch);
        let Some(mut store) = self.store.take() else {
            let u = self.failure.clone().unwrap_or(Unavailable::Stopped);
            for cmd in batch.drain(..) {
                self.refuse(cmd, &u);
            }
            // A refused release voids its grant: the count leaves it out (`live_keys`).
            self.publish_index();
            return stop;
        };
        let now_wall = self.clock.wall_ms();
        let now_mono = self.clock.mono_ms();
        let expired = self.due_expiries(now_wall, now_mono);
        // A read is answered only once every earlier write is in the journal.
        let writes = writes || !expired.is_empty() || (reads && !self.carry.record().is_empty());
        // What callers asked: a `Wake` asks nothing.
        let size = batch.iter().filter(|c| !matches!(c, Command::Wake)).count();
        let mut replies = Vec::with_capacity(size);
        let outcome = if writes {
            self.write_batch(
                &mut store,
                batch,
                &expired,
                (now_wall, now_mono),
                reads,
                &mut replies,
            )
        } else {
            for cmd in batch.drain(..) {
                if let Some(r) = self.read_only(cmd, (now_wall, now_mono)) {
                    replies.push(r);
                }
            }
            Ok(())
        };
        match outcome {
            Ok(()) => {
                self.store = Some(store);
                self.halted_written = self.halted;
                if size > 0 {
                    self.shared.stats.batch_size.observe(size as f64);
                }
                let replaced = std::mem::take(&mut self.replaced);
                self.shared
                    .stats
                    .expired
                    .fetch_add(expired.len() as u64 + replaced, Ordering::Relaxed);
                self.publish();
                for r in replies {
                    self.abandoned.extend(r.send());
                }
                self.release_abandoned((now_wall, now_mono));
                self.sweep_stale_alarms(size);
            }
            Err(e) => {
                log::error!("mutex: write failed, failing closed until reopened: {e}");
                // Not known to be written: the reopen counts those it finds on the disk; one
                // whose record landed before a failed checkpoint goes uncounted (a metric).
                self.replaced = 0;
                let u = Unavailable::CommitFailed(e.to_string());
                // The index holds this batch's uncommitted changes: drop it with the
                // database; a reopen rebuilds both from what is truly on disk.
                drop(store);
                self.fail(u.clone());
                for r in replies {
                    self.void.extend(r.fail(&u));
                }
                for cmd in batch.drain(..) {
                    self.refuse(cmd, &u);
                }
                // The count without the grants just voided (`live_keys`).
                self.publish_index();
            }
        }
        stop
    }

    /// Applies a batch to the index and to its journal record, makes the record durable,
    /// and answers. On error, the commands not yet applied stay in `batch`, and the
    /// replies not yet sent in `replies`.
    ///
    /// A batch that granted a key or holds an operator write is written and synced
    /// before its replies go out. One that only commits, releases or expires promises no
    /// durability, so it costs no write at all: its operations are carried into the next
    /// record, written when a batch next grants a key, when a read is asked, or when the
    /// owner has been idle for `CARRY_IDLE`. Until then only a crash of this process can
    /// lose them, and what it loses leaves keys held, never free.
    fn write_batch(
        &mut self,
        store: &mut Store,
        batch: &mut Vec<Command>,
        expired: &[Rc<str>],
        (now_wall, now_mono): (u64, u64),
        reads: bool,
        replies: &mut Vec<Reply>,
    ) -> Result<(), WriteError> {
        let mut durable = false;
        let mut w = std::mem::take(&mut self.carry);
        for k in expired {
            if let Some(l) = self.unindex(k) {
                w.delete(l.seq)?;
            }
        }
        let mut cmds = std::mem::take(batch).into_iter();
        while let Some(cmd) = cmds.next() {
            match self.apply(cmd, &mut w, store, now_wall, now_mono, &mut durable) {
                Ok(Some(r)) => replies.push(r),
                Ok(None) => {}
                Err(failed) => {
                    let (e, cmd) = *failed;
                    batch.extend(cmd);
                    batch.extend(cmds);
                    return Err(e);
                }
            }
        }
        if !durable && !reads && w.record().len() < CARRY_MAX {
            self.carry = w;
            self.publish_index();
            return Ok(());
        }
        self.write_record(store, w, durable, replies)
    }

    /// A record is in the journal: the releases it carried are written, and the disk takes
    /// writes again, so the next failure starts its backoff from the beginning. Only a
    /// write resets it, not a batch that wrote nothing (duplicates alone): a disk that opens
    /// but cannot take a write must not be reopened, and rescanned, every 50 ms.
    fn wrote(&mut self) {
        self.released.clear();
        self.backoff = Duration::ZERO;
    }

    /// Writes `w` as one journal record (synced if `durable`), sends `replies`, and keeps
    /// the record for the next checkpoint; when it does not fit in the journal, takes that
    /// checkpoint now, before answering.
    fn write_record(
        &mut self,
        store: &mut Store,
        mut w: Batch,
        durable: bool,
        replies: &mut Vec<Reply>,
    ) -> Result<(), WriteError> {
        if w.record().is_empty() {
            // Only duplicates (or no-ops): nothing to write.
            self.carry = w;
            self.publish_index();
            return Ok(());
        }
        let t = Instant::now();
        let journaled = store.journal.fits(w.record().len());
        if journaled {
            store.journal.append(w.record(), durable)?;
            self.wrote();
            if durable {
                self.shared
                    .stats
                    .fsync_seconds
                    .observe(t.elapsed().as_secs_f64());
            }
            self.publish_index();
            for r in replies.drain(..) {
                self.abandoned.extend(r.send());
            }
        } else {
            store.journal.skip();
        }
        let applied = store::apply(store, &mut w, !journaled);
        // `apply` leaves the batch empty; its buffers serve the next one.
        self.carry = w;
        applied?;
        if !journaled {
            // An empty record names the batch's lsn, so that a database from before this
            // checkpoint, put back beside the journal, is refused (`Journal::skip`).
            store.journal.append(&[], true)?;
            self.wrote();
            let took = t.elapsed().as_secs_f64();
            self.shared.stats.fsync_seconds.observe(took);
            self.shared.stats.checkpoint_seconds.observe(took);
        }
        Ok(())
    }

    /// Applies one command to the index and the transaction. On a storage error, returns
    /// the command (if it still needs an answer) with the error.
    fn apply(
        &mut self,
        cmd: Command,
        w: &mut Batch,
        store: &Store,
        now_wall: u64,
        now_mono: u64,
        durable: &mut bool,
    ) -> Result<Option<Reply>, Box<(WriteError, Option<Command>)>> {
        match cmd {
            // Its caller gave up while it was queued (its deadline passed behind a stall, or
            // its client hung up) and was told the trade did not run. Taking the key anyway
            // would refuse, as a duplicate, the retry that comes in the same batch, though
            // this trade was never sent. (One that gives up after this point is released
            // at the end of the turn: `Owner::release_abandoned`.)
            Command::Reserve(_, tx, _) if tx.is_closed() => Ok(None),
            Command::Reserve(req, tx, asked) => {
                match self.reserve(&req, asked, w, (now_wall, now_mono), durable) {
                    Ok(Decision::Proceed(grant)) => Ok(Some(Reply::Granted(tx, grant))),
                    Ok(d) => Ok(Some(Reply::Decision(tx, d))),
                    Err(e) => Err(Box::new((e, Some(Command::Reserve(req, tx, asked))))),
                }
            }
            Command::Commit(grant, response) => {
                let now = (now_wall, now_mono);
                let committed = self.commit(&grant, response, w, now);
                let guard = grant.guard.as_ref().map(|g| self.commit(g, None, w, now));
                for f in self.take_followers(grant.seq) {
                    if let Err(e) = self.commit(&f, None, w, now) {
                        return Err(Box::new((e, None)));
                    }
                }
                match (committed, guard.transpose()) {
                    (Ok(true), Ok(_)) => inc(&self.shared.stats.commits),
                    (Ok(false), Ok(_)) => entry_gone("commit", &grant),
                    (Err(e), _) | (_, Err(e)) => return Err(Box::new((e, None))),
                }
                Ok(None)
            }
            Command::Release(grant) => match self.release(&grant, w, (now_wall, now_mono)) {
                Ok(true) => {
                    inc(&self.shared.stats.releases);
                    self.released.push(*grant);
                    Ok(None)
                }
                Ok(false) => {
                    entry_gone("release", &grant);
                    // Its guard's and followers' releases may still be in the carry, which
                    // a failed write drops: kept like a made release, to redo (`fail`).
                    self.released.push(*grant);
                    Ok(None)
                }
                // Only if postcard fails to encode into a `Vec`: the batch fails, and the
                // release is made again at the reopen, as any a failed write dropped.
                Err(e) => {
                    self.released.push(*grant);
                    Err(Box::new((e, None)))
                }
            },
            // An operator write whose caller has given up was reported to the operator as
            // failed (503): applying it now would do what they were told did not happen.
            Command::ForceRelease(_, _, tx) if tx.is_closed() => Ok(None),
            Command::SetHalted(_, tx) if tx.is_closed() => Ok(None),
            Command::ForceRelease(key, Some(seen), tx)
                if self
                    .index
                    .get(key.as_str())
                    .is_some_and(|l| l.seq != seen.seq || l.state != seen.state)
                    || self.load != seen.load =>
            {
                Ok(Some(Reply::Released(tx, Released::Changed, key)))
            }
            Command::ForceRelease(key, only, tx) => {
                match self.remove(&key, w, (now_wall, now_mono)) {
                    Ok(was_live) => {
                        *durable = true;
                        let r = if was_live {
                            inc(&self.shared.stats.operator_releases);
                            Released::Yes
                        } else {
                            Released::NotFound
                        };
                        Ok(Some(Reply::Released(tx, r, key)))
                    }
                    Err(e) => Err(Box::new((e, Some(Command::ForceRelease(key, only, tx))))),
                }
            }
            Command::SetHalted(halted, tx) => match w.set_halted(halted) {
                Ok(()) => {
                    *durable = true;
                    self.halted = halted;
                    Ok(Some(Reply::Halted(tx, halted)))
                }
                Err(e) => Err(Box::new((e, Some(Command::SetHalted(halted, tx))))),
            },
            other => Ok(self.read_only(other, (now_wall, now_mono))),
        }
        .map(|r| {
            // A duplicate of a committed key may want its stored answer; read it through
            // the batch, which sees what this batch wrote (`Batch::response`).
            match r {
                Some(Reply::Decision(tx, Decision::Duplicate(mut d)))
                    if d.state == State::Committed
                        && self
                            .index
                            .get(d.key.as_str())
                            .is_some_and(|l| l.has_response) =>
                {
                    let seq = self.index.get(d.key.as_str()).map(|l| l.seq);
                    d.response = seq.and_then(|s| w.response(store, s));
                    Some(Reply::Decision(tx, Decision::Duplicate(d)))
                }
                r => r,
            }
        })
    }

    /// The decision for a reserve, from the index alone; writes the entry on Proceed, and
    /// the guard of a signed request turned away (`turned_away`). Sets `durable` when it
    /// wrote anything: the answer waits for the sync.
    fn reserve(
        &mut self,
        req: &Reserve,
        asked: u64,
        w: &mut Batch,
        now: (u64, u64),
        durable: &mut bool,
    ) -> Result<Decision, WriteError> {
        if self.halted {
            return Ok(Decision::Halted);
        }
        // The key itself, live: a duplicate however old. For a fingerprint that is the same
        // trade in the same minute by the gateway's wall clock (SPEC §2), also when a clock
        // stepped back a minute or more names that minute again: refusing a trade is the
        // safe side, and the minute's bucket is read before the reserve is asked, so an age
        // cannot tell a retry from a new trade here (docs/DESIGN.md).
        if let Some(live) = self.live(&req.key, now) {
            // A mismatch takes no guard: its trade was refused, never taken, and the
            // request may run once the key is free (as the first delivery of its trade).
            if live.payload_hash != req.payload_hash {
                return Ok(Decision::Mismatch);
            }
            let holder = (req.key.clone(), live.seq, live.state);
            let d = Decision::Duplicate(duplicate(&req.key, live, now));
            return self.turned_away(req, d, holder, w, now, durable);
        }
        // A fingerprint reserved less than a minute ago is a duplicate whatever its bucket
        // (SPEC §2): a retry that crosses a minute boundary; a copy that read the clock
        // before a boundary but reached the owner after one that read it after; or one
        // whose minute a wall clock stepped between the two moved further. Only the
        // family's latest key can be that young: a later one is granted only once the one
        // before it is a minute old. "Ago" is from when the caller asked, not when the
        // owner got to it: a retry 59 s after its trade, behind a slow sync, is still one.
        // One still pending, however old, holds its family while it lives (SPEC §4: an
        // outcome unknown is held until the TTL): its order may have filled (a 504, a
        // crash) or still be out, and the retry its sender sends minutes later, after the
        // 504, was placed beside it. Nor is a later key granted while it is pending, so the
        // latest is the one to look at here too.
        if let Some(latest) = key::family(req.key.as_str()).and_then(|f| self.latest.get(f))
            && let Some(live) = self.index.get(&latest.0)
            && live.live(now)
            && (live.state == State::Pending || live.age_at_least_ms(asked.min(now.1)) < BUCKET_MS)
        {
            // Every key in the index parses: `Key::from_stored` at load, a `Key` since.
            // Were one not to, the answer names the request's own key, still a duplicate.
            let key = Key::from_stored(&latest.0).unwrap_or_else(|_| req.key.clone());
            let holder = (key.clone(), live.seq, live.state);
            let d = Decision::Duplicate(duplicate(&key, live, now));
            return self.turned_away(req, d, holder, w, now, durable);
        }
        // After the trade's own key: a resend inside the minute gets the trade's answer.
        if let Some(g) = &req.guard
            && let Some(live) = self.live(&g.key, now)
        {
            let mut d = duplicate(&g.key, live, now);
            d.follows = self.leader_of(live.seq);
            return Ok(Decision::Duplicate(d));
        }
        // Both keys are free by now: one still in the index is expired, and is replaced in
        // place, so only those not in it take a new one. A trade that takes any place needs
        // as many free as a signed one takes, signed or not: so full (`at_capacity`, what
        // `/readyz`, `status` and the gauges say) is exactly when new trades are refused.
        let new = [Some(&req.key), req.guard.as_ref().map(|g| &g.key)]
            .into_iter()
            .flatten()
            .filter(|k| !self.index.contains_key(k.as_str()))
            .count();
        if new > 0 && full(self.index.len(), self.config.capacity) {
            return Ok(Decision::Unavailable(Unavailable::Capacity));
        }
        *durable = true;
        let seq = self.put_new(&req.key, req.ttl, req.payload_hash, w, now)?;
        let guard = match &req.guard {
            Some(g) => Some(Box::new(Grant {
                seq: self.put_new(&g.key, g.ttl, [0; 32], w, now)?,
                key: g.key.clone(),
                guard: None,
            })),
            None => None,
        };
        Ok(Decision::Proceed(Grant {
            key: req.key.clone(),
            seq,
            guard,
        }))
    }

    /// A signed request turned away as a live trade's duplicate (`d`) still reserves its
    /// signature's guard. Its sender was told the trade is taken (409). Without the guard,
    /// that same signed request replayed inside its signature's window, once the trade's
    /// key had moved on (a fingerprint a minute old, a client key past its TTL), would be
    /// a new trade and be sent.
    ///
    /// Behind a pending trade (`holder`: its key, its entry's number and state) the guard
    /// follows it: committed with it, released with it, since a trade that failed is the
    /// sender's to retry, this request included. Behind a committed trade the request will never
    /// run: its guard is committed at once. Either way it is written with the batch and
    /// synced before the answer, as a trade's own entry is. A resend of the same signed
    /// request finds its guard and writes nothing.
    fn turned_away(
        &mut self,
        req: &Reserve,
        mut d: Decision,
        (holder_key, holder, state): (Key, u64, State),
        w: &mut Batch,
        now: (u64, u64),
        durable: &mut bool,
    ) -> Result<Decision, WriteError> {
        let Some(g) = &req.guard else {
            return Ok(d);
        };
        // Found (a resend of this very request), or not to be written now.
        if self.live(&g.key, now).is_some() || !g.when_turned_away {
            return Ok(d);
        }
        // The guard needs a place. Without one the 409 still goes out, unguarded: a 503
        // would invite the sender to retry this very request until it ran.
        if !self.index.contains_key(g.key.as_str()) && self.index.len() >= self.config.capacity {
            return Ok(d);
        }
        *durable = true;
        let guard = Grant {
            seq: self.put_new(&g.key, g.ttl, [0; 32], w, now)?,
            key: g.key.clone(),
            guard: None,
        };
        if state == State::Pending {
            self.followers
                .entry(holder)
                .or_insert_with(|| (holder_key, Vec::new()))
                .1
                .push(guard);
        } else {
            self.commit(&guard, None, w, now)?;
        }
        if let Decision::Duplicate(dup) = &mut d {
            dup.guarded = true;
        }
        Ok(d)
    }

    /// Writes a new pending entry for `key`, replacing an expired one not yet reaped, and
    /// tracks it. Returns its sequence number.
    fn put_new(
        &mut self,
        key: &Key,
        ttl: Duration,
        payload_hash: PayloadHash,
        w: &mut Batch,
        (now_wall, now_mono): (u64, u64),
    ) -> Result<u64, WriteError> {
        if let Some(old) = self.index.get(key.as_str()) {
            w.delete(old.seq)?;
            self.replaced += 1;
        }
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let due = now_mono.saturating_add(ttl_ms);
        let entry = Entry {
            key: key.as_str().to_string(),
            state: State::Pending,
            stored_at: now_wall,
            expires_at: now_wall.saturating_add(ttl_ms),
            payload_hash,
            response: None,
            boot_due: self.boot.map(|boot| BootTime { boot, ms: due }),
        };
        let seq = self.next_seq;
        let next = seq.checked_add(1).ok_or(WriteError::SeqExhausted)?;
        w.put(seq, &entry)?;
        self.next_seq = next;
        self.track(
            seq,
            Rc::from(key.as_str()),
            &entry,
            (now_wall, now_mono),
            Some(due),
            Some(due),
        );
        Ok(seq)
    }

    /// Marks the entry `grant` made committed, if the key still holds it live. Returns
    /// whether it did.
    fn commit(
        &mut self,
        grant: &Grant,
        response: Option<Snapshot>,
        w: &mut Batch,
        now: (u64, u64),
    ) -> Result<bool, WriteError> {
        let boot = self.boot;
        let Some(live) = self
            .live_mut(&grant.key, now)
            .filter(|l| l.seq == grant.seq)
        else {
            return Ok(false);
        };
        live.state = State::Committed;
        live.has_response = response.is_some();
        let entry = Entry {
            key: grant.key.as_str().to_string(),
            state: State::Committed,
            stored_at: live.stored_at,
            expires_at: live.expires_at,
            payload_hash: live.payload_hash,
            response,
            boot_due: boot.map(|boot| BootTime {
                boot,
                ms: live.due_mono,
            }),
        };
        w.put(grant.seq, &entry)?;
        Ok(true)
    }

    /// Frees the keys of grants whose callers had given up (see `Reply::send`), as the
    /// gateway would have released them had it been waiting: a retry may run. Like any
    /// release it rides in the next record; a crash before that leaves the key held until
    /// its TTL, which is safe.
    fn release_abandoned(&mut self, now: (u64, u64)) {
        if self.abandoned.is_empty() {
            return;
        }
        let mut w = std::mem::take(&mut self.carry);
        for grant in std::mem::take(&mut self.abandoned) {
            let key = grant.key.as_str();
            // Only that grant's own entry: later in the same turn an operator may have
            // released the key, and another caller reserved it again.
            match self.release(&grant, &mut w, now) {
                // As in `apply`: its guard's release may be in the carry.
                Ok(false) => self.released.push(grant),
                Ok(true) => {
                    inc(&self.shared.stats.releases);
                    log::warn!(key = key; "mutex: reserve granted after its caller gave up; released");
                    self.released.push(grant);
                }
                Err(e) => {
                    log::warn!(key = key; "mutex: cannot release an unanswered grant ({e}); it stays held until its TTL")
                }
            }
        }
        self.carry = w;
        self.publish_index();
    }

    /// Deletes the entry `grant` made, live or not, if the key still holds it, and its
    /// guard's likewise. Returns whether the trade's own entry was deleted.
    fn release(
        &mut self,
        grant: &Grant,
        w: &mut Batch,
        now: (u64, u64),
    ) -> Result<bool, WriteError> {
        if let Some(g) = &grant.guard {
            self.release(g, w, now)?;
        }
        // Each is its own release, carried like its trade's: a failed write hands it to
        // `void`, to be made again at the reopen (`fail`), as the trade's grant is.
        for f in self.take_followers(grant.seq) {
            if self.release(&f, w, now)? {
                self.released.push(f);
            }
        }
        if self
            .index
            .get(grant.key.as_str())
            .is_none_or(|l| l.seq != grant.seq)
        {
            return Ok(false);
        }
        self.remove(&grant.key, w, now).map(|_| true)
    }

    /// Deletes a key's entry, live or not. Returns whether it was live.
    fn remove(&mut self, key: &Key, w: &mut Batch, now: (u64, u64)) -> Result<bool, WriteError> {
        match self.unindex(key.as_str()) {
            Some(live) => {
                w.delete(live.seq)?;
                Ok(live.live(now))
            }
            None => Ok(false),
        }
    }

    /// Commands that only read: answered from the index.
    fn read_only(&mut self, cmd: Command, now: (u64, u64)) -> Option<Reply> {
        match cmd {
            Command::Get(key, tx) => {
                let info = self.live(&key, now).map(|l| {
                    let follows = key.is_guard().then(|| self.leader_of(l.seq)).flatten();
                    info(&key, l, now, self.load, follows)
                });
                Some(Reply::Entry(tx, info))
            }
            Command::List(limit, tx) => {
                let mut all: Vec<(&Rc<str>, &Live)> =
                    self.index.iter().filter(|(_, l)| l.live(now)).collect();
                // Every webhook waits while the owner lists: with a million keys a full
                // sort took ~0.5 s here, the first `limit` found and sorted alone ~0.08 s.
                let order = |a: &(&Rc<str>, &Live), b: &(&Rc<str>, &Live)| {
                    (a.1.expires_at, a.0).cmp(&(b.1.expires_at, b.0))
                };
                if limit < all.len() {
                    all.select_nth_unstable_by(limit, order);
                    all.truncate(limit);
                }
                all.sort_unstable_by(order);
                // Each follower's trade, by the follower's entry: one pass, not one a key.
                let leaders: HashMap<u64, (&Key, u64)> = self
                    .followers
                    .iter()
                    .flat_map(|(seq, (key, guards))| {
                        guards.iter().map(move |g| (g.seq, (key, *seq)))
                    })
                    .collect();
                let list = all
                    .into_iter()
                    .take(limit)
                    // Keys in the index were built from a `Key` or checked by
                    // `Key::from_stored` at load, so this never drops one.
                    .filter_map(|(k, l)| {
                        let follows = leaders.get(&l.seq).map(|&(k, s)| (k.clone(), s));
                        Key::from_stored(k)
                            .ok()
                            .map(|k| info(&k, l, now, self.load, follows))
                    })
                    .collect();
                Some(Reply::List(tx, list))
            }
            // Counted at the open, before READY=1, where every entry is visited anyway:
            // here, a million keys held every webhook on this thread for ~0.2 s.
            Command::Clients(tx) => Some(Reply::Clients(tx, self.clients.clone())),
            Command::Ping(tx) => Some(Reply::Status(tx, self.status())),
            Command::Stall(d, taken) => {
                self.stall(d, taken);
                None
            }
            Command::Shutdown | Command::Wake => None,
            // Writes never reach here: `turn` routes them to `write_batch`.
            cmd => {
                self.refuse(cmd, &Unavailable::Stopped);
                None
            }
        }
    }

    /// The test hook: sleeps as a stalled disk would, once the caller knows it has begun.
    fn stall(&self, d: Duration, taken: oneshot::Sender<()>) {
        let _ = taken.send(());
        if self.stall_hook {
            std::thread::sleep(d);
        }
    }

    /// Answers a command while failing closed.
    fn refuse(&mut self, cmd: Command, u: &Unavailable) {
        let _ = match cmd {
            Command::Reserve(_, tx, _) => tx.send(Decision::Unavailable(u.clone())).map_err(drop),
            // Not answered: the handle said so when it queued them (`Mutex::send`). A
            // release queued before the failure was published was taken as made: it is
            // made at the reopen instead, like those a failed write dropped.
            Command::Commit(..) => Ok(()),
            Command::Release(grant) => {
                self.void.push(*grant);
                Ok(())
            }
            Command::SetHalted(_, tx) => tx.send(Err(u.clone())).map_err(drop),
            Command::Get(_, tx) => tx.send(Err(u.clone())).map_err(drop),
            Command::List(_, tx) => tx.send(Err(u.clone())).map_err(drop),
            Command::Clients(tx) => tx.send(Err(u.clone())).map_err(drop),
            Command::ForceRelease(_, _, tx) => tx.send(Err(u.clone())).map_err(drop),
            Command::Ping(tx) => {
                let mut s = self.status();
                s.fail_closed = Some(u.clone());
                tx.send(s).map_err(drop)
            }
            Command::Stall(d, taken) => {
                self.stall(d, taken);
                Ok(())
            }
            Command::Shutdown | Command::Wake => Ok(()),
        };
    }

    /// Alarms that are due, checked against the index: only an entry still holding the
    /// expiry its alarm was set for, and expired by both clocks (`Live::live`), is deleted.
    fn due_expiries(&mut self, now_wall: u64, now_mono: u64) -> Vec<Rc<str>> {
        let mut fired = Vec::new();
        self.wheel
            .poll(now_mono, self.config.batch_limit.max(1), &mut fired);
        let mut expired = Vec::new();
        for (key, at) in fired {
            match self.index.get(&key) {
                // Both clocks, not the alarm's own time: a stale alarm whose key was taken
                // again with the same wall clock expiry (released, then reserved after a
                // step back) must not delete the newer entry early.
                Some(l) if l.expires_at == at && !l.live((now_wall, now_mono)) => expired.push(key),
                // A clock says it lives: the wall clock is behind (stepped back), or the
                // alarm is a stale one. Wait for both.
                Some(l) if l.expires_at == at => {
                    let wall_due = match l.wall_holds((now_wall, now_mono)) {
                        true => now_mono + (at - now_wall).min(l.hold - now_mono).min(BUCKET_MS),
                        false => now_mono,
                    };
                    self.wheel.insert(wall_due.max(l.due_mono), (key, at));
                }
                _ => {}
            }
        }
        expired
    }

    /// An alarm is not taken out when its key goes early (a release, an operator's, an
    /// expired key replaced): it is dropped when it comes due and finds the key gone. Until
    /// then a stream of reserves released at once (rate-limited, failed, unreachable)
    /// would leave one per release for a whole TTL, up to 24 h of them: memory bounded by
    /// the reserve rate, not by `capacity`. So once they exceed twice the indexed keys
    /// (a key can have two alarms) plus `STALE_ALARMS` they are swept: one pass over the
    /// wheel, a step of it per turn. A turn adds at most two alarms a command (a signed
    /// reserve holds two keys), and its step looks at four a command or more: each step
    /// takes the pass on by at least half its size, so a pass ends before the wheel has
    /// doubled.
    fn sweep_stale_alarms(&mut self, commands: usize) {
        if !self.wheel.sweeping() && self.wheel.len() <= 2 * self.index.len() + STALE_ALARMS {
            return;
        }
        let index = &self.index;
        let step = SWEEP_STEP.max(4 * commands);
        self.wheel.sweep(step, |(key, at)| {
            index.get(key).is_some_and(|l| l.expires_at == *at)
        });
    }

    /// Takes a key out of the index, and out of `latest` if it is its family's.
    fn unindex(&mut self, key: &str) -> Option<Live> {
        let live = self.index.remove(key)?;
        if let Some(family) = key::family(key)
            && self.latest.get(family).is_some_and(|l| *l.0 == *key)
        {
            self.latest.remove(family);
        }
        Some(live)
    }

    fn live(&self, key: &Key, now: (u64, u64)) -> Option<&Live> {
        self.index.get(key.as_str()).filter(|l| l.live(now))
    }

    fn live_mut(&mut self, key: &Key, now: (u64, u64)) -> Option<&mut Live> {
        self.index.get_mut(key.as_str()).filter(|l| l.live(now))
    }

    /// Indexes an entry, due on the monotonic clock at `due`, or when the wall clock says
    /// if that is not known (an entry of another boot, or of an unknown one). The wall
    /// clock may hold it after that until `hold`, or for its TTL from now if that is not
    /// known (`Live::live`).
    fn track(
        &mut self,
        seq: u64,
        key: Rc<str>,
        e: &Entry,
        (now_wall, now_mono): (u64, u64),
        due: Option<u64>,
        hold: Option<u64>,
    ) {
        // Saturating: `expires_at` may come from the disk. Never more than the TTL from now,
        // which no key has left: not a wall clock that is behind after a reboot, a damaged
        // deadline, nor one of another boot whose id shares our 32 bits. The wall clock's
        // expiry still holds the key as long as it says (`Live::live`).
        let ttl = e.expires_at.saturating_sub(e.stored_at);
        let due = due
            .unwrap_or_else(|| now_mono.saturating_add(e.expires_at.saturating_sub(now_wall)))
            .min(now_mono.saturating_add(ttl));
        let hold = hold
            .unwrap_or(now_mono.saturating_add(ttl))
            .min(now_mono.saturating_add(ttl));
        self.wheel.insert(due, (key.clone(), e.expires_at));
        if key::family(&key).is_some() {
            // Tracked in the order reserved (the table's order at load): the latest.
            self.latest.replace(Latest(key.clone()));
        }
        self.index.insert(
            key,
            Live {
                seq,
                state: e.state,
                stored_at: e.stored_at,
                expires_at: e.expires_at,
                payload_hash: e.payload_hash,
                has_response: e.response.is_some(),
                due_mono: due,
                hold,
            },
        );
    }

    fn status(&self) -> Status {
        Status {
            live_keys: self.live_keys(),
            halted: self.halted,
            fail_closed: self.failure.clone(),
            at_capacity: self.at_capacity(),
        }
    }

    /// Whether new trades are refused for the index being full: fewer places are left than
    /// a signed trade takes (its key and its signature's guard), the rule `reserve` applies
    /// to every new trade. Failing closed, every trade is refused for that, and said so.
    /// Halted, it is still said: hidden behind the kill switch (`status` exit 0, the
    /// `at_capacity` gauge 0), a full gateway was found full only at `resume`.
    fn at_capacity(&self) -> bool {
        self.failure.is_none() && full(self.index.len(), self.config.capacity)
    }

    /// A file of the database removed or replaced while open (`Store::files_in_place`)
    /// fails closed here, at the first turn `FILES_CHECK` (0.9 s) or more after the last look, before
    /// that turn is written to a file no restart would find. The reopen then reads what is
    /// there, and refuses a file that is missing as at any open.
    fn check_files(&mut self) {
        self.files_checked = Instant::now();
        if let Some(Err(e)) = self.store.as_ref().map(Store::files_in_place) {
            log::error!("mutex: {e}; failing closed until reopened");
            self.fail(Unavailable::NotOpen(e));
        }
    }

    /// Opens the database and rebuilds the index and wheel from it; on failure, schedules
    /// the next attempt.
    fn reopen(&mut self) {
        if self.backoff > Duration::ZERO {
            inc(&self.shared.stats.reopen_attempts);
        }
        let now_wall = self.clock.wall_ms();
        let now_mono = self.clock.mono_ms();
        self.boot = self.clock.boot();
        let now_boot = self.boot.map(|boot| BootTime { boot, ms: now_mono });
        // An entry the monotonic clock still holds is kept, whatever the wall clock says.
        let held = |seq: u64| self.dues.get(&seq).is_some_and(|d| d.mono > now_mono);
        let (path, bytes) = (&self.config.path, self.config.journal_bytes);
        // Only a start that finds neither file makes a database. One that found either
        // (failing closed on the other's absence, say) once made a new, empty one when the
        // operator moved the first aside too, to copy or restore the pair: it served,
        // retries of held trades included, until the files were back.
        self.found = self.found || store::found_a_file(path);
        let create = if self.opened {
            store::Create::No("it was open")
        } else if self.found {
            store::Create::No("the gateway found it or its journal here since it started")
        } else {
            store::Create::Yes
        };
        match store::open(path, bytes, create, now_wall, now_boot, held) {
            Ok((store, loaded)) => {
                let first = !self.opened;
                self.opened = true;
                // Without randomness, still another number in this process.
                self.load =
                    getrandom::u32().unwrap_or((now_wall as u32) ^ self.load.wrapping_add(1));
                self.index.clear();
                self.latest.clear();
                self.wheel = Wheel::new(now_mono);
                if self.boot.is_none() && first {
                    log::warn!(
                        "mutex: this boot's id is not readable (/proc/sys/kernel/random/boot_id): \
                         across a restart, keys expire by the wall clock alone"
                    );
                }
                let mut skipped = 0;
                let boot_open = loaded.boot_open;
                for (seq, e) in loaded.live {
                    // Only keys this version could have written are trusted.
                    if Key::from_stored(&e.key).is_err() {
                        skipped += 1;
                        continue;
                    }
                    // The later of the deadline kept through a failure and the entry's own
                    // on this boot's clock, if either is known.
                    let kept = self.dues.get(&seq);
                    let on_boot = store::due_in_boot(&e, self.boot, boot_open);
                    let due = kept.map(|d| d.mono).filter(|&m| m > now_mono).max(on_boot);
                    // The wall clock holds it no longer than its exact deadline (its own,
                    // of this boot), or than what was kept; else its TTL from now.
                    let exact = e.boot_due.and_then(|d| d.ms_in(self.boot));
                    let hold = exact.max(kept.map(|d| d.hold));
                    let now = (now_wall, now_mono);
                    self.track(seq, Rc::from(e.key.as_str()), &e, now, due, hold);
                }
                self.dues.clear();
                // Never backwards: a grant from before the failure may still be settled,
                // and must not match a newer entry that reused its number (the table's
                // numbers restart after its highest, which may have been released).
                self.next_seq = self.next_seq.max(loaded.next_seq);
                if skipped > 0 {
                    log::warn!("mutex: ignored {skipped} stored keys of an unknown shape");
                }
                if loaded.replayed > 0 {
                    log::info!("mutex: replayed {} journal records", loaded.replayed);
                }
                // Skipped as a crash leaves one; said, for damage looks the same.
                if let Some(lsn) = loaded.torn {
                    log::warn!(
                        "mutex: journal record {lsn} fails its checksum and was skipped: a \
                         write cut off by a crash or a power cut (nothing it held was \
                         answered as durable), or damage to the disk (the keys it reserved \
                         are forgotten, and their retries will be sent)"
                    );
                }
                self.shared
                    .stats
                    .expired
                    .fetch_add(loaded.purged, Ordering::Relaxed);
                // Only a reopen has a write to compare with: before the first open,
                // `halted_written` is no reading of the disk.
                if !first && loaded.halted != self.halted_written {
                    log::warn!(
                        "mutex: the kill switch reads {} after the reopen: the change the \
                         failed write was said to lose reached the disk",
                        if loaded.halted { "set" } else { "lifted" },
                    );
                }
                self.halted = loaded.halted;
                self.halted_written = loaded.halted;
                let mut store = store;
                // Read before `free_void`, whose write resets the backoff.
                let reopened = self.backoff > Duration::ZERO;
                if let Err(e) = self.free_void(&mut store, (now_wall, now_mono)) {
                    log::error!(
                        "mutex: cannot free the keys of a failed write: {e}; failing closed"
                    );
                    self.fail(Unavailable::CommitFailed(e.to_string()));
                    return;
                }
                if reopened {
                    log::info!("mutex: database reopened, {} live keys", self.index.len());
                }
                self.clients = clients_of(&self.index);
                self.store = Some(store);
                // Against the index rebuilt from the disk: a guard a failed write lost is
                // gone from it.
                self.prune_followers();
                self.failure = None;
                // The backoff is reset by the first record written (`Owner::wrote`), not
                // here.
            }
            Err(e) => {
                log::error!(
                    "mutex: cannot open {}: {e}; failing closed",
                    self.config.path.display()
                );
                self.fail(Unavailable::NotOpen(e.to_string()));
            }
        }
        self.publish();
    }

    /// Frees, on reopen, the entries of the grants in `void` that the disk kept: one synced
    /// record, before anything else is served. Kept for the next reopen if it cannot be
    /// written.
    fn free_void(&mut self, store: &mut Store, now: (u64, u64)) -> Result<(), WriteError> {
        if self.void.is_empty() {
            return Ok(());
        }
        let void = std::mem::take(&mut self.void);
        let mut w = Batch::default();
        let mut freed = 0;
        let mut result = Ok(());
        for g in &void {
            match self.release(g, &mut w, now) {
                Ok(true) => freed += 1,
                Ok(false) => {}
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if result.is_ok() {
            result = self.write_record(store, w, true, &mut Vec::new());
        }
        if result.is_err() {
            self.void = void;
        } else if freed > 0 {
            // Not counted in `stats.releases` again: each was counted when it was asked
            // for, or its reserve was refused.
            log::warn!("mutex: freed {freed} key(s) a failed write had left held");
        }
        result
    }

    /// Enters the fail-closed state and schedules a reopen.
    fn fail(&mut self, u: Unavailable) {
        // Whatever was not yet written is lost with `carry`: settle it again at the reopen.
        self.void.append(&mut self.abandoned);
        self.void.append(&mut self.released);
        // The index goes, and with it each key's monotonic deadline: keep those for the
        // reopen (added to any from an earlier failure the reopen has not yet consumed).
        let now = (self.clock.wall_ms(), self.clock.mono_ms());
        self.dues.retain(|_, d| d.live(now));
        self.dues
            .extend(self.index.values().filter(|l| l.live(now)).map(|l| {
                let due = Due {
                    mono: l.due_mono,
                    wall: l.expires_at,
                    hold: l.hold,
                };
                (l.seq, due)
            }));
        // A kill switch applied in the batch that failed may or may not be on the disk (a
        // sync that failed after its write): until the reopen reads it, the switch is
        // published as on if either may be (trades are refused meanwhile anyway).
        self.halted = self.halted || self.halted_written;
        self.store = None;
        self.carry = Batch::default();
        self.index.clear();
        self.latest.clear();
        self.wheel = Wheel::new(self.clock.mono_ms());
        self.failure = Some(u);
        self.backoff = (self.backoff * 2)
            .max(BACKOFF_START)
            .min(self.config.reopen_backoff_max.max(BACKOFF_START));
        self.retry_at = Instant::now() + self.backoff;
        self.publish();
    }

    fn publish(&self) {
        self.publish_index();
        self.shared
            .serving
            .store(self.store.is_some(), Ordering::Relaxed);
        self.shared
            .failing
            .store(self.store.is_none(), Ordering::Relaxed);
    }

    /// What handles read without a round trip; published before a batch's replies, so a
    /// caller that was answered sees its own write.
    fn publish_index(&self) {
        self.shared.halted.store(self.halted, Ordering::Relaxed);
        self.shared
            .live_keys
            .store(self.live_keys(), Ordering::Relaxed);
        let full = self.at_capacity();
        self.shared.at_capacity.store(full, Ordering::Relaxed);
        // Only while full: the scan for the next bucket is not for every turn.
        let next_free = if full { self.wheel.next_due_ms() } else { None };
        self.shared
            .next_free_mono_ms
            .store(next_free.unwrap_or(0), Ordering::Relaxed);
    }

    /// The keys held: the index's, or while failing closed, whose index is gone with the
    /// database, those it held when it failed that a clock still holds (`dues`). Read
    /// as none, a gateway failing closed would invite the removal of its state files,
    /// which README allows only once no key is live. (A database never opened in this
    /// process is not counted: 0, beside `fail_closed`.)
    fn live_keys(&self) -> usize {
        match self.failure {
            Some(_) => {
                let now = (self.clock.wall_ms(), self.clock.mono_ms());
                // A voided grant's key is not held: its trade was refused (the batch that
                // granted it failed) or released, and the reopen frees its entry if the
                // disk kept it. Counted, a reserve answered 503 read as a key held.
                let void: HashSet<u64> = self
                    .void
                    .iter()
                    .flat_map(|g| std::iter::once(g.seq).chain(g.guard.as_ref().map(|g| g.seq)))
                    .collect();
                let held = |(seq, due): &(&u64, &Due)| due.live(now) && !void.contains(*seq);
                self.dues.iter().filter(held).count()
            }
            None => self.index.len(),
        }
    }

    /// Hands everything kept since the last checkpoint, and what is carried, to redb.
    fn checkpoint(&mut self) {
        let t = Instant::now();
        let done = self.maintain("checkpoint", |o, store| {
            store::apply(store, &mut o.carry, true)?;
            o.released.clear();
            Ok(())
        });
        self.prune_followers();
        if done {
            self.shared
                .stats
                .checkpoint_seconds
                .observe(t.elapsed().as_secs_f64());
        }
    }

    /// The guards that follow the trade granted `seq`, to be settled with it: its commit
    /// and its release alike take them out.
    fn take_followers(&mut self, seq: u64) -> Vec<Grant> {
        self.followers
            .remove(&seq)
            .map(|(_, guards)| guards)
            .unwrap_or_default()
    }

    /// The trade (its key and entry) whose guard-follower is the entry `seq`: the order a
    /// signed retry's guard waits on is that trade's, not one of its own. A scan of the
    /// followers, asked only of guards.
    fn leader_of(&self, seq: u64) -> Option<(Key, u64)> {
        self.followers.iter().find_map(|(leader, (key, guards))| {
            guards
                .iter()
                .any(|g| g.seq == seq)
                .then(|| (key.clone(), *leader))
        })
    }

    /// Forgets the followers whose guards are gone from the index (expired, released by an
    /// operator, or lost with a failed write), so that a grant that never settles, and the
    /// retries it turns away meanwhile, hold no more memory than their live guards.
    fn prune_followers(&mut self) {
        // While failing closed the index is empty, not the disk: the guards are still
        // there, and their trades' grants may yet settle them.
        if self.store.is_none() {
            return;
        }
        let index = &self.index;
        self.followers.retain(|_, (_, guards)| {
            guards.retain(|g| index.get(g.key.as_str()).is_some_and(|l| l.seq == g.seq));
            !guards.is_empty()
        });
    }

    /// A write outside any batch (a checkpoint, an idle journal write): fails closed if
    /// it fails, like a batch. Whether it was written.
    fn maintain(
        &mut self,
        what: &str,
        write: impl FnOnce(&mut Self, &mut Store) -> Result<(), WriteError>,
    ) -> bool {
        let Some(mut store) = self.store.take() else {
            return false;
        };
        match write(self, &mut store) {
            Ok(()) => {
                self.store = Some(store);
                true
            }
            Err(e) => {
                log::error!("mutex: {what} failed, failing closed until reopened: {e}");
                drop(store);
                self.fail(Unavailable::CommitFailed(e.to_string()));
                false
            }
        }
    }

    /// A last checkpoint, so the next start has no journal to replay, and a clean close.
    fn close(&mut self) -> Closed {
        let Some(mut store) = self.store.take() else {
            // Open once in this run and failing closed now: its journal may hold records
            // the database does not, as after a failed final checkpoint.
            return match (&self.failure, self.opened) {
                (Some(why), true) => Closed::Failed(format!("failing closed: {why}")),
                _ => Closed::NotOpen,
            };
        };
        let mut failed = Vec::new();
        if let Err(e) = store::apply(&mut store, &mut self.carry, true) {
            log::error!("mutex: final checkpoint failed: {e}");
            failed.push(format!("final checkpoint: {e}"));
        }
        if let Err(e) = store.db.close() {
            log::error!("mutex: close failed: {e}");
            failed.push(format!("close: {e}"));
        }
        self.shared.serving.store(false, Ordering::Relaxed);
        self.shared.failing.store(true, Ordering::Relaxed);
        match failed.is_empty() {
            true => Closed::Clean,
            false => Closed::Failed(failed.join("; ")),
        }
    }
}

/// What a batch holds, from one pass over it.
#[derive(Default)]
struct Holds {
    /// A Shutdown.
    stop: bool,
    /// A `Get`, `List` or `Ping`.
    reads: bool,
    /// A command that changes the state.
    writes: bool,
}

impl Holds {
    fn of(batch: &[Command]) -> Holds {
        let mut h = Holds::default();
        for cmd in batch {
            match cmd {
                Command::Reserve(..) | Command::ForceRelease(..) | Command::SetHalted(..) => {
                    h.writes = true;
                }
                Command::Commit(..) | Command::Release(..) => h.writes = true,
                Command::Get(..) | Command::List(..) | Command::Clients(..) | Command::Ping(..) => {
                    h.reads = true
                }
                Command::Stall(..) | Command::Wake => {}
                Command::Shutdown => h.stop = true,
            }
        }
        h
    }
}

/// How many client keys each client identity holds, in the identities' order
/// (`Command::Clients`): `client:{identity}:{mode}:{key}`, and no identity holds a `:`.
fn clients_of(index: &HashMap<Rc<str>, Live>) -> Vec<(String, usize)> {
    let mut held = std::collections::BTreeMap::<&str, usize>::new();
    for k in index.keys() {
        if let Some(id) = k.strip_prefix("client:").and_then(|r| r.split(':').next()) {
            *held.entry(id).or_default() += 1;
        }
    }
    held.into_iter().map(|(id, n)| (id.to_owned(), n)).collect()
}

fn duplicate(key: &Key, l: &Live, now: (u64, u64)) -> Duplicate {
    Duplicate {
        key: key.clone(),
        state: l.state,
        age_ms: l.age_ms(now.1),
        expires_in_ms: l.expires_in_ms(now),
        response: None,
        seq: l.seq,
        follows: None,
        guarded: false,
    }
}

/// A commit or release (`what`) found its grant's entry gone: expired, or released by an
/// operator (and perhaps reserved again, by a newer trade it must not touch). Nothing is
/// written: the key is free already, or another trade's.
fn entry_gone(what: &str, grant: &Grant) {
    log::warn!(key = grant.key.as_str(); "mutex: {what} found its entry gone (released by an operator, or expired); nothing done");
}

fn info(key: &Key, l: &Live, now: (u64, u64), load: u32, follows: Option<(Key, u64)>) -> EntryInfo {
    EntryInfo {
        follows,
        load,
        key: key.clone(),
        state: l.state,
        stored_at: l.stored_at,
        expires_at: l.expires_at,
        age_ms: l.age_ms(now.1),
        expires_in_ms: l.expires_in_ms(now),
        has_response: l.has_response,
        seq: l.seq,
    }
}

#[cfg(test)]
mod tests {
    use super::super::Seen;
    use super::*;

    /// A reserve asked as the owner takes it (`Command::Reserve`'s time).
    const NOW: u64 = u64::MAX;

    /// An owner driven turn by turn on this thread, on a fresh database.
    fn owner(dir: &std::path::Path) -> Owner {
        owner_with_clock(dir).0
    }

    /// As [`owner`], with the handle that moves its clock.
    fn owner_with_clock(dir: &std::path::Path) -> (Owner, Arc<super::super::clock::ManualClock>) {
        owner_in_boot(dir, true)
    }

    /// As [`owner_with_clock`], in a boot that is known or not (`Clock::boot`).
    fn owner_in_boot(
        dir: &std::path::Path,
        known: bool,
    ) -> (Owner, Arc<super::super::clock::ManualClock>) {
        owner_at(dir, known, |_| {})
    }

    /// As [`owner_in_boot`], its clock set by `set` before the open.
    fn owner_at(
        dir: &std::path::Path,
        known: bool,
        set: impl FnOnce(&super::super::clock::ManualClock),
    ) -> (Owner, Arc<super::super::clock::ManualClock>) {
        let config = Config {
            path: dir.join("m.redb"),
            journal_bytes: 64 * 1024,
            ..Config::default()
        };
        let (clock, time) = Clock::manual(1_800_000_000_000);
        if !known {
            time.forget_boot();
        }
        set(&time);
        let mut o = Owner::new(config, clock, Arc::default(), false);
        o.reopen();
        assert!(o.store.is_some(), "{:?}", o.failure);
        (o, time)
    }

    /// Runs one command in a turn of its own and returns its answer.
    fn ask<T>(o: &mut Owner, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> T {
        let (tx, mut rx) = oneshot::channel();
        o.turn(&mut vec![make(tx)]);
        rx.try_recv().expect("answered within the turn")
    }

    fn trade_key(symbol: &str) -> Key {
        Key::from_stored(&format!("trade:x:{symbol}:LONG:1:live:1")).unwrap()
    }

    /// A plain reserve of `key`: no guard.
    fn request(key: &Key) -> Box<Reserve> {
        Box::new(Reserve {
            key: key.clone(),
            ttl: Duration::from_secs(300),
            payload_hash: [1; 32],
            guard: None,
        })
    }

    /// A sender whose caller has already given up.
    fn abandoned<T>() -> oneshot::Sender<T> {
        oneshot::channel().0
    }

    /// Runs `batch` in one turn, whose callers in `gone` give up after the owner applied
    /// their commands and before it answers them: a stall at the end of the batch holds
    /// the owner for 500 ms while another thread drops their receivers.
    fn turn_giving_up<T: Send + 'static>(
        o: &mut Owner,
        mut batch: Vec<Command>,
        gone: Vec<oneshot::Receiver<T>>,
    ) {
        let (taken, stalled) = oneshot::channel();
        let dropper = std::thread::spawn(move || {
            let _ = stalled.blocking_recv();
            drop(gone);
        });
        o.stall_hook = true;
        batch.push(Command::Stall(Duration::from_millis(500), taken));
        o.turn(&mut batch);
        o.stall_hook = false;
        dropper.join().unwrap();
    }

    /// A reserve whose caller gave up while it was queued is not made, so the retry in
    /// the same batch, which the caller's 503 invited, runs: nobody sent the first.
    #[test]
    fn a_reserve_given_up_in_the_queue_leaves_the_key_to_its_retry() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let k = trade_key("BTC");
        let (tx, mut rx) = oneshot::channel();
        o.turn(&mut vec![
            Command::Reserve(request(&k), abandoned(), NOW),
            Command::Reserve(request(&k), tx, NOW),
        ]);
        assert!(matches!(rx.try_recv(), Ok(Decision::Proceed(_))));
        assert_eq!(o.shared.stats.releases.load(Ordering::Relaxed), 0);
    }

    /// A grant whose caller gave up after the owner applied it is released at the end of
    /// the turn, but only if the key still holds that grant's entry: in the same batch an
    /// operator may have released it and another caller reserved it again, and that
    /// caller's order is on its way.
    #[test]
    fn an_unanswered_grant_frees_only_its_own_entry() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let k = trade_key("BTC");
        let (first, gone) = oneshot::channel();
        let (op, mut op_rx) = oneshot::channel();
        let (second, mut second_rx) = oneshot::channel();
        turn_giving_up(
            &mut o,
            vec![
                Command::Reserve(request(&k), first, NOW),
                Command::ForceRelease(Box::new(k.clone()), None, op),
                Command::Reserve(request(&k), second, NOW),
            ],
            vec![gone],
        );
        assert_eq!(op_rx.try_recv(), Ok(Ok(Released::Yes)));
        assert!(matches!(second_rx.try_recv(), Ok(Decision::Proceed(_))));
        assert!(
            o.index.contains_key(k.as_str()),
            "the second grant was freed"
        );
        assert!(matches!(reserve(&mut o, &k), Decision::Duplicate(_)));
    }

    /// Only a record written resets the reopen backoff: a batch of duplicates after a
    /// reopen writes nothing, and says nothing of whether the disk takes a write.
    #[test]
    fn only_a_write_resets_the_reopen_backoff() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let (a, b) = (trade_key("BTC"), trade_key("ETH"));
        assert!(matches!(reserve(&mut o, &a), Decision::Proceed(_)));
        o.fail(Unavailable::CommitFailed("a fault".into()));
        o.reopen();
        assert!(o.store.is_some(), "{:?}", o.failure);
        assert_eq!(o.backoff, Duration::from_millis(50));
        assert!(matches!(reserve(&mut o, &a), Decision::Duplicate(_)));
        assert_eq!(o.backoff, Duration::from_millis(50), "reset by a duplicate");
        assert!(matches!(reserve(&mut o, &b), Decision::Proceed(_)));
        assert_eq!(o.backoff, Duration::ZERO);
    }

    fn reserve(o: &mut Owner, key: &Key) -> Decision {
        ask(o, |tx| Command::Reserve(request(key), tx, NOW))
    }

    /// Every entry that ends by its TTL is counted as expired, whether the wheel reaps it or
    /// a reserve of the same key replaces it first (an expired entry is absent before the
    /// wheel reaches it): reserves less releases less expiries is the live count. A
    /// replaced one went uncounted, and `hoox_mutex_expired_total` drifted under it.
    #[test]
    fn an_expired_entry_a_reserve_replaces_is_counted_as_expired() {
        let dir = tempfile::tempdir().unwrap();
        let (mut o, time) = owner_with_clock(dir.path());
        let expired = |o: &Owner| o.shared.stats.expired.load(Ordering::Relaxed);
        let k = trade_key("BTC");
        // Half a tick past a tick: the alarm rounds up to the next tick.
        time.advance_ms(150 - o.clock.mono_ms() % 100);
        assert!(matches!(reserve(&mut o, &k), Decision::Proceed(_)));
        // At the TTL to the millisecond: expired, its alarm not yet due (the wheel's tick
        // ends 50 ms later).
        time.advance_ms(300_000);
        assert!(o.index.contains_key(k.as_str()), "reaped already");
        assert!(matches!(reserve(&mut o, &k), Decision::Proceed(_)));
        assert_eq!(expired(&o), 1, "the replaced entry");
        assert_eq!(o.index.len(), 1);
        // The wheel's stale alarm for the first entry counts nothing more; the second
        // entry's counts once.
        time.advance_ms(600_000);
        o.turn(&mut vec![Command::Wake]);
        assert_eq!((expired(&o), o.index.len()), (2, 0));
    }

    /// At capacity, a trade whose key holds an expired entry not yet reaped takes that
    /// entry's place, and goes ahead: it needs no new one. Refused, its retry after the
    /// TTL waited for the wheel's next tick.
    #[test]
    fn at_capacity_an_expired_entry_not_yet_reaped_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let (mut o, time) = owner_with_clock(dir.path());
        o.config.capacity = 3;
        // Half a tick past a tick: the alarms round up to the next tick.
        time.advance_ms(150 - o.clock.mono_ms() % 100);
        let (a, b) = (trade_key("A"), trade_key("B"));
        assert!(matches!(reserve(&mut o, &a), Decision::Proceed(_)));
        assert!(matches!(reserve(&mut o, &b), Decision::Proceed(_)));
        assert!(o.at_capacity());
        time.advance_ms(300_000);
        assert!(o.index.contains_key(a.as_str()), "reaped already");
        assert!(matches!(reserve(&mut o, &a), Decision::Proceed(_)));
    }

    /// A grant nobody takes is released at the end of its turn, with its guard: the
    /// request was never sent, and its resend, the same bytes, must be able to run.
    #[test]
    fn an_unanswered_grant_is_released_with_its_guard() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let key = Key::from_stored("trade:x:BTC:LONG:1:live:1").unwrap();
        let guard = Key::signature(&[1; 32]);
        let (tx, gone) = oneshot::channel();
        let req = Reserve {
            key: key.clone(),
            ttl: Duration::from_secs(300),
            payload_hash: [1; 32],
            guard: Some(super::super::Guard {
                key: guard.clone(),
                ttl: Duration::from_secs(600),
                when_turned_away: true,
            }),
        };
        turn_giving_up(
            &mut o,
            vec![Command::Reserve(Box::new(req), tx, NOW)],
            vec![gone],
        );
        assert_eq!(o.shared.stats.releases.load(Ordering::Relaxed), 1);
        assert!(!o.index.contains_key(key.as_str()));
        assert!(!o.index.contains_key(guard.as_str()));
        assert!(matches!(reserve(&mut o, &key), Decision::Proceed(_)));
    }

    /// A reserve of `key` for a trade hashed `payload`, signed with signature `sig`: its
    /// guard is that signature's key.
    fn signed(key: &Key, sig: u8, payload: u8) -> Box<Reserve> {
        Box::new(Reserve {
            key: key.clone(),
            ttl: Duration::from_secs(300),
            payload_hash: [payload; 32],
            guard: Some(super::super::Guard {
                key: Key::signature(&[sig; 32]),
                ttl: Duration::from_secs(600),
                when_turned_away: true,
            }),
        })
    }

    fn granted(o: &mut Owner, req: Box<Reserve>) -> Grant {
        match ask(o, |tx| Command::Reserve(req, tx, NOW)) {
            Decision::Proceed(grant) => grant,
            d => panic!("not granted: {d:?}"),
        }
    }

    /// Asserts that `k` turns away the request signed `sig` as a duplicate.
    fn turned_away(o: &mut Owner, k: &Key, sig: u8) {
        match ask(o, |tx| Command::Reserve(signed(k, sig, 1), tx, NOW)) {
            Decision::Duplicate(_) => {}
            d => panic!("not a duplicate: {d:?}"),
        }
    }

    /// The operator's release of signature `sig`'s guard, which was live.
    fn release_guard(o: &mut Owner, sig: u8) {
        let key = Box::new(Key::signature(&[sig; 32]));
        assert_eq!(
            ask(o, |tx| Command::ForceRelease(key, None, tx)),
            Ok(Released::Yes)
        );
    }

    fn syncs(o: &Owner) -> u64 {
        o.shared.stats.fsync_seconds.snapshot().2
    }

    fn state_of(o: &Owner, key: &Key) -> Option<State> {
        o.index.get(key.as_str()).map(|l| l.state)
    }

    /// A signed retry turned away by a committed trade keeps its signature's guard, synced
    /// before its 409: replayed once the trade's key has moved on (a fingerprint's next
    /// minute, a client key past its TTL; here, another key), it is still a duplicate,
    /// not a second order. A resend of it finds the guard and writes nothing.
    #[test]
    fn a_signed_request_turned_away_by_a_committed_trade_keeps_its_guard() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let k = trade_key("BTC");
        let grant = granted(&mut o, signed(&k, 1, 1));
        o.turn(&mut vec![Command::Commit(Box::new(grant), None)]);
        let before = syncs(&o);
        match ask(&mut o, |tx| Command::Reserve(signed(&k, 2, 1), tx, NOW)) {
            Decision::Duplicate(d) => assert_eq!(d.key, k, "the trade's own 409"),
            d => panic!("{d:?}"),
        }
        let sig = Key::signature(&[2; 32]);
        assert_eq!(state_of(&o, &sig), Some(State::Committed));
        assert_eq!(syncs(&o), before + 1, "the guard is synced before the 409");
        match ask(&mut o, |tx| Command::Reserve(signed(&k, 2, 1), tx, NOW)) {
            Decision::Duplicate(d) => assert_eq!(d.key, k),
            d => panic!("{d:?}"),
        }
        assert_eq!(syncs(&o), before + 1, "a resend writes nothing");
        let elsewhere = trade_key("ETH");
        match ask(&mut o, |tx| {
            Command::Reserve(signed(&elsewhere, 2, 1), tx, NOW)
        }) {
            Decision::Duplicate(d) => assert_eq!(d.key, sig, "the replay is caught"),
            d => panic!("the replay was {d:?}"),
        }
        // On the disk, not only in the index.
        drop(o);
        let mut o = owner(dir.path());
        assert_eq!(state_of(&o, &sig), Some(State::Committed));
        assert!(matches!(
            ask(&mut o, |tx| Command::Reserve(
                signed(&elsewhere, 2, 1),
                tx,
                NOW
            )),
            Decision::Duplicate(_)
        ));
    }

    /// Turned away by a trade still pending, the guard follows that trade: committed with
    /// it; released with it, by the gateway or as an unanswered grant, since a trade that
    /// failed is its sender's to retry, with this very request if it likes.
    #[test]
    fn a_guard_turned_away_by_a_pending_trade_is_settled_with_it() {
        for how in ["commit", "release", "abandon"] {
            let dir = tempfile::tempdir().unwrap();
            let mut o = owner(dir.path());
            let k = trade_key("BTC");
            let sig = Key::signature(&[2; 32]);
            let (tx, gone) = oneshot::channel();
            let (retry, mut retry_rx) = oneshot::channel();
            let batch = vec![
                Command::Reserve(signed(&k, 1, 1), tx, NOW),
                Command::Reserve(signed(&k, 2, 1), retry, NOW),
            ];
            let grant = if how == "abandon" {
                turn_giving_up(&mut o, batch, vec![gone]);
                None
            } else {
                let mut gone = gone;
                o.turn(&mut { batch });
                match gone.try_recv() {
                    Ok(Decision::Proceed(g)) => Some(g),
                    d => panic!("{d:?}"),
                }
            };
            assert!(
                matches!(retry_rx.try_recv(), Ok(Decision::Duplicate(_))),
                "{how}"
            );
            if let Some(grant) = grant {
                assert_eq!(state_of(&o, &sig), Some(State::Pending), "{how}");
                let settle = if how == "commit" {
                    Command::Commit(Box::new(grant), None)
                } else {
                    Command::Release(Box::new(grant))
                };
                o.turn(&mut vec![settle]);
            }
            if how == "commit" {
                assert_eq!(state_of(&o, &sig), Some(State::Committed));
                assert!(o.followers.is_empty());
            } else {
                assert_eq!(state_of(&o, &sig), None, "{how}: the guard is held");
                assert!(matches!(
                    ask(&mut o, |tx| Command::Reserve(signed(&k, 2, 1), tx, NOW)),
                    Decision::Proceed(_)
                ));
            }
        }
    }

    /// Followers outlive a failure: a checkpoint while failing closed (an empty index, not
    /// an empty disk) forgets none, and the trade's release after the reopen frees its
    /// turned-away retry. Among one trade's followers, only those gone are forgotten.
    #[test]
    fn followers_are_pruned_by_their_own_guards_and_not_while_failing() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let k = trade_key("BTC");
        let grant = granted(&mut o, signed(&k, 1, 1));
        turned_away(&mut o, &k, 2);
        turned_away(&mut o, &k, 3);
        release_guard(&mut o, 3);
        o.checkpoint();
        let kept: Vec<usize> = o.followers.values().map(|(_, g)| g.len()).collect();
        assert_eq!(
            kept,
            [1],
            "the released guard is forgotten, the live one kept"
        );
        o.fail(Unavailable::CommitFailed("a fault".into()));
        o.checkpoint();
        o.reopen();
        assert!(o.store.is_some(), "{:?}", o.failure);
        o.turn(&mut vec![Command::Release(Box::new(grant))]);
        granted(&mut o, signed(&k, 2, 1));
    }

    /// The reopen forgets the followers whose guards are not on the disk it reads (here,
    /// one released before the failure), without waiting for a checkpoint.
    #[test]
    fn the_reopen_prunes_followers_against_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let k = trade_key("BTC");
        granted(&mut o, signed(&k, 1, 1));
        turned_away(&mut o, &k, 2);
        release_guard(&mut o, 2);
        assert_eq!(o.followers.len(), 1);
        o.fail(Unavailable::CommitFailed("a fault".into()));
        o.reopen();
        assert!(o.store.is_some(), "{:?}", o.failure);
        assert!(o.followers.is_empty());
    }

    /// A signed request refused as a mismatch (422) takes no guard: its trade was never
    /// taken, and once the key is free it runs, the first delivery of that trade. (Had it
    /// kept a guard, it would then be told its trade was "already accepted".)
    #[test]
    fn a_mismatched_signed_request_takes_no_guard() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let k = trade_key("BTC");
        let grant = granted(&mut o, signed(&k, 1, 1));
        let before = syncs(&o);
        assert_eq!(
            ask(&mut o, |tx| Command::Reserve(signed(&k, 2, 9), tx, NOW)),
            Decision::Mismatch
        );
        assert_eq!(state_of(&o, &Key::signature(&[2; 32])), None);
        assert_eq!(syncs(&o), before, "a 422 writes nothing");
        o.turn(&mut vec![Command::Release(Box::new(grant))]);
        granted(&mut o, signed(&k, 2, 9));
    }

    /// With no place left for the guard, the duplicate is still a 409, unguarded: a 503
    /// would have its sender retry this very request until it ran.
    #[test]
    fn a_duplicate_with_no_place_for_its_guard_is_still_a_duplicate() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        o.config.capacity = 2;
        let k = trade_key("BTC");
        granted(&mut o, signed(&k, 1, 1));
        match ask(&mut o, |tx| Command::Reserve(signed(&k, 2, 1), tx, NOW)) {
            Decision::Duplicate(d) => assert_eq!(d.key, k),
            d => panic!("{d:?}"),
        }
        assert_eq!(o.index.len(), 2, "no guard over capacity");
    }

    /// A follower's release lost with a failed write is made at the reopen, as its
    /// trade's is: else the turned-away request, resent as it was, would meet its guard
    /// (409 "already accepted") for a trade that failed.
    #[test]
    fn a_followers_release_a_failed_write_dropped_is_made_at_the_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let k = trade_key("BTC");
        let grant = granted(&mut o, signed(&k, 1, 1));
        turned_away(&mut o, &k, 2);
        // The release is carried, not written, when the write after it fails.
        o.turn(&mut vec![Command::Release(Box::new(grant))]);
        o.fail(Unavailable::CommitFailed("a fault".into()));
        o.reopen();
        assert!(o.store.is_some(), "{:?}", o.failure);
        granted(&mut o, signed(&k, 2, 1));
    }

    /// A list of fewer keys than are live gives those that expire first, in that order.
    #[test]
    fn a_list_gives_the_keys_that_expire_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        for (symbol, ttl) in [("A", 50), ("B", 10), ("C", 40), ("D", 20), ("E", 30)] {
            let mut req = request(&trade_key(symbol));
            req.ttl = Duration::from_secs(ttl);
            assert!(matches!(
                ask(&mut o, |tx| Command::Reserve(req, tx, NOW)),
                Decision::Proceed(_)
            ));
        }
        let listed = |o: &mut Owner, limit| -> Vec<String> {
            let list = ask(o, |tx| Command::List(limit, tx)).unwrap();
            list.iter().map(|e| e.key.as_str().to_string()).collect()
        };
        let names = |s: &[&str]| -> Vec<String> {
            s.iter()
                .map(|s| trade_key(s).as_str().to_string())
                .collect()
        };
        assert_eq!(listed(&mut o, 2), names(&["B", "D"]));
        assert_eq!(listed(&mut o, 9), names(&["B", "D", "E", "C", "A"]));
    }

    /// `latest` holds a family only while its key is in the index: released, expired and
    /// failed keys leave it, and a reopen finds them again from the table.
    #[test]
    fn a_family_is_kept_only_while_its_latest_key_is_indexed() {
        let dir = tempfile::tempdir().unwrap();
        let (mut o, time) = owner_with_clock(dir.path());
        let (a, b) = (trade_key("BTC"), trade_key("ETH"));
        let families = |o: &Owner| {
            let mut f: Vec<String> = o.latest.iter().map(|l| l.0.to_string()).collect();
            f.sort();
            f
        };
        let Decision::Proceed(ga) = reserve(&mut o, &a) else {
            panic!("a fresh key is granted")
        };
        assert!(matches!(reserve(&mut o, &b), Decision::Proceed(_)));
        let client = Key::from_stored("client:psk:live:order-1").unwrap();
        assert!(matches!(reserve(&mut o, &client), Decision::Proceed(_)));
        assert_eq!(families(&o), [a.as_str(), b.as_str()], "fingerprints only");
        o.turn(&mut vec![Command::Release(Box::new(ga))]);
        assert_eq!(families(&o), [b.as_str()]);
        o.fail(Unavailable::CommitFailed("a fault".into()));
        assert!(o.latest.is_empty());
        o.reopen();
        assert_eq!(families(&o), [b.as_str()]);
        time.advance_ms(300_000);
        o.turn(&mut Vec::new());
        assert!(o.index.is_empty() && o.latest.is_empty(), "expired");
    }

    /// Many families side by side, each its own: none is taken for another's.
    #[test]
    fn families_do_not_mix() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        for i in 0..500 {
            let k = trade_key(&format!("S{i}"));
            assert!(matches!(reserve(&mut o, &k), Decision::Proceed(_)), "{k}");
        }
        assert_eq!(o.latest.len(), 500);
    }

    /// A grant made before a failure still settles its own entry after the reopen, which
    /// brings the entry back from the journal with its number.
    #[test]
    fn a_grant_from_before_a_reopen_still_settles() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let (a, b) = (trade_key("BTC"), trade_key("ETH"));
        let (Decision::Proceed(ga), Decision::Proceed(gb)) =
            (reserve(&mut o, &a), reserve(&mut o, &b))
        else {
            panic!("fresh keys are granted")
        };
        o.fail(Unavailable::CommitFailed("a fault".into()));
        o.reopen();
        assert!(o.store.is_some(), "{:?}", o.failure);
        o.turn(&mut vec![Command::Commit(Box::new(ga), None)]);
        o.turn(&mut vec![Command::Release(Box::new(gb))]);
        match reserve(&mut o, &a) {
            Decision::Duplicate(d) => assert_eq!(d.state, State::Committed),
            other => panic!("the commit after the reopen was lost: {other:?}"),
        }
        assert!(matches!(reserve(&mut o, &b), Decision::Proceed(_)));
    }

    /// While failing closed the owner counts the keys it held when it failed, those the
    /// wall clock alone still held (a key read back, its deadline a guess, the wall clock
    /// set back since) included: read as none, they
    /// would invite the removal of the state files. And the kill switch it publishes is
    /// on if either the value applied or the one last written is: the failed batch's may
    /// or may not be on the disk.
    #[test]
    fn failing_closed_counts_wall_held_keys_and_publishes_the_switch_written() {
        let dir = tempfile::tempdir().unwrap();
        let k = trade_key("BTC");
        let (mut o, time) = read_back_ahead(dir.path(), &k, 30_000);
        time.step_wall_back_ms(30_000);
        time.advance_ms(271_000);
        assert!(matches!(reserve(&mut o, &k), Decision::Duplicate(_)));
        assert_eq!(o.live_keys(), 1);
        assert_eq!(ask(&mut o, |tx| Command::SetHalted(true, tx)), Ok(()));
        // Applied in a batch whose write then failed.
        o.halted = false;
        o.fail(Unavailable::CommitFailed("a fault".into()));
        assert_eq!(o.live_keys(), 1, "the wall-held key is not counted");
        assert!(
            o.shared.halted.load(Ordering::Relaxed),
            "an unwritten switch is published"
        );
        o.reopen();
        assert!(o.store.is_some(), "{:?}", o.failure);
        assert!(o.halted, "the switch written is read back");
        // The other way: a switch set in a batch whose write then failed may be on.
        assert_eq!(ask(&mut o, |tx| Command::SetHalted(false, tx)), Ok(()));
        o.halted = true;
        o.fail(Unavailable::CommitFailed("a fault".into()));
        assert!(
            o.shared.halted.load(Ordering::Relaxed),
            "a switch that may be on"
        );
        o.reopen();
        assert!(!o.halted, "the switch written is read back");
        assert_eq!(ask(&mut o, |tx| Command::SetHalted(false, tx)), Ok(()));
        assert!(matches!(reserve(&mut o, &k), Decision::Duplicate(_)));
        assert_eq!(o.live_keys(), 1);
    }

    /// A grant voided by the failure (its batch's write failed, so its trade was refused
    /// with a 503) is not counted as a key held, though the index had it: the reopen frees
    /// it. The others are counted until then, and after.
    #[test]
    fn failing_closed_does_not_count_a_voided_grant() {
        let dir = tempfile::tempdir().unwrap();
        let (mut o, _time) = owner_with_clock(dir.path());
        let (a, b, c) = (trade_key("A"), trade_key("B"), trade_key("C"));
        assert!(matches!(reserve(&mut o, &a), Decision::Proceed(_)));
        let Decision::Proceed(gb) = reserve(&mut o, &b) else {
            panic!("b not granted")
        };
        let Decision::Proceed(gc) = reserve(&mut o, &c) else {
            panic!("c not granted")
        };
        assert_eq!(o.live_keys(), 3);
        o.fail(Unavailable::CommitFailed("a fault".into()));
        assert_eq!(o.live_keys(), 3, "all held when it failed");
        // As the failed batch's reply does with its grant.
        o.void.push(gb);
        assert_eq!(o.live_keys(), 2, "the voided grant's key is not held");
        // A release refused while failing closed voids its grant too, and the count
        // published for the metrics follows.
        o.turn(&mut vec![Command::Release(Box::new(gc))]);
        assert_eq!(o.live_keys(), 1);
        assert_eq!(o.shared.live_keys.load(Ordering::Relaxed), 1);
        o.reopen();
        assert!(o.store.is_some(), "{:?}", o.failure);
        assert_eq!(o.live_keys(), 1);
        assert!(matches!(reserve(&mut o, &a), Decision::Duplicate(_)));
        assert!(matches!(reserve(&mut o, &b), Decision::Proceed(_)));
        assert!(matches!(reserve(&mut o, &c), Decision::Proceed(_)));
    }

    /// Failing closed across a long outage, the count follows both clocks: a key read
    /// back whose guessed deadline passes while the wall clock (set back) still holds it
    /// is counted through a second failure (a reopen that failed), and none once both
    /// pass. A key reserved here is counted to its exact deadline, whatever the wall clock.
    #[test]
    fn failing_closed_counts_keys_while_either_clock_holds_them() {
        let dir = tempfile::tempdir().unwrap();
        let k = trade_key("BTC");
        let (mut o, time) = read_back_ahead(dir.path(), &k, 30_000);
        o.fail(Unavailable::CommitFailed("a fault".into()));
        assert_eq!(o.live_keys(), 1);
        time.step_wall_back_ms(30_000);
        time.advance_ms(271_000);
        o.fail(Unavailable::CommitFailed("the reopen failed".into()));
        assert_eq!(o.live_keys(), 1, "held by the wall clock alone");
        time.advance_ms(29_000);
        assert_eq!(o.live_keys(), 0, "expired by both clocks");

        let dir = tempfile::tempdir().unwrap();
        let (mut o, time, _) = failed_holding_a_key(dir.path(), true);
        time.advance_ms(299_000);
        time.step_wall_back_ms(3_600_000);
        assert_eq!(o.live_keys(), 1, "held by the monotonic clock");
        o.fail(Unavailable::CommitFailed("the reopen failed".into()));
        time.advance_ms(1_000);
        assert_eq!(o.live_keys(), 0, "held by a wall clock stepped back");
    }

    /// A wall clock stepped forward while the owner fails closed frees no key at the
    /// reopen: the table is read by the wall clock, but a key the monotonic clock still
    /// held before the failure stays held until that clock says otherwise.
    #[test]
    fn a_wall_clock_stepped_while_failing_closed_frees_no_key_at_the_reopen() {
        // Where the boot is known, the entry's boot deadline holds the key by itself; where
        // it is not, only the deadlines the owner kept through the failure (`dues`) do.
        for known in [true, false] {
            stepped_while_failing_closed(known);
        }
    }

    /// An owner in a boot `known` or not that granted a key, then failed closed.
    fn failed_holding_a_key(
        dir: &std::path::Path,
        known: bool,
    ) -> (Owner, Arc<super::super::clock::ManualClock>, Key) {
        let (mut o, time) = owner_in_boot(dir, known);
        assert_eq!(o.boot.is_some(), known);
        let k = trade_key("BTC");
        assert!(matches!(reserve(&mut o, &k), Decision::Proceed(_)));
        o.fail(Unavailable::CommitFailed("a fault".into()));
        (o, time, k)
    }

    fn stepped_while_failing_closed(boot_known: bool) {
        let dir = tempfile::tempdir().unwrap();
        let (mut o, time, k) = failed_holding_a_key(dir.path(), boot_known);
        time.step_wall_ms(3_600_000);
        // A reopen that fails too keeps the deadlines for the next one.
        std::fs::rename(dir.path().join("m.redb"), dir.path().join("away")).unwrap();
        std::fs::create_dir(dir.path().join("m.redb")).unwrap();
        o.reopen();
        assert!(o.store.is_none(), "opened a directory");
        std::fs::remove_dir(dir.path().join("m.redb")).unwrap();
        std::fs::rename(dir.path().join("away"), dir.path().join("m.redb")).unwrap();
        o.reopen();
        assert!(o.store.is_some(), "{:?}", o.failure);
        assert!(
            matches!(reserve(&mut o, &k), Decision::Duplicate(_)),
            "the reopen freed a key the monotonic clock still held"
        );
        // Held until the monotonic clock has run the TTL (300 s), then free.
        time.advance_ms(300_000);
        assert!(matches!(reserve(&mut o, &k), Decision::Proceed(_)));
    }

    /// A key kept through a failure by its monotonic deadline alone (the boot unknown, the
    /// wall clock stepped past its expiry) is held until that deadline and no longer: a
    /// reopen at the very millisecond it falls due purges it, as `Live::live` frees it.
    #[test]
    fn a_reopen_at_the_monotonic_deadline_purges_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let (mut o, time, k) = failed_holding_a_key(dir.path(), false);
        time.step_wall_ms(3_600_000);
        // Exactly the TTL (300 s) on the monotonic clock.
        time.advance_ms(300_000);
        let expired = |o: &Owner| o.shared.stats.expired.load(Ordering::Relaxed);
        let before = expired(&o);
        o.reopen();
        assert!(o.store.is_some(), "{:?}", o.failure);
        assert!(!o.index.contains_key(k.as_str()), "kept past its deadline");
        assert_eq!(expired(&o), before + 1, "not purged at the reopen");
        assert!(matches!(reserve(&mut o, &k), Decision::Proceed(_)));
    }

    /// A key whose kept monotonic deadline has just run out (the boot unknown), but which
    /// the wall clock (stepped back while failing) still holds at the reopen, is tracked
    /// as any entry read from the disk: its monotonic deadline follows from the wall
    /// clock's time left, so a step forward of the wall clock after the reopen frees it
    /// no earlier than that.
    #[test]
    fn a_reopen_as_the_kept_deadline_runs_out_tracks_the_key_by_the_wall_clock() {
        let dir = tempfile::tempdir().unwrap();
        let (mut o, time, k) = failed_holding_a_key(dir.path(), false);
        time.step_wall_back_ms(10_000);
        // The monotonic clock exactly at the TTL (300 s); the wall clock 10 s short of it.
        time.advance_ms(300_000);
        o.reopen();
        assert!(o.store.is_some(), "{:?}", o.failure);
        time.step_wall_ms(3_600_000);
        assert!(
            matches!(reserve(&mut o, &k), Decision::Duplicate(_)),
            "freed by a wall clock step before the time the wall clock had left"
        );
        time.advance_ms(10_000);
        assert!(matches!(reserve(&mut o, &k), Decision::Proceed(_)));
    }

    /// An alarm left by a released key fires at its old time. The key was reserved again
    /// after a step back, with the same wall clock expiry, and the wall clock was then
    /// stepped forward past it: the alarm matches the new entry by its expiry, but the
    /// monotonic clock still holds the key, so it is not deleted.
    #[test]
    fn a_stale_alarm_deletes_no_key_a_clock_still_holds() {
        let dir = tempfile::tempdir().unwrap();
        let (mut o, time) = owner_with_clock(dir.path());
        let k = Key::from_stored("client:a:live:stale").unwrap();
        assert!(matches!(reserve(&mut o, &k), Decision::Proceed(_)));
        time.advance_ms(1_000);
        let freed = ask(&mut o, |tx| {
            Command::ForceRelease(Box::new(k.clone()), None, tx)
        });
        assert_eq!(freed, Ok(Released::Yes));
        time.step_wall_back_ms(1_000);
        // The same expiry on the wall clock, due a second later on the monotonic one.
        assert!(matches!(reserve(&mut o, &k), Decision::Proceed(_)));
        time.step_wall_ms(60_000);
        // The old alarm's time: it fires, and must leave the key alone.
        time.advance_ms(299_000);
        assert!(matches!(reserve(&mut o, &k), Decision::Duplicate(_)));
        time.advance_ms(1_000);
        assert!(matches!(reserve(&mut o, &k), Decision::Proceed(_)));
    }

    /// A stale alarm (its key released, then reserved again with a later expiry) is
    /// dropped when it fires, not set again: only the alarm of the key's own expiry is
    /// kept in the wheel.
    #[test]
    fn a_stale_alarm_is_dropped_when_it_fires() {
        let dir = tempfile::tempdir().unwrap();
        let (mut o, time) = owner_with_clock(dir.path());
        let k = Key::from_stored("client:a:live:again").unwrap();
        assert!(matches!(reserve(&mut o, &k), Decision::Proceed(_)));
        time.advance_ms(1_000);
        let freed = ask(&mut o, |tx| {
            Command::ForceRelease(Box::new(k.clone()), None, tx)
        });
        assert_eq!(freed, Ok(Released::Yes));
        // Again, a second later: a later expiry by both clocks.
        assert!(matches!(reserve(&mut o, &k), Decision::Proceed(_)));
        assert_eq!(o.wheel.len(), 2, "the old alarm and the new one");
        // The old alarm's time, not yet the new one's.
        time.advance_ms(299_500);
        let now = (o.clock.wall_ms(), o.clock.mono_ms());
        assert!(o.due_expiries(now.0, now.1).is_empty());
        assert_eq!(o.wheel.len(), 1, "a stale alarm was set again");
        assert!(o.index.contains_key(k.as_str()));
    }

    /// An alarm that finds its key held by the wall clock alone (a key read back, its
    /// deadline a guess, the wall clock set back since) is set again for when the wall
    /// clock will have passed the expiry (at most a bucket on), not for a time already
    /// due, which would fire it again at every tick.
    #[test]
    fn an_alarm_held_by_the_wall_clock_waits_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let k = trade_key("BTC");
        let (mut o, time) = read_back_ahead(dir.path(), &k, 30_000);
        time.step_wall_back_ms(30_000);
        time.advance_ms(270_000);
        let now = (o.clock.wall_ms(), o.clock.mono_ms());
        assert!(o.due_expiries(now.0, now.1).is_empty(), "freed early");
        assert_eq!(o.wheel.len(), 1);
        // A few seconds on, the wall clock still 25 s short: nothing is due.
        time.advance_ms(5_000);
        let mut fired = Vec::new();
        o.wheel.poll(o.clock.mono_ms(), usize::MAX, &mut fired);
        assert!(
            fired.is_empty(),
            "set again for a time already due: {fired:?}"
        );
        // Due once the wall clock has passed the expiry.
        time.advance_ms(25_000);
        o.wheel.poll(o.clock.mono_ms(), usize::MAX, &mut fired);
        assert_eq!(fired.len(), 1);
    }

    /// A key reserved here is held its TTL by the monotonic clock, exact, whatever the wall
    /// clock says: stepped back, it does not hold the key longer (a clock a year ahead
    /// when a key was taken, set right, held it a year), stepped forward, it frees none
    /// early.
    #[test]
    fn a_key_reserved_here_lives_its_ttl_by_the_monotonic_clock() {
        let dir = tempfile::tempdir().unwrap();
        let (mut o, time) = owner_with_clock(dir.path());
        let (k, idle) = (trade_key("BTC"), trade_key("SOL"));
        for key in [&k, &idle] {
            assert!(matches!(reserve(&mut o, key), Decision::Proceed(_)));
        }
        time.step_wall_back_ms(3_600_000);
        time.advance_ms(299_999);
        assert!(matches!(reserve(&mut o, &k), Decision::Duplicate(_)));
        time.advance_ms(1);
        assert!(
            matches!(reserve(&mut o, &k), Decision::Proceed(_)),
            "held by a wall clock stepped back"
        );
        // The other key, asked for by nobody, is deleted when its alarm fires.
        let _ = ask(&mut o, Command::Ping);
        assert!(!o.index.contains_key(idle.as_str()), "an expired key kept");

        // The other way round: the wall clock stepped forward past the TTL, the monotonic
        // clock short of it by a millisecond.
        let k = trade_key("ETH");
        assert!(matches!(reserve(&mut o, &k), Decision::Proceed(_)));
        time.step_wall_ms(3_600_000);
        time.advance_ms(299_999);
        assert!(matches!(reserve(&mut o, &k), Decision::Duplicate(_)));
    }

    /// An owner opened on a key a first one took (both in a boot whose id is unknown, or
    /// each in a boot of its own: `known`), an hour into its boot, with the wall clock
    /// `ahead` of where it was then: the key's monotonic deadline is a guess from the wall
    /// clock, `ahead` short of the TTL.
    fn read_back(
        dir: &std::path::Path,
        k: &Key,
        ahead: u64,
        known: bool,
    ) -> (Owner, Arc<super::super::clock::ManualClock>) {
        let (mut first, _) = owner_in_boot(dir, known);
        let Decision::Proceed(g) = reserve(&mut first, k) else {
            panic!("a fresh key is granted")
        };
        // Placed: a pending fingerprint holds its family whatever its age.
        first.turn(&mut vec![Command::Commit(Box::new(g), None)]);
        first.close();
        drop(first);
        owner_at(dir, known, |time| {
            time.advance_ms(3_600_000);
            time.step_wall_back_ms(3_600_000);
            time.step_wall_ms(ahead);
        })
    }

    fn read_back_ahead(
        dir: &std::path::Path,
        k: &Key,
        ahead: u64,
    ) -> (Owner, Arc<super::super::clock::ManualClock>) {
        read_back(dir, k, ahead, false)
    }

    /// A fingerprint read back whose deadline is a guess short by a step forward of the
    /// wall clock (a minute, here) is no older than the time since it was read: a retry
    /// of its trade that crossed into the next minute, at once, is refused as its
    /// duplicate (it was taken for a new trade, the minute's age counted from the guess).
    #[test]
    fn a_fingerprint_read_back_is_not_aged_by_a_clock_stepped_forward() {
        for known in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let k = Key::from_stored("trade:x:BTC:LONG:1:live:1").unwrap();
            let next = Key::from_stored("trade:x:BTC:LONG:1:live:2").unwrap();
            let (mut o, _time) = read_back(dir.path(), &k, 60_000, known);
            match reserve(&mut o, &next) {
                // Refused, though its age, said as the clocks give it, is a minute.
                Decision::Duplicate(d) => assert_eq!(d.age_ms, 60_000, "boot known {known}"),
                other => {
                    panic!("boot known {known}: a retry across the minute, at once: {other:?}")
                }
            }
        }
    }

    /// A key read from the disk whose monotonic deadline is a guess (the boot unknown, the
    /// wall clock a minute ahead at the open, so a minute short): the wall clock, set back
    /// since, holds it past that deadline, its alarm waiting for the wall clock, and it is
    /// free the moment both have passed; but never past its TTL from the open, whatever
    /// the wall clock says.
    #[test]
    fn a_key_read_back_is_held_by_the_wall_clock_up_to_its_ttl_from_the_open() {
        let dir = tempfile::tempdir().unwrap();
        let k = trade_key("BTC");
        let (mut o, time) = read_back_ahead(dir.path(), &k, 60_000);
        let d = |o: &mut Owner| match reserve(o, &k) {
            Decision::Duplicate(d) => d.expires_in_ms,
            other => panic!("{other:?}"),
        };
        assert_eq!(d(&mut o), 240_000, "by the guess");
        // Set right: the wall clock gives it the minute back.
        time.step_wall_back_ms(60_000);
        assert_eq!(d(&mut o), 300_000);
        // The guessed deadline passes: the alarm fires and waits for the wall clock.
        time.advance_ms(240_000);
        let _ = ask(&mut o, Command::Ping);
        assert_eq!(d(&mut o), 60_000, "freed by the guess alone");
        time.advance_ms(60_000);
        assert!(matches!(reserve(&mut o, &k), Decision::Proceed(_)));

        // Set back an hour, the wall clock holds such a key no longer than its TTL from
        // the open.
        let dir = tempfile::tempdir().unwrap();
        let (mut o, time) = read_back_ahead(dir.path(), &k, 60_000);
        time.step_wall_back_ms(3_600_000);
        assert_eq!(d(&mut o), 300_000);
        time.advance_ms(299_999);
        assert!(matches!(reserve(&mut o, &k), Decision::Duplicate(_)));
        time.advance_ms(1);
        assert!(
            matches!(reserve(&mut o, &k), Decision::Proceed(_)),
            "held past its TTL from the open"
        );
    }

    /// Each failure in a row doubles the pause before the next reopen, from 50 ms up to
    /// `reopen_backoff_max`; a reopen counts as an attempt only after a failure.
    #[test]
    fn reopens_back_off_exponentially_up_to_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let attempts = |o: &Owner| o.shared.stats.reopen_attempts.load(Ordering::Relaxed);
        assert_eq!(attempts(&o), 0, "the first open is not a retry");
        o.config.reopen_backoff_max = Duration::from_millis(300);
        let mut pauses = Vec::new();
        for _ in 0..4 {
            let before = Instant::now();
            o.fail(Unavailable::CommitFailed("a fault".into()));
            assert!(o.retry_at >= before + o.backoff, "retried too soon");
            pauses.push(o.backoff.as_millis());
        }
        assert_eq!(pauses, [50, 100, 200, 300]);
        o.reopen();
        assert!(o.store.is_some(), "{:?}", o.failure);
        assert_eq!(attempts(&o), 1);
    }

    /// The metrics count what happened: a synced write per batch that granted a key, a
    /// checkpoint only when one was taken, and a batch size only for a batch that held a
    /// command (a turn woken by an alarm alone is not a batch).
    #[test]
    fn the_owner_counts_its_syncs_checkpoints_and_batches() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let count = |h: &super::super::stats::Histogram| h.snapshot().2;
        for symbol in ["BTC", "ETH", "SOL"] {
            assert!(matches!(
                reserve(&mut o, &trade_key(symbol)),
                Decision::Proceed(_)
            ));
        }
        // A reserve and a read in one turn: one batch of two.
        let (tx, _rx) = oneshot::channel();
        let (ping, _p) = oneshot::channel();
        o.turn(&mut vec![
            Command::Reserve(request(&trade_key("XRP")), tx, NOW),
            Command::Ping(ping),
        ]);
        o.turn(&mut Vec::new());
        let stats = &o.shared.stats;
        assert_eq!(
            count(&stats.fsync_seconds),
            4,
            "one sync per granting batch"
        );
        assert_eq!(count(&stats.checkpoint_seconds), 0, "no checkpoint yet");
        let (buckets, sum, n) = stats.batch_size.snapshot();
        assert_eq!((n, sum), (4, 5.0), "batches of 1, 1, 1 and 2; none empty");
        assert_eq!(buckets[0], (1.0, 3));
        o.checkpoint();
        assert_eq!(count(&o.shared.stats.checkpoint_seconds), 1);
    }

    /// A read is answered only once every write before it is in the journal: what a
    /// `Get` reported survives a crash of the process right after it.
    #[test]
    fn what_a_read_reported_survives_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let k = trade_key("BTC");
        let Decision::Proceed(g) = reserve(&mut o, &k) else {
            panic!("a fresh key is granted")
        };
        // The commit promises no durability: carried, nothing written.
        o.turn(&mut vec![Command::Commit(Box::new(g), None)]);
        assert!(!o.carry.record().is_empty(), "the commit is carried");
        let seen = ask(&mut o, |tx| Command::Get(Box::new(k.clone()), tx)).unwrap();
        assert_eq!(seen.map(|e| e.state), Some(State::Committed));
        // A crash: the owner goes without its closing checkpoint.
        drop(o);
        let mut o = owner(dir.path());
        let after = ask(&mut o, |tx| Command::Get(Box::new(k.clone()), tx)).unwrap();
        assert_eq!(
            after.map(|e| e.state),
            Some(State::Committed),
            "a read reported a commit the disk did not have"
        );
    }

    /// A batch too big for the journal goes into redb at a checkpoint, without a record.
    /// A database copied before that checkpoint, put back beside the journal, must be
    /// refused: replayed, it would not hold the batch's keys.
    #[test]
    fn a_database_from_before_a_checkpoint_without_a_record_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        // Opened on a journal of two slots.
        let small = || {
            let config = Config {
                path: path.clone(),
                journal_bytes: 8 * 1024,
                ..Config::default()
            };
            let mut o = Owner::new(config, Clock::system(), Arc::default(), false);
            o.reopen();
            o
        };
        let checkpoints = |o: &Owner| o.shared.stats.checkpoint_seconds.snapshot().2;
        let mut o = small();
        assert!(matches!(
            reserve(&mut o, &trade_key("A")),
            Decision::Proceed(_)
        ));
        o.close();
        let copy = dir.path().join("m.redb.copy");
        std::fs::copy(&path, &copy).unwrap();

        // 200 reserves in one turn: a record of more than two 4 KiB slots.
        let mut o = small();
        let keys: Vec<Key> = (0..200).map(|i| trade_key(&format!("K{i}"))).collect();
        let (mut batch, mut answers) = (Vec::new(), Vec::new());
        for k in &keys {
            let (tx, rx) = oneshot::channel();
            batch.push(Command::Reserve(request(k), tx, NOW));
            answers.push(rx);
        }
        let before = checkpoints(&o);
        o.turn(&mut batch);
        assert_eq!(checkpoints(&o), before + 1, "answered through a checkpoint");
        for mut rx in answers {
            assert!(matches!(rx.try_recv(), Ok(Decision::Proceed(_))));
        }
        o.close();

        std::fs::rename(&path, dir.path().join("m.redb.current")).unwrap();
        std::fs::copy(&copy, &path).unwrap();
        match &small().failure {
            Some(Unavailable::NotOpen(why)) => assert!(why.contains("damaged or missing"), "{why}"),
            other => panic!("the copy from before the checkpoint was opened: {other:?}"),
        }
    }

    /// An operator release given the entry they looked at removes that entry only: a key
    /// freed and taken again since (by a retry, for a new order) is left to its new order.
    #[test]
    fn an_operator_release_of_a_seen_entry_leaves_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let k = trade_key("BTC");
        let Decision::Proceed(first) = reserve(&mut o, &k) else {
            panic!("a fresh key is granted")
        };
        let seen = |o: &mut Owner| {
            let e = ask(o, |tx| Command::Get(Box::new(k.clone()), tx));
            Seen::from(&e.unwrap().expect("the key is live"))
        };
        let old = seen(&mut o);
        o.turn(&mut vec![Command::Release(Box::new(first))]);
        assert!(matches!(reserve(&mut o, &k), Decision::Proceed(_)));
        let r = ask(&mut o, |tx| {
            Command::ForceRelease(Box::new(k.clone()), Some(old), tx)
        });
        assert_eq!(r, Ok(Released::Changed));
        assert!(matches!(reserve(&mut o, &k), Decision::Duplicate(_)));
        let new = seen(&mut o);
        let r = ask(&mut o, |tx| {
            Command::ForceRelease(Box::new(k.clone()), Some(new), tx)
        });
        assert_eq!(r, Ok(Released::Yes));
        let Decision::Proceed(grant) = reserve(&mut o, &k) else {
            panic!("a released key is granted")
        };
        let gone = ask(&mut o, |tx| {
            Command::ForceRelease(Box::new(trade_key("ETH")), Some(new), tx)
        });
        assert_eq!(gone, Ok(Released::NotFound));

        // Seen pending, its order out; the order fills (its commit is queued, so the
        // mark is gone) before the release arrives: the filled trade is left held.
        let pending = seen(&mut o);
        assert_eq!(pending.state, State::Pending);
        // Seen in another load of the index (before a reopen): not this entry's look.
        let other_load = Seen {
            load: pending.load.wrapping_add(1),
            ..pending
        };
        let r = ask(&mut o, |tx| {
            Command::ForceRelease(Box::new(k.clone()), Some(other_load), tx)
        });
        assert_eq!(r, Ok(Released::Changed));
        o.turn(&mut vec![Command::Commit(Box::new(grant), None)]);
        let r = ask(&mut o, |tx| {
            Command::ForceRelease(Box::new(k.clone()), Some(pending), tx)
        });
        assert_eq!(r, Ok(Released::Changed));
        assert!(matches!(reserve(&mut o, &k), Decision::Duplicate(_)));
    }

    /// An operator write whose caller gave up was reported to the operator as failed,
    /// so it is not applied; the same write with its caller waiting is.
    #[test]
    fn an_operator_write_nobody_waits_for_is_not_applied() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let k = trade_key("BTC");
        assert!(matches!(reserve(&mut o, &k), Decision::Proceed(_)));
        let tx = abandoned();
        o.turn(&mut vec![Command::ForceRelease(
            Box::new(k.clone()),
            None,
            tx,
        )]);
        assert!(matches!(reserve(&mut o, &k), Decision::Duplicate(_)));
        let tx = abandoned();
        o.turn(&mut vec![Command::SetHalted(true, tx)]);
        assert!(!o.halted);
        assert_eq!(ask(&mut o, |tx| Command::SetHalted(true, tx)), Ok(()));
        assert!(o.halted);
        let freed = ask(&mut o, |tx| {
            Command::ForceRelease(Box::new(k.clone()), None, tx)
        });
        assert_eq!(freed, Ok(Released::Yes));
        assert!(!o.index.contains_key(k.as_str()));
    }

    /// A release rides in `carry` until the next record is written, and a write that
    /// fails drops `carry`. The reserve is on the disk, so the reopen would hold the key
    /// for its TTL although its trade failed (or was never sent): the release is made
    /// again at the reopen. Both kinds: the gateway's, and the owner's own for a grant
    /// nobody took.
    #[test]
    fn a_release_a_failed_write_dropped_is_made_at_the_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let (a, b) = (trade_key("BTC"), trade_key("ETH"));
        let Decision::Proceed(ga) = reserve(&mut o, &a) else {
            panic!("a fresh key is granted")
        };
        // A grant nobody takes: written with its reserve, released into `carry`.
        let (tx, gone) = oneshot::channel();
        turn_giving_up(
            &mut o,
            vec![Command::Reserve(request(&b), tx, NOW)],
            vec![gone],
        );
        // The gateway's release, in a turn of its own: carried too, nothing written.
        o.turn(&mut vec![Command::Release(Box::new(ga))]);
        assert_eq!(
            o.released.len(),
            2,
            "both releases are carried, not yet written"
        );
        o.fail(Unavailable::CommitFailed("a fault".into()));
        o.reopen();
        assert!(o.store.is_some(), "{:?}", o.failure);
        for k in [&a, &b] {
            assert!(
                matches!(reserve(&mut o, k), Decision::Proceed(_)),
                "{k} stayed held after its release was lost"
            );
        }
    }

    /// The same for a signed trade's guard, when the trade's own entry was gone before its
    /// release (an operator released the key): the guard's release is carried all the
    /// same, and a failed write must not leave the signature held for its window.
    #[test]
    fn a_guard_release_a_failed_write_dropped_is_made_at_the_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let k = trade_key("BTC");
        let grant = granted(&mut o, signed(&k, 1, 1));
        let freed = ask(&mut o, |tx| {
            Command::ForceRelease(Box::new(k.clone()), None, tx)
        });
        assert_eq!(freed, Ok(Released::Yes));
        o.turn(&mut vec![Command::Release(Box::new(grant))]);
        o.fail(Unavailable::CommitFailed("a fault".into()));
        o.reopen();
        assert!(o.store.is_some(), "{:?}", o.failure);
        match ask(&mut o, |tx| Command::Reserve(signed(&k, 1, 1), tx, NOW)) {
            Decision::Proceed(_) => {}
            d => panic!("the guard stayed held: {d:?}"),
        }
    }

    /// A release that reaches the owner while it fails closed (queued before the failure
    /// was published) is made at the reopen: its sender was told it was queued.
    #[test]
    fn a_release_refused_while_failing_is_made_at_the_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let a = trade_key("BTC");
        let Decision::Proceed(ga) = reserve(&mut o, &a) else {
            panic!("a fresh key is granted")
        };
        o.fail(Unavailable::CommitFailed("a fault".into()));
        o.turn(&mut vec![Command::Release(Box::new(ga))]);
        o.reopen();
        assert!(o.store.is_some(), "{:?}", o.failure);
        assert!(matches!(reserve(&mut o, &a), Decision::Proceed(_)));
    }

    /// The table numbers its entries on from its highest at each open, so after the
    /// highest was released a reopen would hand that number out again. A grant from
    /// before the failure, settled after the reopen, would then act on the new entry of
    /// the same key: a late release would free a reservation whose trade is in flight.
    #[test]
    fn a_reopen_never_reuses_a_grants_number() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let key = Key::from_stored("trade:x:BTC:LONG:1:live:1").unwrap();
        let Decision::Proceed(old) = reserve(&mut o, &key) else {
            panic!("a fresh key is granted")
        };
        let freed = ask(&mut o, |tx| {
            Command::ForceRelease(Box::new(key.clone()), None, tx)
        });
        assert_eq!(freed, Ok(Released::Yes));
        // The disk fails and the owner reopens, as after a real fault: the table is empty.
        o.fail(Unavailable::CommitFailed("a fault".into()));
        o.reopen();
        assert!(o.store.is_some(), "{:?}", o.failure);
        let Decision::Proceed(new) = reserve(&mut o, &key) else {
            panic!("the released key is granted again")
        };
        assert_ne!(old.seq, new.seq);
        o.turn(&mut vec![Command::Release(Box::new(old))]);
        assert!(
            matches!(reserve(&mut o, &key), Decision::Duplicate(_)),
            "the stale grant's release freed the new reservation"
        );
        o.turn(&mut vec![Command::Release(Box::new(new))]);
        assert!(matches!(reserve(&mut o, &key), Decision::Proceed(_)));
    }

    /// A stream of reserves released at once leaves one stale alarm each; swept once they
    /// outnumber the live keys, the wheel stays bounded by `capacity`, not by the rate.
    #[test]
    fn released_keys_leave_no_unbounded_alarms() {
        let dir = tempfile::tempdir().unwrap();
        let (mut o, time) = owner_with_clock(dir.path());
        let kept = Key::from_stored("client:psk:live:kept").unwrap();
        assert!(matches!(reserve(&mut o, &kept), Decision::Proceed(_)));
        // Turns after which a sweep was under way, not done: it goes in steps, and does
        // not hold one turn for the whole wheel.
        let mut mid_sweep = 0;
        for round in 0..12 {
            let mut batch = Vec::new();
            let mut answers = Vec::new();
            for i in 0..1_000 {
                let k = Key::from_stored(&format!("client:psk:live:r{round}-{i}")).unwrap();
                let (tx, rx) = oneshot::channel();
                batch.push(Command::Reserve(request(&k), tx, NOW));
                answers.push(rx);
            }
            o.turn(&mut batch);
            let mut releases: Vec<_> = answers
                .into_iter()
                .map(|mut rx| match rx.try_recv() {
                    Ok(Decision::Proceed(g)) => Command::Release(Box::new(g)),
                    other => panic!("{other:?}"),
                })
                .collect();
            o.turn(&mut releases);
            mid_sweep += usize::from(o.wheel.sweeping());
        }
        assert!(mid_sweep > 0);
        assert_eq!(o.index.len(), 1);
        // 12,001 alarms unswept; swept in steps, under twice the threshold.
        assert!(o.wheel.len() <= 2 * (2 + STALE_ALARMS), "{}", o.wheel.len());
        // The live key's alarm survived the sweep: it still fires.
        time.advance_ms(301_000);
        let now = (o.clock.wall_ms(), o.clock.mono_ms());
        assert_eq!(
            o.due_expiries(now.0, now.1),
            vec![Rc::from("client:psk:live:kept")]
        );
    }

    /// While failing closed a key kept by its deadlines is counted as held until both
    /// clocks reach its TTL, and not at that very millisecond: the count follows
    /// `Live::live`, which frees the key then.
    #[test]
    fn failing_closed_counts_no_key_at_its_exact_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let (o, time, _) = failed_holding_a_key(dir.path(), true);
        time.advance_ms(299_999);
        assert_eq!(o.live_keys(), 1, "held a millisecond before its TTL");
        // Exactly the TTL (300 s) by both clocks.
        time.advance_ms(1);
        assert_eq!(o.live_keys(), 0, "counted at its deadline");
    }

    /// Under the threshold (twice the keys plus `STALE_ALARMS`) no turn sweeps: a stale
    /// alarm waits to be dropped when it fires, and a turn does not walk the wheel.
    #[test]
    fn a_few_stale_alarms_are_not_swept() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = owner(dir.path());
        let k = trade_key("BTC");
        let Decision::Proceed(grant) = reserve(&mut o, &k) else {
            panic!("a fresh key is granted")
        };
        o.turn(&mut vec![Command::Release(Box::new(grant))]);
        assert!(!o.index.contains_key(k.as_str()));
        assert_eq!(o.wheel.len(), 1, "the released key's alarm");
        // Twice the turns a pass over the wheel's 4096 buckets takes in steps of 512.
        for _ in 0..16 {
            ask(&mut o, Command::Ping);
        }
        assert_eq!(o.wheel.len(), 1, "swept under the threshold");
        assert!(!o.wheel.sweeping());
    }
}
