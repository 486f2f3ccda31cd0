//! redb tables and the versioned postcard entry.
//!
//! Two tables: `entries` maps a sequence number to an encoded [`Entry`] (which carries its
//! key); `meta` holds the kill switch. The table holds live keys only: the owner deletes
//! what expires, so the file stays the size of the working set.
//!
//! Why a sequence number and not the idempotency key as the table key: keys arrive in
//! random order, so a batch of N reserves keyed by key dirties ~N B-tree leaves, and the
//! group commit writes (and fsyncs) N pages. Keyed by an increasing sequence, the batch
//! appends to the last leaf or two; commits and releases touch recent entries (the same
//! few leaves) and expiries delete from the oldest end. The lookup by key never needs the
//! table: the owner's in-memory index maps key → sequence.
//!
//! An entry on disk is a postcard enum whose variant index is the format version. postcard
//! writes that index as the first varint, so a later version adds `V2` and still reads
//! every `V1` ever written; nothing else in the format needs to change to evolve it.

use std::path::Path;

use redb::{Database, ReadableTable, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};

use super::{PayloadHash, Snapshot, State};

pub(super) const ENTRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("entries");
pub(super) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const HALTED: &str = "halted";

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
}

/// The format on disk. The variant index is the version; never reorder or remove one.
#[derive(Deserialize)]
enum Versioned {
    V1(Entry),
}

/// The writing side of [`Versioned`]: the same bytes, without cloning the entry.
#[derive(Serialize)]
enum VersionedRef<'a> {
    V1(&'a Entry),
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
        Versioned::V1(e) => Ok(e),
    }
}

/// Encodes an entry in the current version.
pub fn encode_entry(e: &Entry) -> Vec<u8> {
    // Serialising a plain struct into a Vec cannot fail: postcard only errors on a full
    // fixed buffer or on types it does not support (maps of unknown length), neither here.
    postcard::to_stdvec(&VersionedRef::V1(e)).unwrap_or_default()
}

/// Opens (or creates) the database file. Integrity is checked on every open: a plain
/// redb open trusts the file and may panic on one damaged outside redb, and a panic in
/// the owner would take the process down instead of failing closed.
pub(super) fn open(path: &Path) -> Result<Database, redb::Error> {
    Ok(Database::builder()
        .set_cache_size(CACHE_BYTES)
        .set_check_integrity_on_open(true)
        .create(path)?)
}

/// What a scan at open finds.
pub(super) struct Loaded {
    /// `(sequence, entry)` in sequence order.
    pub live: Vec<(u64, Entry)>,
    /// The next sequence number to use.
    pub next_seq: u64,
    pub purged: u64,
    pub halted: bool,
}

/// Why the table cannot be trusted at open.
#[derive(Debug, thiserror::Error)]
pub(super) enum LoadError {
    #[error(transparent)]
    Db(#[from] redb::Error),
    /// A record this version cannot read might be a live reservation: refuse to serve
    /// rather than forget it.
    #[error("entry #{seq} cannot be read: {err}")]
    Entry { seq: u64, err: DecodeError },
}

/// Reads every entry, deletes those expired at `now_wall`, and commits durably, so the
/// file holds only live keys from here on.
pub(super) fn load(db: &Database, now_wall: u64) -> Result<Loaded, LoadError> {
    let txn = db.begin_write().map_err(redb::Error::from)?;
    let mut live = Vec::new();
    let mut expired = Vec::new();
    let mut next_seq = 0;
    let halted;
    {
        let entries = txn.open_table(ENTRIES).map_err(redb::Error::from)?;
        for row in entries.iter().map_err(redb::Error::from)? {
            let (k, v) = row.map_err(redb::Error::from)?;
            let seq = k.value();
            next_seq = seq + 1;
            let entry = decode_entry(v.value()).map_err(|err| LoadError::Entry { seq, err })?;
            if entry.expires_at <= now_wall {
                expired.push(seq);
            } else {
                live.push((seq, entry));
            }
        }
        let meta = txn.open_table(META).map_err(redb::Error::from)?;
        halted = meta
            .get(HALTED)
            .map_err(redb::Error::from)?
            .is_some_and(|v| v.value() == [1]);
    }
    {
        let mut entries = txn.open_table(ENTRIES).map_err(redb::Error::from)?;
        for seq in &expired {
            entries.remove(seq).map_err(redb::Error::from)?;
        }
    }
    txn.commit().map_err(redb::Error::from)?;
    Ok(Loaded {
        live,
        next_seq,
        purged: expired.len() as u64,
        halted,
    })
}

pub(super) fn set_halted(txn: &WriteTransaction, halted: bool) -> Result<(), redb::Error> {
    txn.open_table(META)?
        .insert(HALTED, [u8::from(halted)].as_slice())?;
    Ok(())
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
        }
    }

    #[test]
    fn round_trips_and_starts_with_the_version() {
        let e = sample();
        let bytes = encode_entry(&e);
        assert_eq!(bytes[0], 0, "V1 is variant 0");
        assert_eq!(decode_entry(&bytes), Ok(e));
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
        ) {
            let e = Entry {
                key,
                state: if committed { State::Committed } else { State::Pending },
                stored_at,
                expires_at,
                payload_hash: hash,
                response: response.map(|(status, body)| Snapshot { status, body }),
            };
            proptest::prop_assert_eq!(decode_entry(&encode_entry(&e)), Ok(e));
        }
    }

    #[test]
    fn rejects_unknown_versions_truncation_and_trailing_bytes() {
        let bytes = encode_entry(&sample());
        let mut v2 = bytes.clone();
        v2[0] = 1;
        assert!(matches!(decode_entry(&v2), Err(DecodeError::Malformed(_))));
        for cut in 0..bytes.len() {
            assert!(decode_entry(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(decode_entry(&long), Err(DecodeError::Trailing(1)));
    }
}
