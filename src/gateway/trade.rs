//! The trade payload (SPEC §3): parsed in two steps because of the order of checks.
//!
//! [`parse_object`] runs before authentication and only says whether the body is a JSON
//! object (400 otherwise), so that an unauthenticated caller learns nothing about its
//! trade's validity. [`Trade::from_object`] runs after authentication and enforces the
//! schema, naming the first field that is wrong.
//!
//! Exchange and symbol are printable ASCII without spaces: venues name instruments
//! `ES1!`, `BRK.B` or `BINANCE:BTCUSDT`. They become parts of the fingerprint key
//! `trade:{exchange}:{symbol}:{action}:…`, where `Key::fingerprint` percent-encodes
//! anything beyond `[A-Za-z0-9._/-]`, the `:` that separates the parts among it.

use bytes::Bytes;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::mutex::key::canonical_quantity;
use crate::mutex::{Fingerprint, Mode, PayloadHash};

pub const MAX_EXCHANGE: usize = 32;
pub const MAX_SYMBOL: usize = 20;
pub const MAX_QUANTITY: f64 = 1e6;
/// Longest canonical quantity. Bounds the fingerprint key, and refuses absurd precision
/// such as 1e-300, whose decimal form alone would be 300 characters.
pub const MAX_QUANTITY_CHARS: usize = 24;
pub const MAX_LEVERAGE: u64 = 125;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TradeError {
    #[error("body is not valid JSON: {0}")]
    Json(String),
    #[error("body must be a JSON object")]
    NotObject,
    #[error("field `{field}` {problem}")]
    Field {
        field: &'static str,
        problem: &'static str,
    },
    /// A body `idempotencyKey` that is not a string (`null` included): a key the sender
    /// meant to give and did not, so never a silent fallback to the fingerprint (SPEC §2).
    #[error("body idempotencyKey must be a string")]
    KeyNotAString,
}

impl From<TradeError> for super::problem::Problem {
    fn from(e: TradeError) -> Self {
        match e {
            TradeError::KeyNotAString => Self::InvalidIdempotencyKey(e.to_string()),
            _ => Self::InvalidRequest(e.to_string()),
        }
    }
}

fn field(field: &'static str, problem: &'static str) -> TradeError {
    TradeError::Field { field, problem }
}

/// A body that parsed as one JSON object: its members, and its bytes as received, which
/// are what the executor gets, less the credential ([`Trade::forward_body`]).
pub struct Object {
    members: Map<String, Value>,
    raw: Received,
}

impl Object {
    pub fn members(&self) -> &Map<String, Value> {
        &self.members
    }
}

/// The body's bytes. Its `Debug` shows only their length: they may hold the credential.
#[derive(Clone)]
struct Received(Bytes);

impl std::fmt::Debug for Received {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{} bytes", self.0.len())
    }
}

/// Parses the body as one JSON object. A member given twice, at any depth, is refused:
/// which of the two counts would otherwise depend on the parser, here and downstream. So
/// is a member whose name holds a control character (`"quantity\u0000"`): a parser of
/// C strings reads it as the name before the NUL, another field than the one checked here.
pub fn parse_object(body: Bytes) -> Result<Object, TradeError> {
    match serde_json::from_slice::<Strict>(&body) {
        Ok(Strict(Value::Object(members))) => Ok(Object {
            members,
            raw: Received(body),
        }),
        Ok(_) => Err(TradeError::NotObject),
        Err(e) => Err(TradeError::Json(e.to_string())),
    }
}

/// The body's `apiKey`, for authentication, which runs before the schema is checked.
pub fn body_api_key(obj: &Object) -> Option<&str> {
    obj.members.get("apiKey").and_then(Value::as_str)
}

/// A JSON value whose objects, at every depth, name each member once. The executor gets
/// the body's own bytes, so a member given twice would be read there by its parser's rule
/// (the first, the last, or a refusal), not necessarily the copy checked and hashed here.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictValue).map(Strict)
    }
}

/// Builds the `Value` serde_json's own would, member for member (the stored hash reads it).
struct StrictValue;

impl<'de> Visitor<'de> for StrictValue {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Value, E> {
        // `Value::from` makes a non-finite float null, as serde_json's own visitor does
        // (its parser never yields one).
        Ok(Value::from(n))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = a.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, a: A) -> Result<Value, A::Error> {
        members(a).map(Value::Object)
    }
}

fn members<'de, A: MapAccess<'de>>(mut a: A) -> Result<Map<String, Value>, A::Error> {
    let mut map = Map::new();
    while let Some((k, Strict(v))) = a.next_entry::<String, Strict>()? {
        if k.chars().any(char::is_control) {
            let shown: String = k.chars().take(40).collect();
            return Err(serde::de::Error::custom(format_args!(
                "field name {shown:?} holds a control character"
            )));
        }
        if map.contains_key(&k) {
            let shown: String = k.chars().take(40).collect();
            return Err(serde::de::Error::custom(format_args!(
                "duplicate field `{shown}`"
            )));
        }
        map.insert(k, v);
    }
    Ok(map)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Long,
    Short,
    CloseLong,
    CloseShort,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Long => "LONG",
            Action::Short => "SHORT",
            Action::CloseLong => "CLOSE_LONG",
            Action::CloseShort => "CLOSE_SHORT",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Action::Long,
            Action::Short,
            Action::CloseLong,
            Action::CloseShort,
        ]
        .into_iter()
        .find(|a| a.as_str().eq_ignore_ascii_case(s))
    }
}

/// A trade that passed the schema. Keeps the body as received for forwarding.
#[derive(Debug, Clone)]
pub struct Trade {
    /// As received, `apiKey` already removed.
    obj: Map<String, Value>,
    /// The body's bytes, `apiKey` still in them when `api_key_given`.
    raw: Received,
    api_key_given: bool,
    pub exchange: String,
    pub symbol: String,
    pub action: Action,
    pub quantity: f64,
    pub price: Option<f64>,
    pub leverage: Option<u8>,
    pub test: bool,
    pub idempotency_key: Option<String>,
    /// A member that names the key as other APIs do (`idempotency_key`), a string not
    /// blank: not read as the key, and named where no key is (`idem::other_name`).
    key_alias: Option<String>,
}

impl Trade {
    pub fn from_object(object: Object) -> Result<Trade, TradeError> {
        let Object {
            members: mut obj,
            raw,
        } = object;
        // The credential stops here: authentication read it already (`body_api_key`), and
        // neither the trade's fields nor the order it becomes keeps a copy (its bytes keep
        // it only to be cut out of the order, and `Debug` shows none of them).
        let api_key_given = match obj.remove("apiKey") {
            None => false,
            Some(Value::Null) | Some(Value::String(_)) => true,
            Some(_) => return Err(field("apiKey", "must be a string")),
        };
        if let Some(known) = obj.keys().find_map(|name| case_variant(name)) {
            return Err(field(
                known,
                "must be spelled exactly so: another spelling (in other letter case, \
                 or `api_key` for `apiKey`) is refused, since an executor may read it \
                 as this field",
            ));
        }
        let key_alias = obj
            .iter()
            .find(|(n, v)| {
                n.as_str() != "idempotencyKey"
                    && is_key_name(n)
                    && v.as_str().is_some_and(|k| !k.trim().is_empty())
            })
            .map(|(n, _)| n.clone());
        let exchange = required_str(&obj, "exchange")?;
        if !(1..=MAX_EXCHANGE).contains(&exchange.len())
            || !exchange.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(field(
                "exchange",
                "must be 1 to 32 printable ASCII characters, without spaces",
            ));
        }
        let symbol = required_str(&obj, "symbol")?;
        if !(1..=MAX_SYMBOL).contains(&symbol.len())
            || !symbol.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(field(
                "symbol",
                "must be 1 to 20 printable ASCII characters, without spaces",
            ));
        }
        let action = Action::parse(required_str(&obj, "action")?).ok_or(field(
            "action",
            "must be one of LONG, SHORT, CLOSE_LONG, CLOSE_SHORT",
        ))?;

        let quantity = match obj.get("quantity") {
            None | Some(Value::Null) => return Err(field("quantity", "is required")),
            Some(v) => v.as_f64().ok_or(field("quantity", "must be a number"))?,
        };
        // serde_json never yields NaN or infinity; the check keeps that an explicit rule.
        if !quantity.is_finite() || quantity <= 0.0 {
            return Err(field("quantity", "must be greater than 0"));
        }
        if quantity > MAX_QUANTITY {
            return Err(field("quantity", "must be at most 1000000"));
        }
        if canonical_quantity(quantity).len() > MAX_QUANTITY_CHARS {
            return Err(field("quantity", "has too many decimal places"));
        }

        let price = match obj.get("price") {
            None | Some(Value::Null) => None,
            Some(v) => {
                let p = v.as_f64().ok_or(field("price", "must be a number"))?;
                if !p.is_finite() || p <= 0.0 {
                    return Err(field("price", "must be greater than 0"));
                }
                Some(p)
            }
        };
        let leverage = match obj.get("leverage") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                // 1..=125 fits in a u8.
                Some(l @ 1..=MAX_LEVERAGE) => Some(l as u8),
                _ => return Err(field("leverage", "must be an integer from 1 to 125")),
            },
        };
        // Unlike `price` and `leverage`, a `null` here is refused: read as absent, it would
        // send a test trade live, or a keyed trade under a minute's fingerprint.
        let test = match obj.get("test") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(field("test", "must be true or false")),
        };
        let idempotency_key = match obj.get("idempotencyKey") {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(TradeError::KeyNotAString),
        };

        Ok(Trade {
            exchange: exchange.to_ascii_lowercase(),
            symbol: symbol.to_ascii_uppercase(),
            action,
            quantity,
            price,
            leverage,
            test,
            idempotency_key,
            key_alias,
            obj,
            raw,
            api_key_given,
        })
    }

    pub fn mode(&self) -> Mode {
        if self.test { Mode::Test } else { Mode::Live }
    }

    pub fn fingerprint(&self) -> Fingerprint<'_> {
        Fingerprint {
            exchange: &self.exchange,
            symbol: &self.symbol,
            action: self.action.as_str(),
            quantity: self.quantity,
            mode: self.mode(),
        }
    }

    /// SHA-256 of the canonical trade: the known fields in their normalised form
    /// (so `1` and `1.00`, `btcusdt` and `BTCUSDT`, a missing `test` and `false` are the
    /// same trade), plus every pass-through field, keys sorted at every depth. The
    /// credential and the idempotency key are not part of the trade.
    ///
    /// The hash is stored with each key, so these bytes are part of the on-disk format
    /// (docs/DESIGN.md): a change would turn every retry across an upgrade into a 422.
    /// Written straight into the hasher, without copying the trade.
    pub fn payload_hash(&self) -> PayloadHash {
        let quantity = canonical_quantity(self.quantity);
        let price = self.price.map(canonical_quantity);
        let mut canon: Vec<(&str, Canon<'_>)> = self
            .obj
            .iter()
            .filter(|(k, v)| !KNOWN.contains(&k.as_str()) && !v.is_null())
            .map(|(k, v)| (k.as_str(), Canon::Passed(Sorted(v))))
            .collect();
        canon.push(("exchange", Canon::Text(&self.exchange)));
        canon.push(("symbol", Canon::Text(&self.symbol)));
        canon.push(("action", Canon::Text(self.action.as_str())));
        canon.push(("quantity", Canon::Text(&quantity)));
        if let Some(p) = &price {
            canon.push(("price", Canon::Text(p)));
        }
        if let Some(l) = self.leverage {
            canon.push(("leverage", Canon::Int(l)));
        }
        canon.push(("test", Canon::Bool(self.test)));
        canon.sort_by(|a, b| a.0.cmp(b.0));

        let mut h = Sha256::new();
        h.update(b"hoox-edge trade v1\n");
        // Writing JSON into a hasher cannot fail: string keys, and a writer that never errs.
        let mut json = serde_json::Serializer::new(Hashing(&mut h));
        let _ = json.collect_map(canon.iter().map(|(k, v)| (k, v)));
        h.finalize().into()
    }

    /// The body as received, minus `apiKey`: the credential stops here. Without one, the
    /// body goes on byte for byte; with one, every other member's value does, its name
    /// written again (escapes may differ, not the name) and no whitespace between members.
    /// Written again from the parsed members, an integer past 2^53 (a client order id)
    /// would reach the executor rounded, and `1e6` as `1000000.0`.
    pub fn forward_body(&self) -> Bytes {
        if !self.api_key_given {
            return self.raw.0.clone();
        }
        without_api_key(&self.raw.0).unwrap_or_else(|| {
            // Not reached: these bytes parsed as this object before. Should they not, the
            // parsed members still make the same trade, numbers as read.
            Bytes::from(serde_json::to_vec(&self.obj).unwrap_or_default())
        })
    }

    pub fn idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }

    pub fn key_alias(&self) -> Option<&str> {
        self.key_alias.as_deref()
    }
}

/// `body`, a JSON object, written again without its top-level `apiKey` member: the other
/// members' names as parsed, their values as they came. `None` if it does not parse.
fn without_api_key(body: &[u8]) -> Option<Bytes> {
    struct Members<'a>(Vec<(String, &'a RawValue)>);
    impl<'de> Deserialize<'de> for Members<'de> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Members<'de>;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Members<'de>, A::Error> {
                    let mut members = Vec::new();
                    while let Some(member) = a.next_entry()? {
                        members.push(member);
                    }
                    Ok(Members(members))
                }
            }
            d.deserialize_map(V)
        }
    }
    let members = serde_json::from_slice::<Members<'_>>(body).ok()?.0;
    let mut out = Vec::with_capacity(body.len());
    out.push(b'{');
    for (name, value) in members.iter().filter(|(name, _)| name != "apiKey") {
        if out.len() > 1 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, name).ok()?;
        out.push(b':');
        out.extend_from_slice(value.get().as_bytes());
    }
    out.push(b'}');
    Some(Bytes::from(out))
}

/// The fields with a meaning here; everything else is passed through as is.
const KNOWN: &[&str] = &[
    "exchange",
    "symbol",
    "action",
    "quantity",
    "price",
    "leverage",
    "test",
    "idempotencyKey",
    "apiKey",
];

/// The known field a member's name spells in other letter case (`Quantity`, `TEST`, or
/// with the Kelvin sign or long s, which Unicode case folding takes to `k` and `s`).
/// Executors written in Go (`encoding/json`) or .NET match names regardless of case, so
/// such a member, passed through unchecked here, could be the field there: `"Test": true`
/// keyed live and placed as a test order, or a `Quantity` placed instead of the
/// `quantity` keyed, once per spelling, since each spelling is another trade here.
///
/// `apiKey` also spelled with `_` or `-` (`api_key`, as SPEC §3 names the method): not read
/// as the credential, such a member would reach the executor holding a valid secret when
/// another credential authenticated the request.
fn case_variant(name: &str) -> Option<&'static str> {
    let fold = |c: char| match c {
        '\u{212A}' => 'k',
        '\u{17F}' => 's',
        c => c.to_ascii_lowercase(),
    };
    let folded = || name.chars().map(fold);
    KNOWN.iter().copied().find(|known| {
        let lower = || known.chars().map(|c| c.to_ascii_lowercase());
        *known != name
            && (folded().eq(lower())
                || (*known == "apiKey" && folded().filter(|c| !matches!(c, '_' | '-')).eq(lower())))
    })
}

/// Whether `name` spells the idempotency key in a way other APIs read it
/// (`idempotency_key`, `Idempotency-Key`, `X-Idempotency-Key`, in any letter case): one of
/// those, passed over, would leave a trade its sender keyed told apart by its fingerprint
/// only. A header's name, a URL parameter's and the body's member ask this
/// (`idem::other_name`).
pub fn is_key_name(name: &str) -> bool {
    // Asked of every header of a request without a key: compared in place, not copied.
    let folded = || {
        name.chars()
            .filter(|c| !matches!(c, '-' | '_'))
            .map(|c| c.to_ascii_lowercase())
    };
    folded().eq("idempotencykey".chars()) || folded().eq("xidempotencykey".chars())
}

fn required_str<'a>(
    obj: &'a Map<String, Value>,
    name: &'static str,
) -> Result<&'a str, TradeError> {
    match obj.get(name) {
        None | Some(Value::Null) => Err(field(name, "is required")),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(field(name, "must be a string")),
    }
}

/// One member of the canonical trade.
#[derive(Serialize)]
#[serde(untagged)]
enum Canon<'a> {
    Passed(Sorted<'a>),
    Text(&'a str),
    Int(u8),
    Bool(bool),
}

/// Feeds JSON to the hasher as it is written.
struct Hashing<'a>(&'a mut Sha256);

impl std::io::Write for Hashing<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A value written with object keys in sorted order at every depth, whatever order the map
/// type keeps (serde_json's `preserve_order` feature may be switched on by any dependency).
struct Sorted<'a>(&'a Value);

impl Serialize for Sorted<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(m) => {
                let mut members: Vec<_> = m.iter().collect();
                members.sort_by(|a, b| a.0.cmp(b.0));
                s.collect_map(members.into_iter().map(|(k, v)| (k, Sorted(v))))
            }
            Value::Array(a) => s.collect_seq(a.iter().map(Sorted)),
            other => other.serialize(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutex::Key;
    use serde_json::json;

    fn obj(v: Value) -> Object {
        parse(&serde_json::to_vec(&v).unwrap()).unwrap()
    }

    fn parse(body: &[u8]) -> Result<Object, TradeError> {
        parse_object(Bytes::copy_from_slice(body))
    }

    fn base() -> Value {
        json!({"exchange": "binance", "symbol": "BTCUSDT", "action": "LONG", "quantity": 1})
    }

    fn with(k: &str, v: Value) -> Result<Trade, TradeError> {
        let mut b = base();
        b[k] = v;
        Trade::from_object(obj(b))
    }

    fn without(k: &str) -> Result<Trade, TradeError> {
        let mut b = base();
        b.as_object_mut().unwrap().remove(k);
        Trade::from_object(obj(b))
    }

    fn err_field(r: Result<Trade, TradeError>) -> &'static str {
        match r {
            Err(TradeError::Field { field, .. }) => field,
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    #[test]
    fn parse_object_refuses_what_is_not_an_object() {
        assert!(matches!(parse(b"not json"), Err(TradeError::Json(_))));
        assert!(matches!(parse(b""), Err(TradeError::Json(_))));
        assert!(matches!(parse(b"{\"a\":1"), Err(TradeError::Json(_))));
        assert!(matches!(parse(b"{} x"), Err(TradeError::Json(_))));
        for body in [&b"[]"[..], b"1", b"\"s\"", b"null", b"true"] {
            assert!(matches!(parse(body), Err(TradeError::NotObject)));
        }
        assert!(parse(b" {\"a\": {\"b\": [1]}} \n").is_ok());
        // Not UTF-8.
        assert!(matches!(
            parse(b"{\"a\":\"\xff\"}"),
            Err(TradeError::Json(_))
        ));
    }

    #[test]
    fn parse_object_refuses_a_member_given_twice() {
        let Err(e) = parse(br#"{"quantity": 1, "quantity": 100}"#) else {
            panic!("a member given twice was taken")
        };
        assert!(e.to_string().contains("duplicate field `quantity`"), "{e}");
        // At any depth: the executor gets these bytes, and its parser may take the other.
        assert!(parse(br#"{"a": {"x": 1}, "b": {"x": 1}}"#).is_ok());
        for nested in [
            &br#"{"a": {"x": 1, "x": 2}}"#[..],
            br#"{"a": [{"y": {"x": 1, "x": 2}}]}"#,
        ] {
            let Err(e) = parse(nested) else {
                panic!("a nested member given twice was taken")
            };
            assert!(e.to_string().contains("duplicate field `x`"), "{e}");
        }
    }

    /// A NUL, a tab or a C1 control in a member's name, at any depth, is refused: the
    /// executor gets these bytes, and a C-string parser reads `quantity\u0000` as `quantity`.
    #[test]
    fn parse_object_refuses_a_control_character_in_a_name() {
        for body in [
            &br#"{"quantity\u0000": 100, "quantity": 1}"#[..],
            br#"{"quantity\t": 100}"#,
            br#"{"a": [{"x\u001f": 1}]}"#,
            br#"{"x\u0085": 1}"#,
            br#"{"x\u007f": 1}"#,
        ] {
            let Err(e) = parse(body) else {
                panic!("{} was taken", String::from_utf8_lossy(body))
            };
            assert!(e.to_string().contains("holds a control character"), "{e}");
        }
        // In a value, and non-ASCII that is not a control, it is the sender's business.
        assert!(parse(br#"{"note": "a\u0000b", "caf\u00e9": 1, "x y": 2}"#).is_ok());
    }

    #[test]
    fn parse_object_survives_deep_nesting() {
        let deep = "[".repeat(100_000);
        assert!(matches!(
            parse(format!("{{\"a\":{deep}").as_bytes()),
            Err(TradeError::Json(_))
        ));
    }

    #[test]
    fn body_api_key_is_read_before_the_schema() {
        let m = parse(br#"{"apiKey": "s3cret", "quantity": "nonsense"}"#).unwrap();
        assert_eq!(body_api_key(&m), Some("s3cret"));
        assert_eq!(body_api_key(&obj(json!({"apiKey": 5}))), None);
    }

    #[test]
    fn a_valid_trade_is_normalised() {
        let t = Trade::from_object(obj(json!({
            "exchange": "Binance", "symbol": "btc/usdt", "action": "close_long",
            "quantity": 0.5, "price": 42000.5, "leverage": 10, "test": true,
            "idempotencyKey": " raw key ", "apiKey": "k", "comment": "hi"
        })))
        .unwrap();
        assert_eq!(t.exchange, "binance");
        assert_eq!(t.symbol, "BTC/USDT");
        assert_eq!(t.action, Action::CloseLong);
        assert_eq!(t.quantity, 0.5);
        assert_eq!(t.price, Some(42000.5));
        assert_eq!(t.leverage, Some(10));
        assert_eq!(t.mode(), Mode::Test);
        assert_eq!(t.idempotency_key(), Some(" raw key "));
    }

    #[test]
    fn defaults() {
        let t = Trade::from_object(obj(base())).unwrap();
        assert_eq!(t.mode(), Mode::Live);
        assert_eq!((t.price, t.leverage), (None, None));
        assert_eq!(t.idempotency_key(), None);
        // null means absent for the optional figures, but not for the mode or the key.
        assert_eq!(with("price", Value::Null).unwrap().price, None);
        assert_eq!(with("leverage", Value::Null).unwrap().leverage, None);
        assert_eq!(err_field(with("test", Value::Null)), "test");
        for bad in [Value::Null, json!(42), json!(["k"])] {
            let e = with("idempotencyKey", bad).unwrap_err();
            assert_eq!(e, TradeError::KeyNotAString);
            let problem = crate::gateway::problem::Problem::from(e);
            assert_eq!(problem.code(), "INVALID_IDEMPOTENCY_KEY");
        }
        let schema = crate::gateway::problem::Problem::from(with("test", json!(1)).unwrap_err());
        assert_eq!(schema.code(), "INVALID_REQUEST");
    }

    #[test]
    fn required_fields_are_named() {
        for f in ["exchange", "symbol", "action", "quantity"] {
            assert_eq!(err_field(without(f)), f);
            assert_eq!(err_field(with(f, Value::Null)), f);
        }
        let e = without("quantity").unwrap_err();
        assert_eq!(e.to_string(), "field `quantity` is required");
    }

    #[test]
    fn exchange_and_symbol_charsets() {
        assert_eq!(err_field(with("exchange", json!(""))), "exchange");
        assert_eq!(
            err_field(with("exchange", json!("a".repeat(33)))),
            "exchange"
        );
        assert!(with("exchange", json!("a".repeat(32))).is_ok());
        for bad in ["bin ance", "bïnance", "a\n", "a\t"] {
            assert_eq!(err_field(with("exchange", json!(bad))), "exchange", "{bad}");
        }
        for good in ["okx-v5.perp_1", "bin:ance", "CME/GLOBEX", "a%b"] {
            assert!(with("exchange", json!(good)).is_ok(), "{good}");
        }
        assert_eq!(err_field(with("exchange", json!(7))), "exchange");

        assert_eq!(err_field(with("symbol", json!(""))), "symbol");
        assert_eq!(err_field(with("symbol", json!("A".repeat(21)))), "symbol");
        assert!(with("symbol", json!("A".repeat(20))).is_ok());
        for bad in ["BTC USDT", "€", "BTC\u{7f}"] {
            assert_eq!(err_field(with("symbol", json!(bad))), "symbol", "{bad}");
        }
        for good in [
            "ETH/USDT-PERP",
            "ES1!",
            "BINANCE:BTCUSDT",
            "BRK.B",
            "BTC\\USDT",
            "^GSPC",
        ] {
            assert!(with("symbol", json!(good)).is_ok(), "{good}");
        }
    }

    #[test]
    fn action_is_case_insensitive_and_closed() {
        for (s, a) in [
            ("long", Action::Long),
            ("Short", Action::Short),
            ("CLOSE_LONG", Action::CloseLong),
            ("close_short", Action::CloseShort),
        ] {
            assert_eq!(with("action", json!(s)).unwrap().action, a);
        }
        for bad in ["BUY", "", "LONG ", "close-long"] {
            assert_eq!(err_field(with("action", json!(bad))), "action");
        }
        assert_eq!(err_field(with("action", json!(1))), "action");
    }

    #[test]
    fn quantity_bounds() {
        assert!(with("quantity", json!(1e6)).is_ok());
        assert!(with("quantity", json!(0.00000001)).is_ok());
        for bad in [
            json!(0),
            json!(-1),
            json!(0.0),
            json!(1000000.5),
            json!("1"),
        ] {
            assert_eq!(
                err_field(with("quantity", bad.clone())),
                "quantity",
                "{bad}"
            );
        }
        assert_eq!(err_field(with("quantity", json!(1e-300))), "quantity");
        // serde_json refuses numbers beyond f64 at parse time.
        assert!(parse(br#"{"quantity": 1e400}"#).is_err());
    }

    #[test]
    fn price_leverage_test_types() {
        assert_eq!(err_field(with("price", json!(0))), "price");
        assert_eq!(err_field(with("price", json!(-3.5))), "price");
        assert_eq!(err_field(with("price", json!("1"))), "price");
        assert!(with("price", json!(0.0001)).is_ok());

        assert_eq!(with("leverage", json!(1)).unwrap().leverage, Some(1));
        assert_eq!(with("leverage", json!(125)).unwrap().leverage, Some(125));
        for bad in [
            json!(0),
            json!(126),
            json!(-1),
            json!(2.5),
            json!(10.0),
            json!("10"),
        ] {
            assert_eq!(
                err_field(with("leverage", bad.clone())),
                "leverage",
                "{bad}"
            );
        }

        assert_eq!(err_field(with("test", json!("true"))), "test");
        assert_eq!(err_field(with("test", json!(1))), "test");
        assert_eq!(err_field(with("apiKey", json!(["k"]))), "apiKey");
    }

    /// A member that names the key as other APIs do (`idempotency_key`), with a string, is
    /// noted for `idem::other_name`; a blank or null one, names that only resemble it, and
    /// `idempotencyKey` itself, are not.
    #[test]
    fn a_key_under_another_member_name_is_noted() {
        for name in [
            "idempotency_key",
            "idempotency-key",
            "Idempotency-Key",
            "IDEMPOTENCY_KEY",
            "x-idempotency-key",
        ] {
            let t = with(name, json!("k1")).unwrap();
            assert_eq!(t.key_alias(), Some(name));
            assert_eq!(t.idempotency_key(), None);
        }
        for name in ["idempotency", "idempotencyKeys", "key", "requestId"] {
            assert_eq!(with(name, json!("k1")).unwrap().key_alias(), None, "{name}");
        }
        assert_eq!(
            with("idempotencyKey", json!("k1")).unwrap().key_alias(),
            None
        );
        for blank in [
            json!(null),
            json!(""),
            json!(" "),
            json!({"a": 1}),
            json!(7),
        ] {
            let t = with("idempotency_key", blank.clone()).unwrap();
            assert_eq!(t.key_alias(), None, "{blank}");
        }
    }

    #[test]
    fn a_known_field_in_other_letter_case_is_refused() {
        for (name, known) in [
            ("Quantity", "quantity"),
            ("TEST", "test"),
            ("Test", "test"),
            ("SYMBOL", "symbol"),
            ("\u{17F}ymbol", "symbol"),
            ("api\u{212A}ey", "apiKey"),
            ("IdempotencyKey", "idempotencyKey"),
            ("APIKEY", "apiKey"),
            ("Price", "price"),
            ("api_key", "apiKey"),
            ("API-KEY", "apiKey"),
            ("Api_Key", "apiKey"),
        ] {
            // Beside the exact spelling, and alone.
            assert_eq!(err_field(with(name, json!(5))), known, "{name}");
            let mut b = base();
            let m = b.as_object_mut().unwrap();
            m.remove(known);
            m.insert(name.to_string(), json!(5));
            assert_eq!(err_field(Trade::from_object(obj(b))), known, "{name} alone");
        }
        // Names that merely resemble a field pass through, as any other extra field.
        for name in [
            "quantity2",
            "qty",
            "tests",
            "\u{212A}",
            "strategy",
            "api_keys",
            "sym_bol",
        ] {
            assert!(with(name, json!(5)).is_ok(), "{name}");
        }
    }

    #[test]
    fn forward_body_drops_only_the_credential() {
        let t = Trade::from_object(obj(json!({
            "exchange": "Binance", "symbol": "BTCUSDT", "action": "long", "quantity": 2,
            "apiKey": "s3cret", "idempotencyKey": "k1", "strategy": {"id": 7}
        })))
        .unwrap();
        let fwd = t.forward_body();
        assert!(!String::from_utf8_lossy(&fwd).contains("s3cret"));
        assert!(!format!("{t:?}").contains("s3cret"));
        let v: Value = serde_json::from_slice(&fwd).unwrap();
        assert_eq!(
            v,
            json!({"exchange": "Binance", "symbol": "BTCUSDT", "action": "long",
                   "quantity": 2, "idempotencyKey": "k1", "strategy": {"id": 7}})
        );
    }

    /// The executor gets the sender's bytes: an integer past 2^53 (a client order id),
    /// `1e6` and `1.50` as written, members in their order. Parsed and written again, they
    /// arrived as 1.8446744073709552e19, 1000000.0 and 1.5.
    #[test]
    fn forward_body_keeps_the_senders_bytes() {
        let members = r#""exchange":"x", "symbol":"Y","action":"long","quantity":1e6,"price":1.50,"clientRef":18446744073709551617,"z":{"b":-9223372036854775809,"a":[1.0 ,2]},"idempotencyKey":"k""#;
        let plain = format!("{{ {members} }}\n");
        let t = Trade::from_object(parse(plain.as_bytes()).unwrap()).unwrap();
        assert_eq!(t.forward_body(), plain.as_bytes());

        // With the credential, first or last, its name escaped or not: only it goes.
        let squeezed = members.replace(", ", ",");
        for (with_key, cut) in [
            (format!(r#"{{"apiKey":"s3cret",{members}}}"#), &squeezed),
            (format!(r#"{{{members},"api\u004bey":null}}"#), &squeezed),
            (
                format!(r#"{{{members},"n":{{"apiKey":"kept"}},"apiKey" : "s3cret"}}"#),
                &format!(r#"{squeezed},"n":{{"apiKey":"kept"}}"#),
            ),
        ] {
            let t = Trade::from_object(parse(with_key.as_bytes()).unwrap()).unwrap();
            let fwd = t.forward_body();
            assert_eq!(
                String::from_utf8_lossy(&fwd),
                format!("{{{cut}}}"),
                "{with_key}"
            );
            assert!(!format!("{t:?}").contains("s3cret"));
        }
    }

    /// Fuzz regression (webhook_body): a long number in a pass-through field came back
    /// different after forwarding, because serde_json parses floats approximately unless
    /// its `float_roundtrip` feature is on. The executor must get the trade we hashed.
    #[test]
    fn forwarded_numbers_read_back_the_same() {
        let long = format!("20{}", "5".repeat(121));
        for n in [
            long.as_str(),
            "0.30000000000000004",
            "5e-324",
            "1.7976931348623157e308",
            "3120.123456789012345678",
        ] {
            let body = format!(
                r#"{{"exchange":"x","symbol":"y","action":"long","quantity":1.1000000000000001,"price":{n},"n":{n}}}"#
            );
            let t = Trade::from_object(parse(body.as_bytes()).unwrap()).unwrap();
            let again = Trade::from_object(parse(&t.forward_body()).unwrap()).unwrap();
            assert_eq!(again.payload_hash(), t.payload_hash(), "{n}");
            assert_eq!(again.price, t.price, "{n}");
        }
    }

    /// The canonical form is stored with every key (as its hash), so it must not drift:
    /// these hashes are what the first release wrote.
    #[test]
    fn payload_hash_is_stable_across_releases() {
        let h = |b: &[u8]| {
            hex::encode(
                Trade::from_object(parse(b).unwrap())
                    .unwrap()
                    .payload_hash(),
            )
        };
        assert_eq!(
            h(br#"{"exchange":"Binance","symbol":"btcusdt","action":"long","quantity":1.50,"price":65000.5,"leverage":10,"test":true,"meta":{"z":[1,{"b":"x\"y","a":null}],"a":"\u00e9"},"note":null,"apiKey":"k","idempotencyKey":"i","Zed":[{"y":1,"x":2}]}"#),
            "c642a540ac3349c2bc8cb34870e1758b50419b4f6184ee5782d23e173df82418"
        );
        assert_eq!(
            h(br#"{"exchange":"okx","symbol":"ETH/USDT","action":"CLOSE_SHORT","quantity":3}"#),
            "45e8a249a8d531bddb2a1a44ca7427265c34944a871a45f25906f84f7f912578"
        );
    }

    #[test]
    fn payload_hash_is_canonical() {
        let h = |b: &[u8]| {
            Trade::from_object(parse(b).unwrap())
                .unwrap()
                .payload_hash()
        };
        let a = h(br#"{"exchange":"binance","symbol":"BTCUSDT","action":"LONG","quantity":1}"#);
        // Same trade, written differently.
        assert_eq!(a, h(br#"{"quantity":1.00,"action":"long","symbol":"btcusdt","exchange":"BINANCE","test":false}"#));
        assert_eq!(a, h(br#"{"exchange":"binance","symbol":"BTCUSDT","action":"LONG","quantity":1e0,"apiKey":"x","idempotencyKey":"k","price":null}"#));
        // A different trade.
        assert_ne!(
            a,
            h(br#"{"exchange":"binance","symbol":"BTCUSDT","action":"LONG","quantity":2}"#)
        );
        assert_ne!(
            a,
            h(br#"{"exchange":"binance","symbol":"BTCUSDT","action":"SHORT","quantity":1}"#)
        );
        assert_ne!(a, h(br#"{"exchange":"binance","symbol":"BTCUSDT","action":"LONG","quantity":1,"test":true}"#));
        assert_ne!(a, h(br#"{"exchange":"binance","symbol":"BTCUSDT","action":"LONG","quantity":1,"price":5}"#));
        assert_ne!(a, h(br#"{"exchange":"binance","symbol":"BTCUSDT","action":"LONG","quantity":1,"leverage":5}"#));
        // Pass-through fields count, in any order.
        let p = h(br#"{"exchange":"binance","symbol":"BTCUSDT","action":"LONG","quantity":1,"meta":{"a":1,"b":[2,{"c":3,"d":4}]}}"#);
        assert_ne!(a, p);
        assert_eq!(p, h(br#"{"meta":{"b":[2,{"d":4,"c":3}],"a":1},"exchange":"binance","symbol":"BTCUSDT","action":"LONG","quantity":1}"#));
        // A pass-through field cannot impersonate a known one (one spelled like it in
        // other letter case is refused: `a_known_field_in_other_letter_case_is_refused`).
        assert_ne!(
            h(br#"{"exchange":"binance","symbol":"BTCUSDT","action":"LONG","quantity":1,"test_":true}"#),
            a
        );
    }

    #[test]
    fn fingerprint_feeds_the_key() {
        let t = with("quantity", json!(1.50)).unwrap();
        let k = Key::fingerprint(&t.fingerprint(), 7).unwrap();
        assert_eq!(k.as_str(), "trade:binance:BTCUSDT:LONG:1.5:live:7");
    }

    #[test]
    fn the_longest_fingerprint_fits_a_key() {
        // Every byte of exchange and symbol escaped: three bytes each in the key.
        // And the longest quantity the schema takes.
        let quantity = 0.000_001_234_567_890_123_456_7;
        assert_eq!(canonical_quantity(quantity).len(), MAX_QUANTITY_CHARS);
        let t = Trade::from_object(obj(json!({
            "exchange": ":".repeat(32), "symbol": ":".repeat(20), "action": "CLOSE_SHORT",
            "quantity": quantity, "test": true
        })))
        .unwrap();
        assert!(Key::fingerprint(&t.fingerprint(), u64::MAX).is_ok());
    }

    #[test]
    fn trade_error_becomes_invalid_request() {
        let p: super::super::problem::Problem = without("symbol").unwrap_err().into();
        assert_eq!(p.code(), "INVALID_REQUEST");
        assert!(p.detail().contains("symbol"));
    }

    proptest::proptest! {
        /// The same trade, however it is written, hashes the same.
        #[test]
        fn payload_hash_ignores_spelling(
            units in 1u64..1_000_000,
            frac in 0u32..10_000,
            zeros in 0usize..4,
            upper in proptest::bool::ANY,
            reversed in proptest::bool::ANY,
        ) {
            let q = format!("{units}.{frac:04}");
            let q2 = format!("{q}{}", "0".repeat(zeros));
            let case = |s: &str| if upper { s.to_uppercase() } else { s.to_lowercase() };
            let mut fields = [
                format!(r#""exchange":"{}""#, case("Binance")),
                format!(r#""symbol":"{}""#, case("btcusdt")),
                format!(r#""action":"{}""#, case("Long")),
                format!(r#""quantity":{q2}"#),
                r#""extra":{"b":1,"a":2}"#.to_string(),
            ];
            if reversed {
                fields.reverse();
            }
            let body = format!("{{{}}}", fields.join(","));
            let canonical = format!(
                r#"{{"exchange":"binance","symbol":"BTCUSDT","action":"LONG","quantity":{q},"extra":{{"a":2,"b":1}}}}"#
            );
            let h = |b: &str| Trade::from_object(parse(b.as_bytes()).unwrap()).unwrap().payload_hash();
            proptest::prop_assert_eq!(h(&body), h(&canonical));
        }

        #[test]
        fn parse_never_panics(v in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            if let Ok(o) = parse(&v) {
                let _ = Trade::from_object(o);
            }
        }
    }
}
