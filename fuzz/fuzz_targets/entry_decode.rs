//! A stored entry read back from redb: any bytes must decode or be refused, never panic.
//! `decode_entry` comes with the mutex engineer's branch.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = hoox_edge::mutex::decode_entry(data);
});
