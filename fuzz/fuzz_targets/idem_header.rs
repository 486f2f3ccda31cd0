//! The Idempotency-Key header, alone and as `resolve` weighs it against the body's key.
//! The input is the header's bytes, then optionally 0xff and the body's key.
#![no_main]

use hoox_edge::gateway::idem::{parse_header, resolve};
use hyper::header::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (header, body) = match data.iter().position(|&b| b == 0xff) {
        Some(i) => (&data[..i], std::str::from_utf8(&data[i + 1..]).ok()),
        None => (data, None),
    };
    let parsed = parse_header(header);
    if let Ok(key) = &parsed {
        let s = key.as_str();
        assert!((1..=255).contains(&s.len()));
        assert!(s.bytes().all(|b| (0x20..=0x7e).contains(&b)));
        // Any accepted key, written back as an sf-string, reads the same.
        let quoted = format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
        assert_eq!(
            parse_header(quoted.as_bytes()).as_ref().ok(),
            Some(key),
            "re-quoted key"
        );
    }
    // A key that resolves is one both sources agree on: never one of them alone when the
    // other was given, and never a header that would not parse by itself.
    let Ok(value) = HeaderValue::from_bytes(header) else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert("idempotency-key", value);
    if let Ok(Some(k)) = resolve(&headers, None, body) {
        assert_eq!(parsed.as_ref().ok(), Some(&k));
        if let Some(b) = body {
            assert_eq!(hoox_edge::mutex::ClientKey::parse(b).ok(), Some(k));
        }
    }
});
