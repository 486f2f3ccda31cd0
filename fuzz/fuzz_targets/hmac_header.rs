//! Authentication with arbitrary headers: nothing forged gets in, a genuine signature does.
#![no_main]

use arbitrary::Arbitrary;
use hoox_edge::gateway::auth::{
    AuthInput, Authenticator, Method, SIGNATURE_HEADER, TIMESTAMP_HEADER, parse_signature_header,
    sign,
};
use hoox_edge::secrets::Secret;
use hyper::HeaderMap;
use hyper::header::{HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

const HMAC: &[u8] = b"hmac-secret";
const API: &str = "api-secret";
const BEARER: &str = "bearer-secret";

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    headers: Vec<(u8, &'a [u8])>,
    body_api_key: Option<&'a str>,
    body: &'a [u8],
    cn: Option<&'a str>,
    now: i64,
    methods: u8,
    sig: &'a str,
}

fn name(sel: u8) -> HeaderName {
    match sel % 5 {
        0 => HeaderName::from_static(TIMESTAMP_HEADER),
        1 => HeaderName::from_static(SIGNATURE_HEADER),
        2 => hyper::header::AUTHORIZATION,
        3 => HeaderName::from_static("idempotency-key"),
        _ => HeaderName::from_static("x-other"),
    }
}

fuzz_target!(|i: Input<'_>| {
    let _ = parse_signature_header(i.sig);

    let mut headers = HeaderMap::new();
    for (sel, v) in &i.headers {
        if let Ok(v) = HeaderValue::from_bytes(v) {
            headers.append(name(*sel), v);
        }
    }
    // Only HMAC configured: the fuzzer does not know the secret, so nothing it makes up
    // may pass, unless it is the genuine signature of this body at this time.
    let hmac_only =
        Authenticator::new(vec![], vec![Secret::new(HMAC)], vec![], false, vec![]).unwrap();
    let input = AuthInput {
        headers: &headers,
        body_api_key: i.body_api_key,
        raw_body: i.body,
        client_cert_name: i.cn,
        now_unix_s: i.now,
    };
    if hmac_only.authenticate(&input).is_ok() {
        let ts = headers[TIMESTAMP_HEADER].to_str().unwrap().trim();
        let sig = parse_signature_header(headers[SIGNATURE_HEADER].to_str().unwrap()).unwrap();
        let genuine = parse_signature_header(&sign(HMAC, ts.parse().unwrap(), i.body)).unwrap();
        assert_eq!(sig, genuine, "a forged signature was accepted");
    }

    // Every method, some of them required.
    let required: Vec<Method> = Method::ALL
        .into_iter()
        .enumerate()
        .filter(|(n, _)| i.methods & (1 << n) != 0)
        .map(|(_, m)| m)
        .collect();
    let all = Authenticator::new(
        vec![Secret::new(API)],
        vec![Secret::new(HMAC)],
        vec![Secret::new(BEARER)],
        true,
        required,
    )
    .unwrap();
    if let Ok(ok) = all.authenticate(&input) {
        let id = ok.identity.as_str();
        assert!(id.len() <= 64 && !id.contains(':'));
        // A signature is reported only when it verified.
        if let Some(sig) = ok.signature {
            let genuine = sign(HMAC, sig.timestamp, i.body);
            assert_eq!(Ok(sig.mac), parse_signature_header(&genuine));
        }
    }

    // The genuine signature of this body, now, always passes.
    let now = i.now.clamp(0, 999_999_999_999);
    let mut good = HeaderMap::new();
    good.insert(TIMESTAMP_HEADER, HeaderValue::from(now));
    good.insert(
        SIGNATURE_HEADER,
        HeaderValue::try_from(sign(HMAC, now, i.body)).unwrap(),
    );
    let ok = AuthInput {
        headers: &good,
        now_unix_s: now,
        ..input
    };
    let signed = hmac_only
        .authenticate(&ok)
        .expect("a genuine signature was refused");
    // And it is reported, for the replay guard, as signed.
    let sig = signed.signature.expect("a verified signature was not reported");
    assert_eq!(sig.timestamp, now);
    assert_eq!(Ok(sig.mac), parse_signature_header(&sign(HMAC, now, i.body)));
});
