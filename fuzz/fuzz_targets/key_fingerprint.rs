//! Keys: client keys under every identity, fingerprints, signature guards, and keys read
//! back from disk.
#![no_main]

use arbitrary::Arbitrary;
use hoox_edge::gateway::auth::Identity;
use hoox_edge::mutex::{ClientKey, Fingerprint, Key, Mode};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    client_key: &'a str,
    cert_cn: Option<&'a str>,
    test: bool,
    exchange: &'a str,
    symbol: &'a str,
    action: &'a str,
    quantity: f64,
    bucket: u64,
    stored: &'a str,
    mac: [u8; 32],
}

/// `%XX` back to its byte (the escape is uppercase hex, and `%` itself is escaped).
fn unescape(part: &str) -> Vec<u8> {
    let b = part.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).expect("escape is ASCII");
            out.push(u8::from_str_radix(hex, 16).expect("escape is hex"));
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fuzz_target!(|i: Input<'_>| {
    let mode = if i.test { Mode::Test } else { Mode::Live };
    if let Ok(ck) = ClientKey::parse(i.client_key) {
        let id = match i.cert_cn {
            Some(cn) => Identity::cert(cn),
            None => Identity::psk(),
        };
        let k = Key::client(id.as_str(), mode, &ck).expect("a client key always fits");
        // The namespace is exactly identity and mode: nothing in either can shift it.
        assert_eq!(
            k.as_str(),
            format!("client:{}:{}:{}", id.as_str(), mode.as_str(), ck.as_str())
        );
        assert!(!id.as_str().contains(':'), "an identity must not contain ':'");
        assert_eq!(Key::from_stored(k.as_str()).as_ref(), Ok(&k));
    }
    let fp = Fingerprint {
        exchange: i.exchange,
        symbol: i.symbol,
        action: i.action,
        quantity: i.quantity,
        mode,
    };
    if let Ok(k) = Key::fingerprint(&fp, i.bucket) {
        assert_eq!(Key::from_stored(k.as_str()).as_ref(), Ok(&k));
        assert!(k.as_str().starts_with("trade:"));
        // Exchange and symbol are escaped: whatever they hold, the key keeps its seven
        // parts (the action is the gateway's own word, never a client's `:`).
        // And they come back whole, so no two trades share a fingerprint.
        if !i.action.contains(':') {
            let parts: Vec<&str> = k.as_str().split(':').collect();
            assert_eq!(parts.len(), 7, "{}", k.as_str());
            assert_eq!(unescape(parts[1]), i.exchange.as_bytes());
            assert_eq!(unescape(parts[2]), i.symbol.as_bytes());
        }
    }
    // A guard is its own namespace, and comes back from disk whole.
    let g = Key::signature(&i.mac);
    assert!(g.is_guard());
    assert_eq!(Key::from_stored(g.as_str()).as_ref(), Ok(&g));
    if let Ok(k) = Key::from_stored(i.stored) {
        assert_eq!(k.as_str(), i.stored);
        assert_eq!(k.is_guard(), i.stored.starts_with("sig:"));
    }
});
