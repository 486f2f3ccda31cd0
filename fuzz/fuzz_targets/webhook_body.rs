//! The webhook body, from raw bytes to what is hashed and forwarded.
#![no_main]

use bytes::Bytes;
use hoox_edge::gateway::trade::{Trade, body_api_key, parse_object};
use hoox_edge::mutex::Key;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(obj) = parse_object(Bytes::copy_from_slice(data)) else {
        return;
    };
    let api_key_given = obj.members().contains_key("apiKey");
    let _ = body_api_key(&obj);
    let Ok(trade) = Trade::from_object(obj) else {
        return;
    };
    let hash = trade.payload_hash();
    let fwd = trade.forward_body();

    // The credential never travels on.
    let sent = parse_object(fwd.clone()).expect("the forwarded body is a JSON object");
    assert!(!sent.members().contains_key("apiKey"));
    // Without the credential, the sender's bytes go on as they came.
    if !api_key_given {
        assert_eq!(fwd, data, "a body without apiKey was written again");
    }
    // What the executor receives is the same trade.
    let again = Trade::from_object(sent).expect("the forwarded body is a valid trade");
    assert_eq!(again.payload_hash(), hash, "forwarding changed the trade");
    // Any valid trade makes a well-formed fingerprint key.
    Key::fingerprint(&trade.fingerprint(), u64::MAX).expect("fingerprint fits a key");
});
