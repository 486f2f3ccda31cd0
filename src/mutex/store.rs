//! redb tables, the versioned postcard entry, and opening the database with its journal.
//!
//! Two tables: `entries` maps a sequence number to an encoded [`Entry`] (which carries its
//! key); `meta` holds the kill switch, the journal id, the checkpoint lsn, the journal's
//! length and the first open in this boot (`boot_open`). The table holds live keys only: the owner deletes what expires, so
//! the file stays the size of the working set. Every write goes through a [`Batch`], which
//! encodes it as the operations of one journal record; the tables receive those very
//! records at the next checkpoint.
//!
//! Why a sequence number and not the idempotency key as the table key: keys arrive in
//! random order, so a batch of N reserves keyed by key dirties ~N B-tree leaves, and the
//! group commit writes (and fsyncs) N pages. Keyed by an increasing sequence, the batch
//! appends to the last leaf or two; commits and releases touch recent entries (the same
//! few leaves) and expiries delete from the oldest end. The lookup by key never needs the
//! table: the owner's in-memory index maps key → sequence.
//!
//! An entry on disk is a postcard enum whose variant index is the format version. postcard
//! writes that index as the first varint, so a version adds a variant (`V2`, the one
//! written now) and still reads every `V1` ever written; nothing else in the format needs
//! to change to evolve it.

use std::collections::HashMap;
use std::ops::Range;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use redb::backends::FileBackend;
use redb::{Database, ReadableDatabase, ReadableTable, Table, TableDefinition};
use serde::{Deserialize, Serialize};

use super::journal::{self, Journal, JournalError, Op};
use super::{PayloadHash, Snapshot, State};

const ENTRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("entries");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const HALTED: &str = "halted";
/// This database's journal id (u64 LE): records of any other id are not ours.
const JOURNAL_ID: &str = "journal_id";
/// The last journal record this database holds durably (u64 LE).
const CHECKPOINT: &str = "journal_lsn";
/// The journal's length at this database's last open (u64 LE): a journal found shorter
/// was cut (by a copy, a restore, a file-system repair), and the records it held with it.
const JOURNAL_LEN: &str = "journal_len";
/// This database's first open in a boot that found live entries of an earlier one
/// ([`BootOpen`]: 20 bytes, the boot id u32 LE, its clock's ms u64 LE, the wall clock's ms
/// u64 LE), written apart after that open's commit.
const BOOT_OPEN: &str = "boot_open";

/// redb caches pages in memory; the default (1 GiB) is too much for a Raspberry Pi, and
/// the hot path never reads the database anyway (decisions come from the index).
const CACHE_BYTES: usize = 64 * 1024 * 1024;

/// One key's record, as the current version understands it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The stored key (`Key::as_str`), checked again by `Key::from_stored` at load.
    pub key: String,
    pub state: State,
    /// Unix ms when the key was reserved.
    pub stored_at: u64,
    /// Unix ms from which the key is free again.
    pub expires_at: u64,
    pub payload_hash: PayloadHash,
    /// The executor's answer, kept for replaying a duplicate of a committed key.
    pub response: Option<Snapshot>,
    /// When the key expires by the boot clock, for a restart within the same boot: no step
    /// of the wall clock between the reserve and the restart frees it early. `None` where
    /// the boot is not known, and in entries of V1.
    pub boot_due: Option<BootTime>,
}

/// A time on the boot clock (`CLOCK_BOOTTIME`, the owner's monotonic clock), which means
/// something only in the boot it was read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootTime {
    /// Which boot (`Clock::boot`).
    pub boot: u32,
    /// Milliseconds since that boot began.
    pub ms: u64,
}

impl BootTime {
    /// Its milliseconds, if it was read in `boot` (`Clock::boot`): the only boot whose
    /// clock they mean anything on.
    pub fn ms_in(self, boot: Option<u32>) -> Option<u64> {
        (Some(self.boot) == boot).then_some(self.ms)
    }
}

/// The first open of the database in a boot: that boot's clock, and the wall clock then.
/// An entry of an earlier boot has no deadline on this boot's clock of its own; the first
/// open's index gave it one by the wall clock of that moment, and a later open in the
/// same boot gives it the same one from this, not from a wall clock NTP may have stepped
/// forward since (which would free it early).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BootOpen {
    pub at: BootTime,
    pub wall: u64,
}

impl BootOpen {
    fn decode(v: &[u8]) -> Option<BootOpen> {
        let boot = u32::from_le_bytes(v.get(..4)?.try_into().ok()?);
        let ms = u64::from_le_bytes(v.get(4..12)?.try_into().ok()?);
        let wall = u64::from_le_bytes(v.get(12..20)?.try_into().ok()?);
        (v.len() == 20).then_some(BootOpen {
            at: BootTime { boot, ms },
            wall,
        })
    }

    fn encode(self) -> [u8; 20] {
        let mut v = [0; 20];
        v[..4].copy_from_slice(&self.at.boot.to_le_bytes());
        v[4..12].copy_from_slice(&self.at.ms.to_le_bytes());
        v[12..].copy_from_slice(&self.wall.to_le_bytes());
        v
    }
}

/// When `e` expires on the clock of `boot`: its own deadline if it was written in that
/// boot, else the one that boot's first open (`first`) gave it: the wall clock's time
/// left then, never more than its TTL. None if neither is known. The one rule for the
/// purge at open and for the index it rebuilds.
pub(super) fn due_in_boot(e: &Entry, boot: Option<u32>, first: Option<BootOpen>) -> Option<u64> {
    e.boot_due.and_then(|d| d.ms_in(boot)).or_else(|| {
        let first = first.filter(|f| Some(f.at.boot) == boot)?;
        // Saturating: the times may come from the disk.
        let ttl = e.expires_at.saturating_sub(e.stored_at);
        let left = e.expires_at.saturating_sub(first.wall).min(ttl);
        Some(first.at.ms.saturating_add(left))
    })
}

/// The format on disk. The variant index is the version; never reorder or remove one.
#[derive(Deserialize)]
enum Versioned {
    V1(EntryV1),
    V2(Entry),
}

/// The version written now: [`Versioned::V2`]'s index, as postcard writes it (a varint,
/// one byte below 128).
const VERSION: u8 = 1;

/// An entry as the first version wrote it: without its boot deadline.
#[derive(Deserialize)]
struct EntryV1 {
    key: String,
    state: State,
    stored_at: u64,
    expires_at: u64,
    payload_hash: PayloadHash,
    response: Option<Snapshot>,
}

impl From<EntryV1> for Entry {
    fn from(e: EntryV1) -> Entry {
        Entry {
            key: e.key,
            state: e.state,
            stored_at: e.stored_at,
            expires_at: e.expires_at,
            payload_hash: e.payload_hash,
            response: e.response,
            boot_due: None,
        }
    }
}

/// Why stored bytes are not an entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("entry is not valid postcard for any known version: {0}")]
    Malformed(String),
    #[error("entry has {0} trailing bytes")]
    Trailing(usize),
}

/// Decodes a stored entry. Never panics, whatever the bytes.
pub fn decode_entry(bytes: &[u8]) -> Result<Entry, DecodeError> {
    let (v, rest) = postcard::take_from_bytes::<Versioned>(bytes)
        .map_err(|e| DecodeError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(DecodeError::Trailing(rest.len()));
    }
    match v {
        Versioned::V1(e) => Ok(e.into()),
        Versioned::V2(e) => Ok(e),
    }
}

/// Encodes an entry in the current version: the variant index, then the entry, which is
/// what postcard writes for `Versioned::V2(e)`, without cloning the entry into one.
pub fn encode_entry(e: &Entry) -> Vec<u8> {
    // Serialising a plain struct into a Vec cannot fail: postcard only errors on a full
    // fixed buffer or on types it does not support (maps of unknown length), neither here.
    postcard::to_extend(e, vec![VERSION]).unwrap_or_default()
}

/// The database and its journal, opened together: the journal holds what redb has not
/// been given yet, until the next checkpoint (see `journal.rs`).
pub(super) struct Store {
    pub db: Database,
    pub journal: Journal,
    /// The payloads of the journal records since the last checkpoint, in order: what redb
    /// has not been given yet. redb is written only at a checkpoint, in one transaction,
    /// so a batch costs the journal write and nothing else.
    pending: Vec<u8>,
    /// For each entry written with a response since the last checkpoint, where its latest
    /// such bytes sit in `pending`: only a duplicate that replays a response reads it.
    pending_responses: HashMap<u64, Range<usize>>,
    /// Journal records since the last checkpoint.
    pending_records: usize,
    /// The journal's length, when the open did not record it (`journal_len`, for a
    /// database from before it was kept): the next checkpoint, which writes anyway, does.
    unrecorded_len: Option<u64>,
    /// The database's file and the journal's, as opened: path, device, inode.
    files: [(PathBuf, u64, u64); 2],
}

/// Records kept before an idle owner takes a checkpoint. A checkpoint's cost is mostly
/// fixed (a redb commit and its fsync), and a caller that arrives during one waits for it:
/// small enough that one is short (measured at 1k req/s: a full 4 MiB journal's checkpoint
/// took 1.5-20 ms), large enough that few callers meet one.
const IDLE_CHECKPOINT_RECORDS: usize = 128;

impl Store {
    /// Whether both files are still the ones opened. One removed or replaced while open
    /// (`rm`, a copy restored over it) takes with it all that is written from then on:
    /// the process writes on, to a file no restart will find. A path that cannot be looked
    /// at now counts as moved: the owner fails closed on it, and its reopen says why.
    pub fn files_in_place(&self) -> Result<(), String> {
        use std::os::unix::fs::MetadataExt;
        for (path, dev, ino) in &self.files {
            match std::fs::metadata(path) {
                Ok(m) if (m.dev(), m.ino()) == (*dev, *ino) => {}
                Ok(_) => return Err(format!("{} was replaced while open", path.display())),
                Err(e) => return Err(format!("{} went while open: {e}", path.display())),
            }
        }
        Ok(())
    }

    /// Whether an idle owner should take a checkpoint now.
    pub fn checkpoint_due(&self) -> bool {
        self.pending_records >= IDLE_CHECKPOINT_RECORDS.min(self.journal.slots() / 2).max(1)
    }
}

/// What a scan at open finds.
pub(super) struct Loaded {
    /// `(sequence, entry)` in sequence order.
    pub live: Vec<(u64, Entry)>,
    /// The next sequence number to use.
    pub next_seq: u64,
    pub purged: u64,
    pub halted: bool,
    /// Journal records replayed into the database.
    pub replayed: usize,
    /// The newest record newer than the checkpoint that failed its check, skipped
    /// (`journal::Scan::torn`).
    pub torn: Option<u64>,
    /// The database's first open in this boot (this one, if it is), if the boot is known.
    pub boot_open: Option<BootOpen>,
}

/// Why the store cannot be trusted at open.
#[derive(Debug, thiserror::Error)]
pub(super) enum LoadError {
    #[error(transparent)]
    Db(#[from] redb::Error),
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The replay failed where a live write would have: the same operations, the same
    /// errors.
    #[error(transparent)]
    Replay(#[from] WriteError),
    /// A record this version cannot read might be a live reservation: refuse to serve
    /// rather than forget it.
    #[error("entry #{seq} cannot be read: {err}")]
    Entry { seq: u64, err: DecodeError },
    /// A file of the database is gone where one must be (SPEC §1: missing is Unavailable).
    #[error("{} is missing or empty, but {why}: {fix}", path.display())]
    Missing {
        path: PathBuf,
        why: &'static str,
        fix: String,
    },
    /// The journal holds none of the database's records, though the database wrote some
    /// and a journal is never cleared: another file put in its place.
    #[error(
        "{} holds no record of the database {} (it is zeros, or another database's \
         journal), though the database wrote records to it: the keys they reserved since \
         its last checkpoint would be forgotten. Restore its own journal, or remove both \
         files to start with no live keys",
        path.display(),
        db.display()
    )]
    Foreign { path: PathBuf, db: PathBuf },
    /// The journal is shorter than it was: the records in its lost tail may have answered
    /// Proceed, and nothing names them (an anchor names only records before its own).
    #[error(
        "{} is {found} bytes, but it was {was}: the records it held past {found} bytes may \
         be lost (a copy or a file-system repair cut it). Restore it, or remove it and the \
         database to start with no live keys",
        path.display()
    )]
    Shortened { path: PathBuf, found: u64, was: u64 },
    /// A value of the database's own bookkeeping is not what any version wrote: the file
    /// was damaged or edited, and reading it as absent could drop the journal.
    #[error(
        "the database's {key:?} holds a value no version writes ({} bytes: {}): the \
         database is damaged",
        value.len(),
        value.iter().take(16).map(|b| format!("{b:02x}")).collect::<String>()
    )]
    Meta { key: &'static str, value: Vec<u8> },
    /// redb's lock on the file is taken: another process has it open, most likely another
    /// gateway started on the same state folder (or `store.path`).
    #[error(
        "another process has it open (another hoox-edge on the same store.path? `fuser -v` \
         on the file names it)"
    )]
    Locked,
}

impl LoadError {
    /// `path` is gone, though `why` says it existed. `other` is the database's other file,
    /// which the operator may remove too to start with no live keys. `None` when this
    /// process had the database open: then the way out is to bring the disk back, for a
    /// restart that found neither file would take it for a first start.
    fn missing(path: &Path, why: &'static str, other: Option<&Path>) -> LoadError {
        let fix = match other {
            Some(other) => format!(
                "restore it, or remove {} too and restart the gateway to start with no \
                 live keys",
                other.display()
            ),
            None => "remount or restore it, and do not restart until then: a start that \
                     finds neither file starts with no live keys"
                .into(),
        };
        LoadError::Missing {
            path: path.to_owned(),
            why,
            fix,
        }
    }
}

/// Why a batch could not be written. The owner fails closed on any of them.
#[derive(Debug, thiserror::Error)]
pub(super) enum WriteError {
    #[error(transparent)]
    Db(#[from] redb::Error),
    #[error(transparent)]
    Record(#[from] JournalError),
    #[error("journal: {0}")]
    Journal(#[from] std::io::Error),
    #[error("cannot encode a journal record: {0}")]
    Encode(#[from] postcard::Error),
    /// Only a damaged table holds a number this high: failing closed beats wrapping to 0,
    /// where a new entry would overwrite a live one.
    #[error("entry numbers exhausted")]
    SeqExhausted,
}

macro_rules! via_redb_error {
    ($($t:ty),*) => {$(
        impl From<$t> for WriteError {
            fn from(e: $t) -> Self {
                WriteError::Db(e.into())
            }
        }
        impl From<$t> for LoadError {
            fn from(e: $t) -> Self {
                LoadError::Db(e.into())
            }
        }
    )*};
}
impl From<redb::DatabaseError> for LoadError {
    fn from(e: redb::DatabaseError) -> Self {
        match e {
            redb::DatabaseError::DatabaseAlreadyOpen => LoadError::Locked,
            e => LoadError::Db(e.into()),
        }
    }
}

via_redb_error!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

/// Whether [`open`] may make a database where it finds neither file: only a process that
/// has found neither since it started (a first start). One that had the database open,
/// or found either file here, takes neither file for a lost one; the `&str` says which
/// (`LoadError::Missing`'s `why`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Create {
    Yes,
    No(&'static str),
}

/// Whether either file of the database at `path` is there, not empty (as [`open`] counts
/// a file). One that cannot be looked at is not counted: `open` will fail on it too.
pub(super) fn found_a_file(path: &Path) -> bool {
    [path, &journal::path_for(path)]
        .into_iter()
        .any(|p| matches!(bytes_at(p), Ok(n) if n > 0))
}

/// Opens the database and its journal, replays the journal into the database, reads every
/// entry, deletes those expired at `now_wall` but not `held` (by number) nor live by the
/// boot clock (`Entry::boot_due` after `now_boot`, in the same boot), and
/// commits all that durably: a checkpoint, after which the journal starts empty and the
/// file holds only live keys.
///
/// Both files are created only where nothing of an earlier database is left, and only if
/// `may_create` says so ([`Create`]). A file that is gone where one must be is
/// [`LoadError::Missing`]: an empty one in its place would forget every live key.
///
/// Integrity is checked on every open: a plain redb open trusts the file and may panic on
/// one damaged outside redb, and a panic in the owner would take the process down instead
/// of failing closed. The database is opened before the journal, so a second process is
/// refused by redb's lock before it can touch the journal.
pub(super) fn open(
    path: &Path,
    journal_bytes: usize,
    may_create: Create,
    now_wall: u64,
    now_boot: Option<BootTime>,
    held: impl Fn(u64) -> bool,
) -> Result<(Store, Loaded), LoadError> {
    let journal_path = journal::path_for(path);
    // Zero bytes is as good as no file: a first start made in place (by 0.2.0 or older, or
    // on a file system without hard links) that stopped before redb wrote a header.
    let db_bytes = bytes_at(path).map_err(io)?;
    let mut builder = Database::builder();
    builder
        .set_cache_size(CACHE_BYTES)
        .set_check_integrity_on_open(true);
    // Each file's device and inode by its path, as `files_in_place` looks at them, taken
    // as soon as it is open: a file replaced later, even during this open, is found.
    let identity = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p)
            .map(|m| (p.to_path_buf(), m.dev(), m.ino()))
            .map_err(io)
    };
    let db = if db_bytes > 0 {
        // `open`, not `create`: a file gone since the check is an error, not a new file.
        builder.open(path)?
    } else if bytes_at(&journal_path).map_err(io)? > 0 {
        return Err(LoadError::missing(
            path,
            "its journal is there",
            Some(&journal_path),
        ));
    } else if let Create::No(why) = may_create {
        return Err(LoadError::missing(path, why, None));
    } else {
        let db = create(&builder, path)?;
        // Said loudly, once: the one start that should make a database is the first. Any
        // other (a `store.path` changed, a state folder moved or restored elsewhere) has
        // left every live key, and a halt, in a database this gateway no longer reads.
        log::warn!(
            "mutex: no database at {}: made a new one, with no live keys. On a first \
             start that is as it should be; otherwise the keys held in the database used \
             before (another store.path, a state folder moved) are not here, nor a halt \
             set there: retries of their trades will be sent",
            path.display()
        );
        db
    };
    let db_identity = identity(path)?;
    // Drafts never held a key: this start's own, once linked a second name of the database
    // (or left as one by a crash before this sweep), and those of first starts that stopped.
    remove_drafts(path);
    let mut txn = db.begin_write()?;
    let (file, journal_identity, id, checkpoint, replayed, torn, halted, unrecorded_len, boot_open) = {
        let mut meta = txn.open_table(META)?;
        let mut entries = txn.open_table(ENTRIES)?;
        let known = read_u64(&meta, JOURNAL_ID)?;
        // A database's first open fills the journal before it commits the journal's id,
        // so a database with an id has had a journal: one gone (or emptied) now took
        // records with it, and one shorter than it was, those of its tail.
        let found = bytes_at(&journal_path).map_err(JournalError::from)?;
        let was = read_u64(&meta, JOURNAL_LEN)?;
        if known.is_some() && found == 0 {
            let why = "the database has used it";
            return Err(LoadError::missing(&journal_path, why, Some(path)));
        }
        if let Some(was) = was.filter(|was| known.is_some() && found < *was) {
            let path = journal_path;
            return Err(LoadError::Shortened { path, found, was });
        }
        let file = Journal::open_file(&journal_path, journal_bytes, known.is_none())
            .map_err(JournalError::from)?;
        let journal_identity = identity(&journal_path)?;
        let len = file.metadata().map_err(JournalError::from)?.len();
        let bytes = Journal::read_all(&file).map_err(JournalError::from)?;
        let id = match known {
            Some(id) => id,
            // A database that never had a journal put in place of the one that wrote it
            // (a blank file, the wrong one restored): its records would be skipped as
            // another journal's, and the keys they reserved forgotten.
            None if journal::holds_records(&bytes) => {
                let why = "its journal holds records";
                return Err(LoadError::missing(path, why, Some(&journal_path)));
            }
            None => {
                let id = getrandom::u64()
                    .map_err(|e| JournalError::Io(std::io::Error::other(e.to_string())))?;
                meta.insert(JOURNAL_ID, id.to_le_bytes().as_slice())?;
                id
            }
        };
        let stored = read_u64(&meta, CHECKPOINT)?.unwrap_or(0);
        if stored > journal::MAX_LSN {
            let value = stored.to_le_bytes().to_vec();
            return Err(LoadError::Meta {
                key: CHECKPOINT,
                value,
            });
        }
        // The journal is never cleared (a checkpoint moves only where the next record
        // goes), so a database whose checkpoint has moved finds a record of its own there,
        // of some lsn. None: a journal put in its place, zeros or another database's, of
        // the same length. Its records past the checkpoint, keys answered Proceed, would
        // be forgotten without a word.
        if known.is_some() && stored > 0 && !journal::holds_own(&bytes, id) {
            let (path, db) = (journal_path, path.to_owned());
            return Err(LoadError::Foreign { path, db });
        }
        let journal::Scan { records, torn } = journal::scan(&bytes, id, stored)?;
        for (lsn, payload) in &records {
            apply_ops(&mut entries, &mut meta, *lsn, payload)?;
        }
        // Past every record found, torn ones too: the journal starts over after this
        // checkpoint, and a torn record left with an lsn it will hand out again would,
        // after a second crash, read as a synced record damaged with later ones intact.
        let checkpoint = records
            .iter()
            .map(|r| r.0)
            .chain(torn)
            .fold(stored, u64::max);
        // Written only when it moved: an open that changes nothing writes nothing, so a
        // full disk or a file-size limit does not stop a database from opening.
        if checkpoint != stored {
            meta.insert(CHECKPOINT, checkpoint.to_le_bytes().as_slice())?;
        }
        // The journal's length rides a write the open makes anyway (a first open, or a
        // checkpoint that moved), for the same reason. A database from before it was kept
        // gets it at its first such open; until then the check has nothing to go by.
        let mut unrecorded = (was != Some(len)).then_some(len);
        if unrecorded.is_some() && (known.is_none() || checkpoint != stored) {
            meta.insert(JOURNAL_LEN, len.to_le_bytes().as_slice())?;
            unrecorded = None;
        }
        let halted = read_halted(&meta)?;
        // This boot's first open: as recorded, or this one (recorded below, if it must be).
        let boot_open = match meta.get(BOOT_OPEN).map_err(redb::Error::from)? {
            None => None,
            Some(v) => Some(BootOpen::decode(v.value()).ok_or_else(|| LoadError::Meta {
                key: BOOT_OPEN,
                value: v.value().to_vec(),
            })?),
        };
        let boot_open = match (boot_open, now_boot) {
            (Some(first), Some(now)) if first.at.boot == now.boot => Some((first, true)),
            (_, Some(now)) => Some((
                BootOpen {
                    at: now,
                    wall: now_wall,
                },
                false,
            )),
            (_, None) => None,
        };
        let found = records.len();
        (
            file,
            journal_identity,
            id,
            checkpoint,
            found,
            torn,
            halted,
            unrecorded,
            boot_open,
        )
    };
    // Live by the boot clock: not yet due on this boot's clock.
    let boot_live = |e: &Entry| {
        now_boot.is_some_and(|now| {
            due_in_boot(e, Some(now.boot), boot_open.map(|(f, _)| f)).is_some_and(|ms| ms > now.ms)
        })
    };
    let mut live = Vec::new();
    let mut expired = Vec::new();
    let mut next_seq = 0;
    {
        let mut entries = txn.open_table(ENTRIES)?;
        for row in entries.iter()? {
            let (k, v) = row?;
            let seq = k.value();
            next_seq = seq.checked_add(1).ok_or(WriteError::SeqExhausted)?;
            let entry = decode_entry(v.value()).map_err(|err| LoadError::Entry { seq, err })?;
            if entry.expires_at <= now_wall && !held(seq) && !boot_live(&entry) {
                expired.push(seq);
            } else {
                live.push((seq, entry));
            }
        }
        for seq in &expired {
            entries.remove(seq)?;
        }
    }
    // Durable before the journal is written again from its start, over the records just
    // replayed: said here, as at every checkpoint, rather than left to redb's default
    // (`Immediate` in redb 4, which a later release could change).
    txn.set_durability(redb::Durability::Immediate)?;
    txn.commit()?;
    // This boot's first open, recorded only when a live entry needs it (one of an earlier
    // boot: after a reboot), and apart, after the open's own commit: so an open that changes
    // nothing still writes nothing, and a full disk that refuses the record still opens, as
    // before there was one (a restart in this boot then takes those entries by the wall
    // clock again).
    let needs = |e: &Entry| {
        e.boot_due
            .and_then(|d| d.ms_in(now_boot.map(|b| b.boot)))
            .is_none()
    };
    if let Some((first, false)) = boot_open
        && live.iter().any(|(_, e)| needs(e))
        && let Err(e) = record_boot_open(&db, first)
    {
        log::warn!(
            "mutex: cannot record this boot's first open ({e}): a restart in this boot \
             frees the last boot's keys by the wall clock, which NTP may have stepped forward"
        );
    }
    let boot_open = boot_open.map(|(first, _)| first);
    let files = [db_identity, journal_identity];
    let journal = Journal::new(file, &journal_path, id, journal_bytes, checkpoint);
    let loaded = Loaded {
        live,
        next_seq,
        purged: expired.len() as u64,
        halted,
        replayed,
        torn,
        boot_open,
    };
    let store = Store {
        db,
        journal,
        pending: Vec::new(),
        pending_responses: HashMap::new(),
        pending_records: 0,
        unrecorded_len,
        files,
    };
    Ok((store, loaded))
}

fn record_boot_open(db: &Database, first: BootOpen) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    txn.open_table(META)?
        .insert(BOOT_OPEN, first.encode().as_slice())?;
    txn.set_durability(redb::Durability::Immediate)?;
    txn.commit()?;
    Ok(())
}

/// Makes a new database at `path`, and never a half-made one there. redb makes it under a
/// draft name beside it (`NAME.new-…`, one per attempt), and only a whole database is
/// linked into place; `open` then removes the draft's name. A first start that stops
/// midway (a full disk, a file-size limit, a crash) leaves nothing at `path`, where a
/// half-made file would read as a damaged database and fail closed until an operator
/// removed it. An attempt that fails removes its draft; a crash leaves it for the next
/// open.
///
/// A hard link never replaces: of two processes starting on one folder at once, the second
/// to link finds the first's database in place and redb's lock refuses it, or finds its
/// draft removed by the first and fails this attempt (the next one is refused by the lock).
/// redb's create at `path` itself, the file made first if it is not there (through a
/// symbolic link, its target) so that it is made 0600, as the draft is: redb's own create
/// follows the umask. One that is there keeps its mode.
fn in_place(builder: &redb::Builder, path: &Path) -> Result<Database, LoadError> {
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path);
    made.map_err(io)?;
    Ok(builder.create(path)?)
}

/// Where there is something at `path` already (an empty file left by 0.2.0 or older, a
/// symbolic link), or the file system has no hard links (FAT, many FUSE ones), the database
/// is made in place, as 0.2.0 did: redb's lock still keeps a second process out, but a
/// first start stopped midway leaves a file to remove by hand.
fn create(builder: &redb::Builder, path: &Path) -> Result<Database, LoadError> {
    if std::fs::symlink_metadata(path).is_ok() {
        return in_place(builder, path);
    }
    let n = getrandom::u64().map_err(|e| io(std::io::Error::other(e.to_string())))?;
    let draft = draft_name(path, n);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        // Whatever the umask: a database others may write can be replaced by an empty one,
        // which frees every live key at the next start.
        .mode(0o600)
        .open(&draft)
        .map_err(io)?;
    let made = FileBackend::new(file)
        .and_then(|backend| builder.create_with_backend(backend))
        .map(|db| (db, std::fs::hard_link(&draft, path)));
    if !matches!(made, Ok((_, Ok(())))) {
        // Never in place, so it never held a key.
        let _ = std::fs::remove_file(&draft);
    }
    match made? {
        (db, Ok(())) => {
            journal::sync_parent(path).map_err(io)?;
            Ok(db)
        }
        (db, Err(e)) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            drop(db);
            Ok(builder.open(path)?)
        }
        (db, Err(e))
            if matches!(
                e.raw_os_error(),
                Some(libc::EPERM | libc::EOPNOTSUPP | libc::ENOSYS)
            ) =>
        {
            drop(db);
            in_place(builder, path)
        }
        (_, Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Err(io(std::io::Error::new(
            e.kind(),
            format!(
                "{} was removed by another start on this folder",
                draft.display()
            ),
        ))),
        (_, Err(e)) => Err(io(e)),
    }
}

/// A draft of the database at `path`: `NAME.new-` and `n`, unique to its attempt, as 16
/// lowercase hex digits.
fn draft_name(path: &Path, n: u64) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".new-{n:016x}"));
    PathBuf::from(name)
}

/// Removes every draft of the database at `path`. One that another process is still making
/// only fails that process's attempt, which it makes again.
fn remove_drafts(path: &Path) {
    let Some(name) = path.file_name() else { return };
    let mut prefix = name.to_owned();
    prefix.push(".new-");
    let prefix = prefix.as_encoded_bytes();
    let Ok(entries) = std::fs::read_dir(journal::folder_of(path)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let is_draft = name
            .as_encoded_bytes()
            .strip_prefix(prefix)
            .is_some_and(|n| {
                n.len() == 16 && n.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            });
        if !is_draft {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            // Another start on this folder removed it first.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => log::warn!("mutex: cannot remove {}: {e}", entry.path().display()),
            Ok(()) => {}
        }
    }
}

fn io(e: std::io::Error) -> LoadError {
    LoadError::Db(redb::Error::Io(e))
}

/// A file's length; 0 when there is none. Anything but a file (a directory put in its
/// place) is an error that says so: its length is no file's.
fn bytes_at(path: &Path) -> std::io::Result<u64> {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(std::io::Error::other(format!(
            "{} is not a file but a {}: restore the file there",
            path.display(),
            if m.is_dir() { "folder" } else { "special file" }
        ))),
        Ok(m) => Ok(m.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

fn read_u64(meta: &Table<&str, &[u8]>, key: &'static str) -> Result<Option<u64>, LoadError> {
    let Some(v) = meta.get(key).map_err(redb::Error::from)? else {
        return Ok(None);
    };
    let bytes = <[u8; 8]>::try_from(v.value()).map_err(|_| LoadError::Meta {
        key,
        value: v.value().to_vec(),
    })?;
    Ok(Some(u64::from_le_bytes(bytes)))
}

/// The kill switch as persisted: `[0]` or `[1]`, absent when never set. Any other value is
/// damage, refused like a malformed number: read as "resumed", it would turn a halt off.
fn read_halted(meta: &Table<&str, &[u8]>) -> Result<bool, LoadError> {
    let Some(v) = meta.get(HALTED).map_err(redb::Error::from)? else {
        return Ok(false);
    };
    match v.value() {
        [0] => Ok(false),
        [1] => Ok(true),
        other => Err(LoadError::Meta {
            key: HALTED,
            value: other.to_vec(),
        }),
    }
}

/// Applies one journal record's operations to the tables, in order: the one way redb is
/// written, for a live batch and for a replay alike.
fn apply_ops(
    entries: &mut Table<u64, &[u8]>,
    meta: &mut Table<&str, &[u8]>,
    lsn: u64,
    payload: &[u8],
) -> Result<(), WriteError> {
    for op in journal::decode(lsn, payload)? {
        match op {
            Op::Put(seq, entry) => drop(entries.insert(seq, entry)?),
            Op::Del(seq) => drop(entries.remove(seq)?),
            Op::Halted(h) => drop(meta.insert(HALTED, [u8::from(h)].as_slice())?),
        }
    }
    Ok(())
}

/// Keeps a batch's record for the next checkpoint, and takes that checkpoint now if
/// `checkpoint` (the record did not fit in the journal). The batch is left empty, its
/// buffers kept for reuse.
pub(super) fn apply(
    store: &mut Store,
    batch: &mut Batch,
    checkpoint: bool,
) -> Result<(), WriteError> {
    let base = store.pending.len();
    for (seq, at) in batch.responses.drain(..) {
        store
            .pending_responses
            .insert(seq, at.start + base..at.end + base);
    }
    store.pending.extend_from_slice(&batch.record);
    store.pending_records += usize::from(!batch.record.is_empty());
    batch.record.clear();
    if checkpoint {
        self::checkpoint(store)?;
    }
    Ok(())
}

/// Applies everything kept since the last checkpoint to redb in one transaction committed
/// with `Durability::Immediate`, storing the journal's last lsn with it, after which the
/// journal starts over. Also what the owner does when idle and at shutdown.
pub(super) fn checkpoint(store: &mut Store) -> Result<(), WriteError> {
    let mut txn = store.db.begin_write()?;
    {
        let mut entries = txn.open_table(ENTRIES)?;
        let mut meta = txn.open_table(META)?;
        apply_ops(&mut entries, &mut meta, 0, &store.pending)?;
        meta.insert(CHECKPOINT, store.journal.last().to_le_bytes().as_slice())?;
        if let Some(len) = store.unrecorded_len {
            meta.insert(JOURNAL_LEN, len.to_le_bytes().as_slice())?;
        }
    }
    txn.set_durability(redb::Durability::Immediate)?;
    txn.commit()?;
    store.unrecorded_len = None;
    store.journal.checkpointed();
    store.pending.clear();
    store.pending_responses.clear();
    store.pending_records = 0;
    Ok(())
}

/// A batch's writes, as the journal record that will make them durable. Nothing touches
/// redb until a checkpoint: then [`apply_ops`], the function the replay at open uses too,
/// applies the very same records, so the journal and the tables cannot disagree.
#[derive(Default)]
pub(super) struct Batch {
    record: Vec<u8>,
    /// Where each entry this batch wrote with a response sits in `record`. Only those are
    /// ever looked up (`Live::has_response`), and a deleted entry never is (sequence
    /// numbers are not reused while the owner runs), so reserves and deletes, the hot
    /// path, record nothing here.
    responses: Vec<(u64, Range<usize>)>,
}

impl Batch {
    pub fn put(&mut self, seq: u64, e: &Entry) -> Result<(), WriteError> {
        let bytes = encode_entry(e);
        Op::Put(seq, &bytes).encode_into(&mut self.record)?;
        if e.response.is_some() {
            // postcard writes a byte slice last, as it is: the entry is the record's tail.
            let end = self.record.len();
            self.responses.push((seq, end - bytes.len()..end));
        }
        Ok(())
    }

    pub fn delete(&mut self, seq: u64) -> Result<(), WriteError> {
        Op::Del(seq).encode_into(&mut self.record)?;
        Ok(())
    }

    pub fn set_halted(&mut self, halted: bool) -> Result<(), WriteError> {
        Op::Halted(halted).encode_into(&mut self.record)?;
        Ok(())
    }

    /// The stored response of a live entry that has one, as this batch sees it: its own
    /// last write of that entry, else what earlier batches wrote since the checkpoint,
    /// else redb. None if it cannot be read (the duplicate is still a duplicate, only its
    /// replay is lost).
    pub fn response(&self, store: &Store, seq: u64) -> Option<Snapshot> {
        let bytes = match self.responses.iter().rev().find(|(s, _)| *s == seq) {
            Some((_, at)) => self.record.get(at.clone())?,
            None => match store.pending_responses.get(&seq) {
                Some(at) => store.pending.get(at.clone())?,
                None => {
                    let txn = store.db.begin_read().ok()?;
                    let got = txn.open_table(ENTRIES).ok()?.get(seq).ok()??;
                    return bounded(decode_entry(got.value()).ok()?.response);
                }
            },
        };
        bounded(decode_entry(bytes).ok()?.response)
    }

    /// The journal record's payload: every operation, in order. Empty if nothing changed.
    pub fn record(&self) -> &[u8] {
        &self.record
    }
}

/// A stored response, if no larger than [`super::MAX_RESPONSE`]: one a version before
/// 0.2.27 kept may be, and is not replayed.
fn bounded(response: Option<Snapshot>) -> Option<Snapshot> {
    response.filter(|s| s.body.len() <= super::MAX_RESPONSE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Entry {
        Entry {
            key: "client:a:live:order-1".into(),
            state: State::Committed,
            stored_at: 1_700_000_000_000,
            expires_at: 1_700_000_300_000,
            payload_hash: [7; 32],
            response: Some(Snapshot {
                status: 200,
                body: b"{\"success\":true}".to_vec(),
            }),
            boot_due: Some(BootTime {
                boot: 3,
                ms: 86_400_000,
            }),
        }
    }

    /// The bytes of `sample()` in each version, frozen (and fuzzing's seeds): a change to
    /// the format that would not read what is on disk fails here.
    const V1: &[u8] = include_bytes!("../../fuzz/seeds/entry_decode/v1-committed");
    const V2: &[u8] = include_bytes!("../../fuzz/seeds/entry_decode/v2-committed-boot");

    #[test]
    fn round_trips_and_starts_with_the_version() {
        let e = sample();
        let bytes = encode_entry(&e);
        assert_eq!(bytes[0], 1, "V2 is variant 1");
        assert_eq!(bytes, V2);
        assert_eq!(decode_entry(&bytes), Ok(e));
    }

    /// Entries written before boot deadlines are read as they were, without one: the
    /// bytes of `sample()` as the first version wrote them (`7cb1cfe~1`).
    #[test]
    fn a_first_version_entry_reads_without_a_boot_deadline() {
        let mut e = sample();
        e.boot_due = None;
        assert_eq!(decode_entry(V1), Ok(e));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_or_error_without_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)
        ) {
            let _ = decode_entry(&bytes);
        }

        #[test]
        fn any_entry_round_trips(
            key in "[ -~]{1,384}",
            committed: bool,
            stored_at: u64,
            expires_at: u64,
            hash: [u8; 32],
            response in proptest::option::of((100u16..600, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300))),
            boot_due: Option<(u32, u64)>,
        ) {
            let e = Entry {
                key,
                state: if committed { State::Committed } else { State::Pending },
                stored_at,
                expires_at,
                payload_hash: hash,
                response: response.map(|(status, body)| Snapshot { status, body }),
                boot_due: boot_due.map(|(boot, ms)| BootTime { boot, ms }),
            };
            proptest::prop_assert_eq!(decode_entry(&encode_entry(&e)), Ok(e));
        }
    }

    /// Appends a synced journal record of one put, as the owner writes a reserve's.
    fn append_put(store: &mut Store, seq: u64, e: &Entry) {
        let mut b = Batch::default();
        b.put(seq, e).unwrap();
        store.journal.append(b.record(), true).unwrap();
    }

    /// Two crashes in a row, the first one during a sync. The torn record's lsn is the
    /// next one the journal hands out after the reopen, so the records of the second life
    /// meet it again at the third open, unless the second open moved the checkpoint past it.
    #[test]
    fn a_torn_record_does_not_fail_the_open_after_a_second_crash() {
        use std::os::unix::fs::FileExt;
        const NOW: u64 = 1_700_000_000_000;
        const JOURNAL: usize = 16 * 4096;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        // Synced records of one reserve each, as the owner writes them, never checkpointed.
        let reserve = |store: &mut Store, seqs: Range<u64>| {
            for seq in seqs {
                let e = Entry {
                    key: format!("client:a:live:order-{seq}"),
                    state: State::Pending,
                    stored_at: NOW,
                    expires_at: NOW + 300_000,
                    payload_hash: [1; 32],
                    response: None,
                    boot_due: None,
                };
                append_put(store, seq, &e);
            }
        };
        let held = |loaded: &Loaded| loaded.live.iter().map(|(s, _)| *s).collect::<Vec<_>>();

        let (mut store, _) = open(&path, JOURNAL, Create::Yes, NOW, None, |_| false).unwrap();
        reserve(&mut store, 0..4);
        drop(store);
        // The crash came during the fourth record's sync: it is torn, never answered.
        let journal = std::fs::OpenOptions::new()
            .write(true)
            .open(journal::path_for(&path))
            .unwrap();
        journal.write_all_at(&[0xff], 3 * 4096 + 40).unwrap();

        let (mut store, loaded) = open(&path, JOURNAL, Create::Yes, NOW, None, |_| false).unwrap();
        assert_eq!(held(&loaded), [0, 1, 2]);
        // Named, for the owner to say: damage looks the same.
        assert_eq!(loaded.torn, Some(4));
        reserve(&mut store, 10..12);
        drop(store);

        let (_store, loaded) =
            open(&path, JOURNAL, Create::Yes, NOW, None, |_| false).expect("third open");
        assert_eq!(held(&loaded), [0, 1, 2, 10, 11]);
        assert_eq!(loaded.torn, None, "said once: the checkpoint moved past it");
    }

    /// A journal replaced by one of its length that holds no record of this database (here,
    /// zeros), beside a database whose checkpoint has moved, is refused: opened, it would
    /// replay nothing, and the keys of the records past the checkpoint would be forgotten.
    #[test]
    fn a_journal_of_zeros_beside_a_checkpointed_database_is_refused() {
        const NOW: u64 = 1_700_000_000_000;
        const JOURNAL: usize = 16 * 4096;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let record = |store: &mut Store, seq: u64| append_put(store, seq, &sample());
        let (mut store, _) = open(&path, JOURNAL, Create::Yes, NOW, None, |_| false).unwrap();
        record(&mut store, 0);
        drop(store);
        // The open replays it and moves the checkpoint; a record past it, then a crash.
        let (mut store, loaded) = open(&path, JOURNAL, Create::Yes, NOW, None, |_| false).unwrap();
        assert_eq!(loaded.live.len(), 1);
        record(&mut store, 1);
        drop(store);
        let journal = journal::path_for(&path);
        let len = std::fs::metadata(&journal).unwrap().len() as usize;
        std::fs::write(&journal, vec![0u8; len]).unwrap();
        match open(&path, JOURNAL, Create::Yes, NOW, None, |_| false) {
            Err(LoadError::Foreign { .. }) => {}
            Err(e) => panic!("refused, but not as foreign: {e}"),
            Ok((_, loaded)) => panic!("opened, holding {} keys", loaded.live.len()),
        }
    }

    /// Only a file that is not there reads as none: one that cannot be looked at (here, a
    /// path through a file) is an error, not a first start.
    #[test]
    fn a_state_file_that_cannot_be_looked_at_is_not_missing() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"1234").unwrap();
        assert_eq!(bytes_at(&file).unwrap(), 4);
        assert_eq!(bytes_at(&dir.path().join("none")).unwrap(), 0);
        assert!(bytes_at(&file.join("x")).is_err());
    }

    /// A folder where the journal was is said to be one: its length read as the journal's
    /// said the journal was cut short, by a copy or a repair.
    #[test]
    fn a_folder_for_the_journal_is_called_one() {
        const NOW: u64 = 1_700_000_000_000;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let (store, _) = open(&path, 16 * 4096, Create::Yes, NOW, None, |_| false).unwrap();
        drop(store);
        let journal = journal::path_for(&path);
        std::fs::remove_file(&journal).unwrap();
        std::fs::create_dir(&journal).unwrap();
        match open(&path, 16 * 4096, Create::Yes, NOW, None, |_| false) {
            Err(e) => assert!(e.to_string().contains("is not a file but a folder"), "{e}"),
            Ok(_) => panic!("opened a folder as the journal"),
        }
    }

    /// Damage the open must not read as "nothing there": a journal cut short (its tail's
    /// records lost, and no later record to name them), and a bookkeeping value of the
    /// wrong length (read as absent, a journal id would be made anew and the journal's
    /// records ignored; a checkpoint read as 0 would replay records of earlier laps).
    #[test]
    fn a_shortened_journal_or_a_malformed_meta_value_fails_the_open() {
        const NOW: u64 = 1_700_000_000_000;
        const JOURNAL: usize = 16 * 4096;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let open = || open(&path, JOURNAL, Create::Yes, NOW, None, |_| false);
        let (mut store, _) = open().unwrap();
        append_put(&mut store, 0, &sample());
        drop(store);
        let journal = journal::path_for(&path);
        let whole = std::fs::read(&journal).unwrap();

        std::fs::write(&journal, &whole[..4096]).unwrap();
        match open() {
            Err(LoadError::Shortened { found, was, .. }) => {
                assert_eq!((found, was), (4096, JOURNAL as u64));
            }
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("opened a journal cut short"),
        }
        std::fs::write(&journal, &whole).unwrap();
        let (store, loaded) = open().expect("restored");
        assert_eq!(loaded.live.len(), 1);
        drop(store);

        // Written as redb would let any process write it: through a plain open.
        let set = |key: &str, value: &[u8]| {
            let db = Database::open(&path).unwrap();
            let txn = db.begin_write().unwrap();
            let old = {
                let mut meta = txn.open_table(META).unwrap();
                let old = meta.get(key).unwrap().map(|v| v.value().to_vec());
                meta.insert(key, value).unwrap();
                old
            };
            txn.commit().unwrap();
            old.expect("the open wrote it")
        };
        for key in [JOURNAL_ID, CHECKPOINT, JOURNAL_LEN] {
            let good = set(key, &[0u8; 7]);
            match open() {
                Err(LoadError::Meta { key: k, value }) => assert_eq!((k, value.len()), (key, 7)),
                Err(e) => panic!("{key}: refused for another reason: {e}"),
                Ok(_) => panic!("{key}: opened"),
            }
            set(key, &good);
            let (_store, loaded) = open().expect("restored");
            assert_eq!(loaded.live.len(), 1, "{key}");
        }
        // A checkpoint past any record number (2^62): the next record's would wrap to 0,
        // under it, and be skipped at the open after.
        let good = set(CHECKPOINT, &u64::MAX.to_le_bytes());
        match open() {
            Err(LoadError::Meta { key, value }) => {
                assert_eq!((key, &value[..]), (CHECKPOINT, &u64::MAX.to_le_bytes()[..]));
            }
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("opened at a checkpoint past 2^62"),
        }
        set(CHECKPOINT, &good);
        assert_eq!(open().expect("restored").1.live.len(), 1);
        // The kill switch: a value no version writes is damage too, not "resumed".
        let put_halted = |value: &[u8]| {
            let db = Database::open(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(META).unwrap().insert(HALTED, value).unwrap();
            txn.commit().unwrap();
        };
        put_halted(&[1]);
        assert!(open().expect("halted").1.halted);
        for bad in [&[2u8][..], &[1, 0], &[]] {
            put_halted(bad);
            let e = open().err().unwrap_or_else(|| panic!("{bad:?}: opened"));
            // The value itself: "1 bytes" alone read as the right length.
            let hex: String = bad.iter().map(|b| format!("{b:02x}")).collect();
            assert!(e.to_string().contains(&format!("bytes: {hex})")), "{e}");
            match e {
                LoadError::Meta { key, value } => assert_eq!((key, &value[..]), (HALTED, bad)),
                e => panic!("{bad:?}: refused for another reason: {e}"),
            }
        }
        put_halted(&[0]);
        assert!(!open().expect("resumed").1.halted);
    }

    /// The first open in a boot is recorded once, and kept by every later open in that
    /// boot, whatever the wall clock says by then: an entry of the last boot is held to the
    /// deadline that first open's index gave it (`due_in_boot`), not purged by a wall clock
    /// stepped forward since. A new boot records its own; a value no version writes is
    /// refused, as any damaged bookkeeping is.
    #[test]
    fn the_first_open_in_a_boot_is_kept_for_that_boot() {
        const NOW: u64 = 1_700_000_000_000;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let at = |boot, ms| Some(BootTime { boot, ms });
        let open = |wall, boot| open(&path, 16 * 4096, Create::Yes, wall, boot, |_| false);
        let recorded = || {
            let db = Database::open(&path).unwrap();
            let txn = db.begin_read().unwrap();
            let meta = txn.open_table(META).unwrap();
            let v = meta.get(BOOT_OPEN).unwrap();
            v.map(|v| BootOpen::decode(v.value()).unwrap())
        };
        // Taken in boot 3, due at its 300 s by the wall clock.
        let mut e = sample();
        e.stored_at = NOW;
        e.expires_at = NOW + 300_000;
        let (mut store, loaded) = open(NOW, at(3, 1_000)).unwrap();
        let first3 = BootOpen {
            at: BootTime { boot: 3, ms: 1_000 },
            wall: NOW,
        };
        assert_eq!(loaded.boot_open, Some(first3));
        append_put(&mut store, 0, &e);
        drop(store);
        // No entry of another boot to hold: nothing recorded, the open wrote nothing.
        assert_eq!(recorded(), None);
        // Boot 4 comes back an hour behind: its first open holds the entry by the wall.
        let behind = NOW - 3_600_000;
        let (store, loaded) = open(behind, at(4, 5_000)).unwrap();
        let first4 = BootOpen {
            at: BootTime { boot: 4, ms: 5_000 },
            wall: behind,
        };
        assert_eq!(loaded.boot_open, Some(first4));
        assert_eq!(loaded.live.len(), 1);
        let due = due_in_boot(&loaded.live[0].1, Some(4), loaded.boot_open);
        assert_eq!(
            due,
            Some(5_000 + 300_000),
            "the TTL, not the wall's hour and more"
        );
        drop(store);
        assert_eq!(recorded(), Some(first4));
        // NTP steps the clock an hour forward; 10 s on, a restart in boot 4 keeps the
        // entry (its deadline is 295 s ahead on boot 4's clock) and the first open's record.
        let (store, loaded) = open(NOW + 10_000, at(4, 15_000)).unwrap();
        assert_eq!(loaded.boot_open, Some(first4));
        assert_eq!((loaded.live.len(), loaded.purged), (1, 0));
        drop(store);
        // Past that deadline, with the wall clock past its expiry too, it is purged.
        let (store, loaded) = open(NOW + 300_000, at(4, 305_000)).unwrap();
        assert_eq!((loaded.live.len(), loaded.purged), (0, 1));
        drop(store);
        // A reboot with nothing live records nothing new.
        assert_eq!(open(NOW + 400_000, at(5, 1)).unwrap().1.live.len(), 0);
        assert_eq!(recorded(), Some(first4));
        // Where the boot is not known, nothing is recorded or read.
        assert_eq!(open(NOW, None).unwrap().1.boot_open, None);
        // Damaged: refused, naming the value.
        {
            let db = Database::open(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(META)
                .unwrap()
                .insert(BOOT_OPEN, &[0u8; 19][..])
                .unwrap();
            txn.commit().unwrap();
        }
        match open(NOW, at(4, 1)) {
            Err(LoadError::Meta { key, value }) => assert_eq!((key, value.len()), (BOOT_OPEN, 19)),
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("opened"),
        }
    }

    /// The journal's length is recorded only by an open that writes anyway (a first open,
    /// or a checkpoint that moved): a database from before the length was kept opens with
    /// nothing written when there is nothing to replay, so a full disk does not stop it.
    #[test]
    fn the_journal_length_rides_a_write_the_open_makes_anyway() {
        const NOW: u64 = 1_700_000_000_000;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let open = || open(&path, 16 * 4096, Create::Yes, NOW, None, |_| false);
        let stored = || {
            let db = Database::open(&path).unwrap();
            let txn = db.begin_read().unwrap();
            let meta = txn.open_table(META).unwrap();
            meta.get(JOURNAL_LEN).unwrap().map(|v| v.value().to_vec())
        };
        drop(open().unwrap());
        assert_eq!(stored(), Some((16u64 * 4096).to_le_bytes().to_vec()));
        // As a database from before: no length, nothing to replay.
        {
            let db = Database::open(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(META).unwrap().remove(JOURNAL_LEN).unwrap();
            txn.commit().unwrap();
        }
        drop(open().unwrap());
        assert_eq!(
            stored(),
            None,
            "an open with nothing to replay wrote the length"
        );
        // A running checkpoint writes anyway: it records the length too.
        let (mut store, _) = open().unwrap();
        checkpoint(&mut store).unwrap();
        drop(store);
        assert_eq!(stored(), Some((16u64 * 4096).to_le_bytes().to_vec()));
        {
            let db = Database::open(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(META).unwrap().remove(JOURNAL_LEN).unwrap();
            txn.commit().unwrap();
        }
        // And so does an open whose checkpoint moves.
        let (mut store, _) = open().unwrap();
        append_put(&mut store, 0, &sample());
        drop(store);
        drop(open().unwrap());
        assert_eq!(stored(), Some((16u64 * 4096).to_le_bytes().to_vec()));
    }

    /// A restart in the boot that wrote an entry keeps it while its boot deadline is ahead,
    /// whatever the wall clock says; in another boot, or an unknown one, the wall clock
    /// decides alone. Each case opens its own copy of the same two files.
    #[test]
    fn an_entry_is_kept_while_its_boot_deadline_is_ahead_in_its_boot() {
        const NOW: u64 = 1_700_000_000_000;
        const HOUR: u64 = 3_600_000;
        const JOURNAL: usize = 16 * 4096;
        let (a, b) = (0xa, 0xb);
        let at = |boot, ms| Some(BootTime { boot, ms });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let (mut store, _) =
            open(&path, JOURNAL, Create::Yes, NOW, at(a, 1_000), |_| false).unwrap();
        let mut batch = Batch::default();
        let mut e = sample();
        e.expires_at = NOW + 300_000;
        e.boot_due = at(a, 301_000);
        batch.put(7, &e).unwrap();
        store.journal.append(batch.record(), true).unwrap();
        drop(store);

        let cases = [
            // Stepped an hour forward, ten seconds on: live by the boot clock.
            (NOW + HOUR, at(a, 11_000), true),
            (NOW + HOUR, at(a, 301_000), false),
            (NOW + HOUR, at(b, 11_000), false),
            (NOW + HOUR, None, false),
            // Another boot still keeps what the wall clock keeps.
            (NOW + 10_000, at(b, 11_000), true),
        ];
        for (n, (wall, boot, kept)) in cases.into_iter().enumerate() {
            let copy = dir.path().join(format!("copy{n}.redb"));
            std::fs::copy(&path, &copy).unwrap();
            std::fs::copy(journal::path_for(&path), journal::path_for(&copy)).unwrap();
            let (_store, loaded) = open(
                &copy,
                JOURNAL,
                Create::No("it was open"),
                wall,
                boot,
                |_| false,
            )
            .unwrap();
            let live: Vec<u64> = loaded.live.iter().map(|(seq, _)| *seq).collect();
            assert_eq!(live, if kept { vec![7] } else { vec![] }, "case {n}");
        }
    }

    /// A file of the database gone where one must be is refused, never made again empty:
    /// in its place, an empty one would forget every live key.
    #[test]
    fn a_lost_file_is_refused_not_made_again() {
        const NOW: u64 = 1_700_000_000_000;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let journal = journal::path_for(&path);
        let aside = |p: &Path| PathBuf::from(format!("{}.aside", p.display()));
        let open = |may_create: bool| {
            let create = if may_create {
                Create::Yes
            } else {
                Create::No("it was open")
            };
            open(&path, 16 * 4096, create, NOW, None, |_| false)
        };
        let refused = |r: Result<(Store, Loaded), LoadError>| match r {
            Err(LoadError::Missing { path, why, .. }) => (path, why),
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("opened"),
        };
        drop(open(true).expect("a first start creates both files"));

        std::fs::rename(&path, aside(&path)).unwrap();
        assert_eq!(refused(open(true)), (path.clone(), "its journal is there"));
        std::fs::write(&path, b"").unwrap();
        assert_eq!(refused(open(true)), (path.clone(), "its journal is there"));
        // With nothing left, only a process that never had it open starts afresh.
        assert!(found_a_file(&path), "the journal");
        std::fs::rename(&journal, aside(&journal)).unwrap();
        assert!(
            !found_a_file(&path),
            "an empty database file counts as none"
        );
        assert_eq!(refused(open(false)), (path.clone(), "it was open"));
        assert_eq!(bytes_at(&path).unwrap(), 0, "created again");
        assert!(!journal.exists(), "created again");

        std::fs::rename(aside(&path), &path).unwrap();
        let used = "the database has used it";
        assert_eq!(refused(open(true)), (journal.clone(), used));
        assert!(!journal.exists(), "created again");
        std::fs::write(&journal, b"").unwrap();
        assert_eq!(refused(open(true)), (journal.clone(), used));
        std::fs::rename(aside(&journal), &journal).unwrap();
        drop(open(false).expect("restored"));

        // A blank database in the place of the one whose journal holds a reserve.
        let (mut store, _) = open(false).unwrap();
        let mut batch = Batch::default();
        let e = Entry {
            state: State::Pending,
            expires_at: NOW + 300_000,
            ..sample()
        };
        batch.put(0, &e).unwrap();
        store.journal.append(batch.record(), true).unwrap();
        drop(store);
        std::fs::rename(&path, aside(&path)).unwrap();
        drop(Database::create(&path).unwrap());
        let journaled = "its journal holds records";
        assert_eq!(refused(open(false)), (path.clone(), journaled));
        std::fs::rename(aside(&path), &path).unwrap();
        let (_store, loaded) = open(false).expect("restored");
        assert_eq!(loaded.live.len(), 1, "the journal's reserve");
        let err = LoadError::missing(&journal, used, Some(&path)).to_string();
        assert!(
            err.contains("remove") && err.contains("m.redb too"),
            "{err}"
        );
        let err = LoadError::missing(&path, "it was open", None).to_string();
        assert!(err.contains("do not restart"), "{err}");
    }

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let entries = std::fs::read_dir(dir).unwrap();
        let mut names: Vec<_> = entries
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    /// A first start that stopped midway left its half-made database as a draft, never at
    /// the path: the next start makes it again there, and every draft (and only a draft) is
    /// gone; so is one a crash left as a second name. An empty file at the path, which 0.2.0
    /// and older leave, is made in place as they did.
    #[test]
    fn a_half_made_database_is_made_again_beside_the_path() {
        const NOW: u64 = 1_700_000_000_000;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let open = || open(&path, 16 * 4096, Create::Yes, NOW, None, |_| false);
        // What redb leaves when it stops after sizing the file: no magic number.
        let half_made = draft_name(&path, 0xab);
        std::fs::write(&half_made, vec![0u8; 73_728]).unwrap();
        let not_a_draft = [
            dir.path().join("m.redb.newer"),
            dir.path().join("m.redb.new-copy"),
            draft_name(&dir.path().join("n.redb"), 1),
        ];
        for p in &not_a_draft {
            std::fs::write(p, b"kept").unwrap();
        }
        let (store, loaded) = open().expect("made again");
        assert!(loaded.live.is_empty() && bytes_at(&path).unwrap() > 0);
        let kept = [
            "m.redb",
            "m.redb-journal",
            "m.redb.new-copy",
            "m.redb.newer",
            "n.redb.new-0000000000000001",
        ];
        assert_eq!(names(dir.path()), kept);
        // A crash between the link and the removal left the draft as a second name: the
        // next open removes the name, and the database stays.
        std::fs::hard_link(&path, draft_name(&path, 0xcd)).unwrap();
        drop(store);
        drop(open().expect("opened again"));
        assert_eq!(names(dir.path()), kept);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        std::fs::write(&path, b"").unwrap();
        drop(
            super::open(&path, 16 * 4096, Create::Yes, NOW, None, |_| false)
                .expect("made in place"),
        );
        assert_eq!(names(dir.path()), ["m.redb", "m.redb-journal"]);
    }

    /// Two first starts on one folder, released at the same moment (two threads: redb's
    /// lock refuses a second open in one process as in another), fifty times: each time one
    /// opens the database that is in place, the other is refused, and no draft is left.
    #[test]
    fn two_first_starts_at_once_make_one_database() {
        const NOW: u64 = 1_700_000_000_000;
        let mut refusals = std::collections::BTreeMap::<String, usize>::new();
        for trial in 0..50 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("m.redb");
            let start = std::sync::Barrier::new(2);
            let opened: Vec<_> = std::thread::scope(|scope| {
                let open = || {
                    start.wait();
                    open(&path, 16 * 4096, Create::Yes, NOW, None, |_| false)
                };
                let threads = [scope.spawn(open), scope.spawn(open)];
                threads.map(|t| t.join().unwrap()).into_iter().collect()
            });
            let mut stores = Vec::new();
            for r in opened {
                match r {
                    Ok((store, _)) => stores.push(store),
                    Err(e) => *refusals.entry(e.to_string()).or_default() += 1,
                }
            }
            assert_eq!(stores.len(), 1, "trial {trial}: {refusals:?}");
            for refused in refusals.keys() {
                let lock = refused.contains("another process has it open");
                let removed = refused.contains("was removed by another start on this folder");
                assert!(
                    lock || removed,
                    "trial {trial}: refused for another reason: {refused}"
                );
            }
            assert_eq!(
                names(dir.path()),
                ["m.redb", "m.redb-journal"],
                "trial {trial}"
            );
            // The database the winner opened is the one in place, not one without a name.
            let id = |db: &Database| {
                let txn = db.begin_read().unwrap();
                let meta = txn.open_table(META).unwrap();
                meta.get(JOURNAL_ID).unwrap().map(|v| v.value().to_vec())
            };
            let won = id(&stores[0].db);
            drop(stores);
            let (again, _) = open(
                &path,
                16 * 4096,
                Create::No("it was open"),
                NOW,
                None,
                |_| false,
            )
            .unwrap();
            assert_eq!(id(&again.db), won, "trial {trial}");
        }
    }

    /// The last entry number is taken: a damaged table, refused at the open rather than
    /// wrapped to 0, where the next reserve would overwrite entry 0.
    #[test]
    fn an_entry_at_the_last_number_fails_the_open() {
        const NOW: u64 = 1_700_000_000_000;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let (store, _) = open(&path, 16 * 4096, Create::Yes, NOW, None, |_| false).unwrap();
        let mut e = sample();
        e.expires_at = NOW + 300_000;
        let txn = store.db.begin_write().unwrap();
        txn.open_table(ENTRIES)
            .unwrap()
            .insert(u64::MAX, encode_entry(&e).as_slice())
            .unwrap();
        txn.commit().unwrap();
        drop(store);
        let err = open(&path, 16 * 4096, Create::Yes, NOW, None, |_| false)
            .err()
            .expect("opened");
        assert!(
            matches!(err, LoadError::Replay(WriteError::SeqExhausted)),
            "{err}"
        );
    }

    #[test]
    fn rejects_unknown_versions_truncation_and_trailing_bytes() {
        let bytes = encode_entry(&sample());
        let mut v3 = bytes.clone();
        v3[0] = 2;
        assert!(matches!(decode_entry(&v3), Err(DecodeError::Malformed(_))));
        for cut in 0..bytes.len() {
            assert!(decode_entry(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(decode_entry(&long), Err(DecodeError::Trailing(1)));
    }
}
