//! What the mutex reads back from disk: any bytes must decode or be refused, never panic.
//! The same bytes are tried as a stored entry and as a journal file (scan, then decode
//! every record found).
#![no_main]

use hoox_edge::mutex::journal;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = hoox_edge::mutex::decode_entry(data);
    // An id and checkpoint of 0 accept any record whose crc holds.
    if let Ok(found) = journal::scan(data, 0, 0) {
        for (lsn, payload) in found.records {
            let _ = journal::decode(lsn, payload);
        }
    }
});
