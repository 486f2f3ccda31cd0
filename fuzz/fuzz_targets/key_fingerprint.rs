//! Keys: client keys under every identity, fingerprints, and keys read back from disk.
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
}

fuzz_target!(|i: Input<'_>| {
    let mode = if i.test { Mode::Test } else { Mode::Live };
    if let Ok(ck) = ClientKey::parse(i.client_key) {
        let id = match i.cert_cn {
            Some(cn) => Identity::cert(cn),
            None => Identity::psk(),
        };
        let k = Key::client(id.as_str(), mode, &ck).expect("a client key always fits");
        assert_eq!(
            k.public(),
            ck.as_str(),
            "public() must give back the client's key"
        );
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
        assert_eq!(k.public(), k.as_str());
    }
    if let Ok(k) = Key::from_stored(i.stored) {
        assert_eq!(k.as_str(), i.stored);
        let _ = k.public();
    }
});
