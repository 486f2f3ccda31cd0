//! The Idempotency-Key header.
#![no_main]

use hoox_edge::gateway::idem::parse_header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(key) = parse_header(data) else { return };
    let s = key.as_str();
    assert!((1..=255).contains(&s.len()));
    assert!(s.bytes().all(|b| (0x20..=0x7e).contains(&b)));
    // Any accepted key, written back as an sf-string, reads the same.
    let quoted = format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    assert_eq!(
        parse_header(quoted.as_bytes()).expect("re-quoted key parses"),
        key
    );
});
