//! Idempotency keys: what the mutex locks.
//!
//! A [`Key`] is the exact string stored in redb. It is built only from parsed parts, so
//! a value of this type is always well formed: bounded length, printable ASCII, and
//! namespaced so that live and test, or two clients, can never collide.
//!
//! Two kinds exist (SPEC §2):
//! - client keys: `client:{identity}:{live|test}:{key}`, from the `Idempotency-Key`
//!   header or the body's `idempotencyKey`;
//! - fingerprints: `trade:{exchange}:{symbol}:{action}:{quantity}:{live|test}:{bucket}`,
//!   derived from the trade when the client sent no key. Exchange and symbol are
//!   percent-encoded beyond `[A-Za-z0-9._/-]` (`BINANCE:BTC` is `BINANCE%3ABTC`), so no
//!   two trades share a fingerprint through a `:` of their own.
//!
//! And one kind that guards them: `sig:{32 hex digits}`, the first half of a SHA-256 of a
//! request's HMAC signature, held beside the trade's key while the signature could be
//! replayed (`mutex::Guard`).

use std::fmt;

/// The longest client-supplied key (SPEC §2).
pub const MAX_CLIENT_KEY: usize = 255;
/// The longest client identity that may namespace a key.
pub const MAX_IDENTITY: usize = 64;
/// The longest stored key: a namespace plus the longest client key, with room to spare.
pub const MAX_KEY: usize = 384;
/// The namespace of signature guards.
pub const GUARD_PREFIX: &str = "sig:";
/// Width of a fingerprint's time bucket.
pub const BUCKET_MS: u64 = 60_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("idempotency key must be 1 to 255 characters")]
    Length,
    #[error("idempotency key must be printable ASCII")]
    Charset,
    /// It goes downstream in an `Idempotency-Key` header, namespaced (`client:psk:live:`
    /// before it), where a space at the end is trimmed away: `abc ` would reach the
    /// executor as the client order id of `abc`. One at the start the header's bare form
    /// trims (`Idempotency-Key:  abc` is `abc`), the body's `idempotencyKey` does not: a
    /// sender keying one delivery in the body and its retry in the header got two keys,
    /// and two orders. (SPEC §2 allows any printable ASCII.)
    #[error("idempotency key must not begin or end with a space")]
    Space,
    #[error("stored key is not a key this version wrote")]
    Stored,
}

/// Whether a trade is real money or a test run. Never share a key across the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Mode {
    Live,
    Test,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Live => "live",
            Mode::Test => "test",
        }
    }
}

/// A key exactly as the client sent it: 1–255 printable ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientKey(heapless::String<MAX_CLIENT_KEY>);

impl ClientKey {
    pub fn parse(s: &str) -> Result<Self, KeyError> {
        if s.is_empty() || s.len() > MAX_CLIENT_KEY {
            return Err(KeyError::Length);
        }
        if !s.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(KeyError::Charset);
        }
        if s.starts_with(' ') || s.ends_with(' ') {
            return Err(KeyError::Space);
        }
        // Length was checked above, so the push cannot overflow.
        let mut buf = heapless::String::new();
        buf.push_str(s).map_err(|_| KeyError::Length)?;
        Ok(ClientKey(buf))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The parts of a trade that make its automatic fingerprint. Built by the gateway from a
/// parsed trade, whose schema already bounds and restricts these strings.
#[derive(Debug, Clone, PartialEq)]
pub struct Fingerprint<'a> {
    pub exchange: &'a str,
    pub symbol: &'a str,
    pub action: &'a str,
    pub quantity: f64,
    pub mode: Mode,
}

/// `part` with every byte outside `[A-Za-z0-9._/-]` written `%XX`: unchanged for the
/// names most venues use, so their fingerprints read as they always did.
///
/// Not [`encode_key`](crate::admin::client::encode_key), whose set differs on purpose: here
/// `:` must be escaped, as it separates a fingerprint's fields, and `/` is kept
/// (`ETH/USDT`); there `/` must be escaped, as a key is one URL path segment, and `:` is
/// kept. Nor may this set change: a fingerprint is a stored key, so a trade resent across
/// an upgrade that changed it would get a new key, and be let through again.
fn escape(part: &str) -> std::borrow::Cow<'_, str> {
    let plain = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/' | b'-');
    if part.bytes().all(plain) {
        return part.into();
    }
    let mut out = String::with_capacity(part.len() * 3);
    for b in part.bytes() {
        if plain(b) {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push_str(&hex::encode_upper([b]));
        }
    }
    out.into()
}

/// A stored, namespaced idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(heapless::String<MAX_KEY>);

impl Key {
    /// A client's own key, namespaced by who sent it and in which mode.
    ///
    /// `identity` is at most [`MAX_IDENTITY`] by construction (`gateway::auth::Identity`),
    /// which keeps every key within [`MAX_KEY`]. It is never cut to fit: two identities cut
    /// to one would share their keys. A longer one only risks a `Length` refusal.
    pub fn client(identity: &str, mode: Mode, key: &ClientKey) -> Result<Self, KeyError> {
        Self::build(&["client:", identity, ":", mode.as_str(), ":", key.as_str()])
    }

    /// The automatic fingerprint of a trade in the minute bucket `bucket`
    /// (`floor(unix_ms / 60000)`).
    pub fn fingerprint(fp: &Fingerprint<'_>, bucket: u64) -> Result<Self, KeyError> {
        let quantity = canonical_quantity(fp.quantity);
        let bucket = bucket.to_string();
        Self::build(&[
            "trade:",
            &escape(fp.exchange),
            ":",
            &escape(fp.symbol),
            ":",
            fp.action,
            ":",
            &quantity,
            ":",
            fp.mode.as_str(),
            ":",
            &bucket,
        ])
    }

    /// The replay guard of a request signed with `mac` (the signature's 32 bytes): of the
    /// signature alone, whoever sends it. The same signed request replayed under another
    /// client certificate is the same guard, on purpose (docs/DESIGN.md); and so it is
    /// after a reload that names its secret's client otherwise, which moves the trade's
    /// key to another namespace (until 0.2.27 the name was in the guard too, and such a
    /// replay was placed again). Two secrets make the same signature by chance only.
    pub fn signature(mac: &[u8; 32]) -> Self {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(mac);
        let mut buf = heapless::String::new();
        // The prefix and 32 hex digits fit MAX_KEY many times over.
        let _ = buf.push_str(GUARD_PREFIX);
        let _ = buf.push_str(&hex::encode(&digest[..16]));
        Key(buf)
    }

    /// Whether this is a signature guard's key.
    pub fn is_guard(&self) -> bool {
        is_guard(&self.0)
    }

    /// Rebuilds a key read back from the table. Anything this version could not have
    /// written is refused rather than trusted.
    pub fn from_stored(s: &str) -> Result<Self, KeyError> {
        let guard = s.strip_prefix(GUARD_PREFIX).is_some_and(|h| {
            h.len() == 32 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        });
        if !(s.starts_with("client:") || s.starts_with("trade:") || guard) {
            return Err(KeyError::Stored);
        }
        Self::build(&[s])
    }

    fn build(parts: &[&str]) -> Result<Self, KeyError> {
        let mut buf = heapless::String::new();
        for p in parts {
            if !p.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
                return Err(KeyError::Charset);
            }
            buf.push_str(p).map_err(|_| KeyError::Length)?;
        }
        Ok(Key(buf))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether a stored key, held as text, is a signature guard's: the one check behind
/// [`Key::is_guard`], for callers that keep the string rather than the `Key`.
pub fn is_guard(stored: &str) -> bool {
    stored.starts_with(GUARD_PREFIX)
}

/// For a fingerprint's key, the key without its minute bucket: what every minute of the
/// same trade shares. `None` for any other key.
pub fn family(stored: &str) -> Option<&str> {
    stored.strip_prefix("trade:")?;
    stored.rsplit_once(':').map(|(family, _bucket)| family)
}

/// The minute bucket of a unix time.
pub fn bucket_of(unix_ms: u64) -> u64 {
    unix_ms / BUCKET_MS
}

/// Canonical decimal form of a quantity: 1, 1.0 and 1.00 are the same trade.
///
/// Rust prints an `f64` in its shortest round-trip form, without exponent and without
/// trailing zeros, which is exactly the canonical form we want.
pub fn canonical_quantity(q: f64) -> String {
    format!("{q}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_family_is_its_key_without_the_minute() {
        let fp = Fingerprint {
            exchange: "x:1",
            symbol: "BTC",
            action: "LONG",
            quantity: 1.0,
            mode: Mode::Live,
        };
        let at = |b| Key::fingerprint(&fp, b).unwrap();
        assert_eq!(family(at(7).as_str()), Some("trade:x%3A1:BTC:LONG:1:live"));
        assert_eq!(family(at(7).as_str()), family(at(123_456).as_str()));
        let other = Fingerprint {
            quantity: 2.0,
            ..fp
        };
        assert_ne!(
            family(at(7).as_str()),
            family(Key::fingerprint(&other, 7).unwrap().as_str())
        );
        let client = Key::client("psk", Mode::Live, &ClientKey::parse("a:b").unwrap()).unwrap();
        assert_eq!(family(client.as_str()), None);
        assert_eq!(family(Key::signature(&[1; 32]).as_str()), None);
    }

    #[test]
    fn client_keys_are_bounded_and_printable() {
        assert!(ClientKey::parse("abc-123").is_ok());
        assert_eq!(ClientKey::parse(""), Err(KeyError::Length));
        assert_eq!(ClientKey::parse(&"a".repeat(256)), Err(KeyError::Length));
        assert!(ClientKey::parse(&"a".repeat(255)).is_ok());
        assert_eq!(ClientKey::parse("tab\there"), Err(KeyError::Charset));
        assert_eq!(ClientKey::parse("é"), Err(KeyError::Charset));
        assert!(ClientKey::parse("a b").is_ok());
        for edge in [" ", "abc ", " abc ", " abc"] {
            assert_eq!(ClientKey::parse(edge), Err(KeyError::Space), "{edge:?}");
        }
    }

    #[test]
    fn namespaces_never_collide() {
        let k = ClientKey::parse("order-1").unwrap();
        let a = Key::client("alice", Mode::Live, &k).unwrap();
        let b = Key::client("alice", Mode::Test, &k).unwrap();
        let c = Key::client("bob", Mode::Live, &k).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn a_signature_guard_is_its_own_namespace() {
        let g = Key::signature(&[7; 32]);
        assert!(g.is_guard() && g.as_str().starts_with("sig:"));
        assert_eq!(g.as_str().len(), 4 + 32);
        assert_ne!(g, Key::signature(&[8; 32]));
        assert!(
            !Key::from_stored("trade:x:S:LONG:1:live:1")
                .unwrap()
                .is_guard()
        );
        assert_eq!(Key::from_stored(g.as_str()).unwrap(), g);
        for bad in [
            "sig:",
            "sig:xyz",
            "sig:0123456789ABCDEF0123456789abcdef",
            &format!("{g}0"),
        ] {
            assert_eq!(Key::from_stored(bad), Err(KeyError::Stored), "{bad}");
        }
    }

    #[test]
    fn quantity_is_canonical() {
        assert_eq!(canonical_quantity(1.0), "1");
        assert_eq!(canonical_quantity(1.00), canonical_quantity(1.0));
        assert_eq!(canonical_quantity(0.5), "0.5");
        assert_eq!(canonical_quantity(1e6), "1000000");
        assert_eq!(canonical_quantity(0.0000001), "0.0000001");
    }

    /// The fingerprint of one LONG of 1, live, on `exchange` and `symbol`, in `bucket`.
    fn long(exchange: &str, symbol: &str, bucket: u64) -> Key {
        let fp = Fingerprint {
            exchange,
            symbol,
            action: "LONG",
            quantity: 1.0,
            mode: Mode::Live,
        };
        Key::fingerprint(&fp, bucket).unwrap()
    }

    #[test]
    fn fingerprint_has_the_spec_shape() {
        let k = long("binance", "BTCUSDT", bucket_of(120_000));
        assert_eq!(k.as_str(), "trade:binance:BTCUSDT:LONG:1:live:2");
        assert_eq!(Key::from_stored(k.as_str()).unwrap(), k);
        assert!(Key::from_stored("other:x").is_err());
    }

    #[test]
    fn a_colon_of_the_trade_cannot_shift_the_fingerprint() {
        let key = |exchange, symbol| long(exchange, symbol, 2);
        assert_ne!(key("a", "b:c"), key("a:b", "c"));
        assert_ne!(key("a", "b%3Ac"), key("a", "b:c"));
        assert_eq!(
            key("binance", "BINANCE:BTCUSDT").as_str(),
            "trade:binance:BINANCE%3ABTCUSDT:LONG:1:live:2"
        );
        assert_eq!(
            key("cme", "ES1!").as_str(),
            "trade:cme:ES1%21:LONG:1:live:2"
        );
        assert_eq!(
            key("okx", "ETH/USDT-PERP").as_str(),
            "trade:okx:ETH/USDT-PERP:LONG:1:live:2"
        );
    }
}
