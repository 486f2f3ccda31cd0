//! The client's idempotency key (SPEC §2): the `Idempotency-Key` header, else the body's
//! `idempotencyKey`. A key that is there but malformed is a 400, never a silent fallback
//! to the fingerprint: the client meant to lock something, and we must not guess what.
//!
//! The header is an RFC 8941 Item whose value is a String (IETF Idempotency-Key draft):
//! `"abc"`, with `\"` and `\\` the only escapes. Many clients send the key bare
//! (`Idempotency-Key: 550e8400-e29b-…`), which is not an sf-token when it starts with a
//! digit, so a bare value is accepted too: visible ASCII without `"`, `\`, `,` or `;`.
//! The last two are refused because they would make a list or parameters; we do not
//! accept parameters on the String either.

use hyper::HeaderMap;

use super::problem::Problem;
use crate::mutex::{ClientKey, key};

pub const HEADER: &str = "idempotency-key";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("Idempotency-Key header is malformed: {0}")]
    Syntax(&'static str),
    #[error(transparent)]
    Key(#[from] key::KeyError),
}

/// Parses one `Idempotency-Key` header value into a client key.
pub fn parse_header(value: &[u8]) -> Result<ClientKey, KeyError> {
    let v = value.trim_ascii();
    let raw = match v.split_first() {
        None => return Err(KeyError::Key(key::KeyError::Length)),
        Some((b'"', rest)) => unquote(rest)?,
        Some(_) => {
            if let Some(&b) = v.iter().find(|&&b| !bare_byte(b)) {
                return Err(KeyError::Syntax(match b {
                    b' ' | b'\t' => "a bare key cannot contain spaces; quote it",
                    b'"' | b'\\' => "a bare key cannot contain quotes or backslashes",
                    b',' | b';' => "one key only, without parameters",
                    _ => "not printable ASCII",
                }));
            }
            v.to_vec()
        }
    };
    // Only printable ASCII got this far, so this is valid UTF-8.
    let s = std::str::from_utf8(&raw).map_err(|_| key::KeyError::Charset)?;
    Ok(ClientKey::parse(s)?)
}

/// The body of an sf-string after its opening quote: up to the closing quote, which
/// must end the value.
fn unquote(rest: &[u8]) -> Result<Vec<u8>, KeyError> {
    let mut out = Vec::with_capacity(rest.len());
    let mut it = rest.iter();
    while let Some(&b) = it.next() {
        match b {
            b'\\' => match it.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(e),
                _ => return Err(KeyError::Syntax("only \\\" and \\\\ may be escaped")),
            },
            b'"' => {
                return if it.as_slice().is_empty() {
                    Ok(out)
                } else {
                    Err(KeyError::Syntax("text after the closing quote"))
                };
            }
            0x20..=0x7e => out.push(b),
            _ => return Err(KeyError::Syntax("not printable ASCII")),
        }
    }
    Err(KeyError::Syntax("missing closing quote"))
}

fn bare_byte(b: u8) -> bool {
    (0x21..=0x7e).contains(&b) && !matches!(b, b'"' | b'\\' | b',' | b';')
}

impl From<KeyError> for Problem {
    fn from(e: KeyError) -> Self {
        Problem::InvalidIdempotencyKey(e.to_string())
    }
}

/// The client key of a request, from the header and the body's `idempotencyKey`
/// (SPEC §2): either may be absent; if both are present they must agree. More than one
/// header line is ambiguous and refused, and so is one in the trailers: read from there
/// it would come after the key was needed, and ignored the trade would fall back to its
/// fingerprint, which blocks a retry for a minute, not for the key's life.
pub fn resolve(
    headers: &HeaderMap,
    trailers: Option<&HeaderMap>,
    body_key: Option<&str>,
) -> Result<Option<ClientKey>, Problem> {
    if trailers.is_some_and(|t| t.contains_key(HEADER)) {
        return Err(Problem::InvalidIdempotencyKey(
            "an Idempotency-Key in the trailers is not read: send it in the request's headers"
                .into(),
        ));
    }
    let mut values = headers.get_all(HEADER).iter();
    let header = match (values.next(), values.next()) {
        (None, _) => None,
        (Some(v), None) => Some(parse_header(v.as_bytes())?),
        (Some(_), Some(_)) => {
            return Err(KeyError::Syntax("more than one Idempotency-Key header").into());
        }
    };
    let body = match body_key {
        None => None,
        Some(s) => Some(
            ClientKey::parse(s)
                .map_err(|e| Problem::InvalidIdempotencyKey(format!("body idempotencyKey: {e}")))?,
        ),
    };
    match (header, body) {
        (Some(h), Some(b)) if h != b => Err(Problem::IdempotencyKeyConflict),
        (h, b) => Ok(h.or(b)),
    }
}

/// A key a request carries under a name other APIs read, which is not read here: an
/// `X-Idempotency-Key` (or `Idempotency_Key`) header with a value, a URL parameter so
/// named (`?idempotencyKey=…`, from the request's `query`: a sender that cannot set
/// headers), or the body's member `body_alias` (`idempotency_key`,
/// [`super::trade::Trade::key_alias`]). Asked of a trade with no key read: its sender
/// believes it keyed for the TTL, and it is told apart by its fingerprint, for a minute.
/// Said in the log, or, under `require_client_key`, in the 400.
pub fn other_name(
    headers: &HeaderMap,
    query: Option<&str>,
    body_alias: Option<&str>,
) -> Option<String> {
    let header = headers.iter().find(|(n, v)| {
        super::trade::is_key_name(n.as_str()) && !v.as_bytes().trim_ascii().is_empty()
    });
    let parameter = query.into_iter().flat_map(|q| q.split('&')).find_map(|p| {
        let (name, value) = p.split_once('=')?;
        (super::trade::is_key_name(name) && !value.trim().is_empty()).then_some(name)
    });
    if let Some((name, _)) = header {
        Some(format!("the {name} header"))
    } else if let Some(name) = parameter {
        // Shown as sent: matched, it holds only the name's letters, `-` and `_`.
        Some(format!("the URL's {name:?} parameter"))
    } else {
        body_alias.map(|member| format!("the body's {member:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn ok(v: &[u8]) -> String {
        parse_header(v).unwrap().as_str().to_owned()
    }

    #[test]
    fn sf_string_form() {
        assert_eq!(ok(br#""abc""#), "abc");
        assert_eq!(ok(br#"  "a b c"	"#), "a b c");
        assert_eq!(ok(br#""say \"hi\"""#), r#"say "hi""#);
        assert_eq!(ok(br#""back\\slash""#), r"back\slash");
        assert_eq!(ok(br#""a,b;c=d""#), "a,b;c=d");
    }

    #[test]
    fn bare_form() {
        assert_eq!(ok(b"abc"), "abc");
        assert_eq!(
            ok(b" 550e8400-e29b-41d4-a716-446655440000 "),
            "550e8400-e29b-41d4-a716-446655440000"
        );
        assert_eq!(ok(b"b64+/=="), "b64+/==");
        assert_eq!(ok(b"order:42"), "order:42");
    }

    #[test]
    fn malformed_is_an_error_not_a_fallback() {
        // Each with the words that tell its sender what to fix.
        for (bad, says) in [
            (&br#""abc"#[..], "closing quote"),           // unterminated
            (br#""abc"x"#, "after the closing quote"),    // trailing text
            (br#""abc";p=1"#, "after the closing quote"), // parameters
            (br#""a\nb""#, "may be escaped"),             // bad escape
            (br#""a\"#, "may be escaped"),                // escape at the end
            (b"\"a\tb\"", "printable"),                   // tab inside a string
            (b"\"caf\xc3\xa9\"", "printable"),            // not ASCII
            (b"a b", "quote it"),                         // space in a bare key
            (b"a,b", "one key only"),                     // a list
            (b"a;b", "one key only"),                     // parameters
            (b"ab\"c", "quotes or backslashes"),          // stray quote
            (b"a\\c", "quotes or backslashes"),           // stray backslash
            (b"caf\xc3\xa9", "printable"),                // not ASCII
            (b"a\x7f", "printable"),                      // DEL
        ] {
            let got = parse_header(bad);
            assert!(
                matches!(&got, Err(KeyError::Syntax(m)) if m.contains(says)),
                "{:?} gave {got:?}, not one that says {says:?}",
                String::from_utf8_lossy(bad),
            );
        }
    }

    #[test]
    fn length_rules_of_client_keys_apply() {
        assert_eq!(parse_header(b""), Err(key::KeyError::Length.into()));
        assert_eq!(parse_header(b"   "), Err(key::KeyError::Length.into()));
        assert_eq!(parse_header(br#""""#), Err(key::KeyError::Length.into()));
        let max = "k".repeat(255);
        assert_eq!(ok(max.as_bytes()), max);
        assert_eq!(ok(format!("\"{max}\"").as_bytes()), max);
        let long = "k".repeat(256);
        assert_eq!(
            parse_header(long.as_bytes()),
            Err(key::KeyError::Length.into())
        );
        // Escapes count once: 255 characters written with 510 bytes of escapes.
        let escaped = format!("\"{}\"", r#"\""#.repeat(255));
        assert_eq!(ok(escaped.as_bytes()), "\"".repeat(255));
    }

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(HEADER, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn resolve_prefers_agreement() {
        let k = |s| Some(ClientKey::parse(s).unwrap());
        assert_eq!(resolve(&headers(&[]), None, None), Ok(None));
        assert_eq!(resolve(&headers(&["\"a\""]), None, None), Ok(k("a")));
        assert_eq!(resolve(&headers(&[]), None, Some("b")), Ok(k("b")));
        assert_eq!(resolve(&headers(&["\"a\""]), None, Some("a")), Ok(k("a")));
        assert_eq!(
            resolve(&headers(&["a"]), None, Some("b")),
            Err(Problem::IdempotencyKeyConflict)
        );
    }

    /// A key under a header name other APIs read is not read (the trade has none) and is
    /// named, as is a body member of such a name; an empty value names nothing, nor does a
    /// header that only resembles the name.
    #[test]
    fn a_key_under_another_name_is_named_not_read() {
        for name in ["x-idempotency-key", "idempotency_key", "x_idempotency_key"] {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static("k1"));
            assert_eq!(resolve(&h, None, None), Ok(None), "{name}");
            assert_eq!(
                other_name(&h, None, None),
                Some(format!("the {name} header"))
            );
            h.insert(name, HeaderValue::from_static(" "));
            assert_eq!(other_name(&h, None, None), None, "{name} empty");
        }
        for name in ["x-idempotency", "idempotency-keys", "x-request-id"] {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static("k1"));
            assert_eq!(other_name(&h, None, None), None, "{name}");
        }
        assert_eq!(
            other_name(&headers(&[]), None, Some("idempotency_key")),
            Some("the body's \"idempotency_key\"".into())
        );
        // A sender that cannot set headers may put its key in the URL, which is not read.
        for query in [
            "idempotencyKey=q1",
            "a=1&Idempotency-Key=q1",
            "x_idempotency_key=q1&b",
        ] {
            assert!(
                other_name(&headers(&[]), Some(query), None)
                    .is_some_and(|n| n.starts_with("the URL's ") && n.ends_with(" parameter")),
                "{query}"
            );
        }
        for query in [
            "idempotencyKey=",
            "idempotencyKey",
            "key=q1",
            "a=idempotencyKey",
        ] {
            assert_eq!(
                other_name(&headers(&[]), Some(query), None),
                None,
                "{query}"
            );
        }
    }

    #[test]
    fn resolve_refuses_bad_keys_anywhere() {
        let code = |r: Result<Option<ClientKey>, Problem>| r.unwrap_err().code();
        assert_eq!(
            code(resolve(&headers(&["\"a"]), None, None)),
            "INVALID_IDEMPOTENCY_KEY"
        );
        assert_eq!(
            code(resolve(&headers(&[]), None, Some(""))),
            "INVALID_IDEMPOTENCY_KEY"
        );
        assert_eq!(
            code(resolve(&headers(&[]), None, Some("tab\t"))),
            "INVALID_IDEMPOTENCY_KEY"
        );
        assert_eq!(
            code(resolve(&headers(&["a"]), None, Some(&"x".repeat(256)))),
            "INVALID_IDEMPOTENCY_KEY"
        );
        assert_eq!(
            code(resolve(&headers(&["a", "a"]), None, None)),
            "INVALID_IDEMPOTENCY_KEY"
        );
        // In the trailers, alone or beside one in the headers: refused, not ignored.
        for head in [&[][..], &["a"][..]] {
            let e = resolve(&headers(head), Some(&headers(&["a"])), None).unwrap_err();
            assert_eq!(e.code(), "INVALID_IDEMPOTENCY_KEY");
        }
        // Other trailers are not the key's business.
        let mut other = HeaderMap::new();
        other.insert("x-checksum", HeaderValue::from_static("1"));
        assert_eq!(resolve(&headers(&[]), Some(&other), None), Ok(None));
    }

    proptest::proptest! {
        #[test]
        fn any_client_key_round_trips_as_an_sf_string(k in "[!-~]([ -~]{0,253}[!-~])?") {
            let quoted = format!("\"{}\"", k.replace('\\', "\\\\").replace('"', "\\\""));
            proptest::prop_assert_eq!(ok(quoted.as_bytes()), k);
        }

        #[test]
        fn parse_header_never_panics_and_only_yields_valid_keys(v in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            if let Ok(k) = parse_header(&v) {
                proptest::prop_assert!(ClientKey::parse(k.as_str()).is_ok());
            }
        }
    }
}
