//! What the mutex reads back from disk: any bytes must decode or be refused, never panic,
//! and whatever decodes must encode back to the same value (else a checkpoint would store
//! something else than the journal said). The same bytes are tried as a stored entry, as
//! one journal record's operations, and as a journal file (scan, then decode every record
//! found).
#![no_main]

use hoox_edge::mutex::{decode_entry, encode_entry, journal};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(e) = decode_entry(data) {
        assert_eq!(decode_entry(&encode_entry(&e)).ok(), Some(e));
    }
    // A record's payload, reached directly: through `scan` only bytes whose crc holds get
    // this far, which the fuzzer can seldom forge.
    if let Ok(ops) = journal::decode(1, data) {
        let mut again = Vec::new();
        for op in &ops {
            op.encode_into(&mut again)
                .expect("encoding into a Vec cannot fail");
        }
        assert_eq!(journal::decode(1, &again).ok(), Some(ops));
    }
    // As the journal of the database whose id the first slot names (bytes 4..12 of a
    // header): its records whose crc holds are taken, at a checkpoint of 0.
    let id = data
        .get(4..12)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes);
    if let Ok(found) = journal::scan(data, id, 0) {
        for (lsn, payload) in found.records {
            let _ = journal::decode(lsn, payload);
        }
    }
});
