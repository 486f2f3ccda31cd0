//! Where an accepted trade goes.
//!
//! An executor takes an order the mutex has reserved and says what became of it. The five
//! outcomes are the rows of SPEC §4; the gateway maps each to commit, release or hold. The line
//! that matters most is between `NotSent` and `Unknown`: only when we are sure nothing left this
//! process may the key be released, because a request that may have arrived may have filled.

pub mod http;
pub mod outstanding;
pub mod paper;

use bytes::Bytes;

pub use http::{ExecutorError, HttpConfig, HttpExecutor};
pub use outstanding::Outstanding;
pub use paper::Paper;

/// One trade, ready to leave. Built by the gateway after the key is reserved.
#[derive(Debug, Clone)]
pub struct Order {
    /// The resolved idempotency key, sent as `Idempotency-Key` so that the executor and the
    /// exchange can deduplicate too (it doubles as a client order id).
    pub key: String,
    /// Correlates our logs with the executor's (`X-Request-Id`).
    pub request_id: String,
    /// The trade as JSON, with `apiKey` already removed: credentials never travel downstream.
    pub body: Bytes,
}

/// What became of an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx and a JSON body with `success: true`: commit.
    Success { status: u16, body: Bytes },
    /// 2xx but `success` false, missing or unparsable: release. (The HTTP executor holds
    /// the answers that may be a fill's: cut short, saying `"success": true` unparsably,
    /// or `success` as `1` or `"true"`: `http::HttpExecutor::execute`, [`may_be_a_fill`].)
    SoftFail { status: u16, body: Bytes },
    /// Non-2xx but 1xx and 303 (`classify`): release.
    Failed { status: u16, body: Bytes },
    /// Nothing was sent (connect, DNS, refused): release.
    NotSent(String),
    /// The request may have arrived and we do not know what it did (timeout, reset): hold.
    Unknown(String),
}

impl Outcome {
    /// A stable label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Success { .. } => "success",
            Outcome::SoftFail { .. } => "soft_fail",
            Outcome::Failed { .. } => "failed",
            Outcome::NotSent(_) => "not_sent",
            Outcome::Unknown(_) => "unknown",
        }
    }

    /// The executor's status code, when it answered.
    #[cfg(test)]
    pub fn status(&self) -> Option<u16> {
        match self {
            Outcome::Success { status, .. }
            | Outcome::SoftFail { status, .. }
            | Outcome::Failed { status, .. } => Some(*status),
            Outcome::NotSent(_) | Outcome::Unknown(_) => None,
        }
    }
}

/// The outcome rule of SPEC §4 for an executor that answered, in one place for every executor.
pub fn classify(status: u16, body: Bytes) -> Outcome {
    if says_nothing(status) {
        return Outcome::Unknown(format!(
            "answer {status}, which neither fills nor refuses an order: it may have filled"
        ));
    }
    if !is_2xx(status) {
        return Outcome::Failed { status, body };
    }
    let text = json_text(&body);
    if Verdict::object(text) && serde_json::from_slice::<Verdict>(text).is_ok_and(|v| v.filled()) {
        Outcome::Success { status, body }
    } else {
        Outcome::SoftFail { status, body }
    }
}

/// What an answer's `success` says. Only a literal boolean `true` at the top level of a
/// JSON object commits (SPEC §4): a commit stores the answer as the trade's, replayed to
/// every retry. "true" or 1 is not read as SPEC's fill, nor released, but held
/// ([`may_be_a_fill`]: a 504, the outcome unknown); a nested flag is released; an array
/// (`[true]`), which serde's derive reads as the fields in order, is no object.
#[derive(serde::Deserialize)]
struct Verdict {
    success: Option<serde_json::Value>,
}

impl Verdict {
    fn filled(&self) -> bool {
        self.success == Some(serde_json::Value::Bool(true))
    }

    /// Whether the JSON `text` begins an object.
    fn object(text: &[u8]) -> bool {
        text.trim_ascii_start().first() == Some(&b'{')
    }
}

/// The body as a JSON parser should read it. A byte order mark before the JSON is one
/// RFC 8259 lets a parser ignore, and some frameworks write one (.NET's UTF-8 encoder):
/// read as unparsable, a fill behind it would be released, and its retry placed again.
fn json_text(body: &[u8]) -> &[u8] {
    body.strip_prefix("\u{feff}".as_bytes()).unwrap_or(body)
}

/// Whether `body` is one whole JSON document. A document cut short never is: an object or
/// an array lacks its closing bracket, and a bare value is not an answer an executor gives.
pub fn is_json(body: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(json_text(body)).is_ok()
}

/// Whether `body` is a JSON document begun and not finished: cut short, whatever framed
/// it. A `Content-Length` that counts characters, not bytes, ends `{"success":true,
/// "message":"Ordre exécuté"}` short by its accents' extra bytes, and a proxy may cut an
/// answer at a chunk's end: either reads as a whole body whose `success` may have been true. A body
/// that is empty or blank was never begun; text that is no JSON (`hello`, HTML) is not
/// this, nor is a document with more after it.
pub fn is_cut_json(body: &[u8]) -> bool {
    // Cut in its byte order mark, or just after it: begun, and nothing of it read.
    if !body.is_empty() && "\u{feff}".as_bytes().starts_with(body) {
        return true;
    }
    let text = json_text(body);
    let ends_early =
        |t: &[u8]| serde_json::from_slice::<serde::de::IgnoredAny>(t).is_err_and(|e| e.is_eof());
    // Cut inside a number, after its `-`, `.`, `e` or exponent sign, it is no number yet:
    // the parser says "invalid number", not "end of input". A digit more makes it one, and
    // then what is missing is the end (`"price":43250.` cut from `43250.5}`).
    let in_a_number = || {
        matches!(text.last(), Some(b'-' | b'+' | b'.' | b'e' | b'E'))
            && ends_early(&[text, b"0"].concat())
    };
    text.iter().any(|b| !b.is_ascii_whitespace()) && (ends_early(text) || in_a_number())
}

/// Whether `body`, a 2xx that SPEC's rule (`classify`) does not read as a fill, may be
/// a fill's answer all the same:
/// - read whole, an object whose `success` says yes other than as the literal `true`:
///   `1`, `"1"` or `"true"` in any letter case (PHP's `'success' => 1`, a MySQL flag
///   read back as `"1"`, a boolean written as a string). SPEC's table releases a
///   `success` that is false, missing or unparsable; this is none of those, and
///   released, every fill of such an executor was a 502 whose retry was placed again;
/// - read whole, it has no `success` but a member of that name in other letter case that
///   is `true` or says yes as above: `{"Success":true}` is what Go's `encoding/json` and
///   .NET write for a field without a JSON name (and read back, whatever the case);
/// - serde cannot read it whole, and its text says `success`, a colon and `true`, in any
///   letter case, the name in double or single quotes. Python's `json.dumps` writes `NaN`
///   for a price pandas could not compute, `str(dict)` writes `{'success': True}`; JSON
///   made by formatting strings has raw tabs, `\` in paths, trailing commas; a second
///   document or NDJSON follows the first; a key comes twice (JavaScript and Python read
///   the last). A parser cannot see past its error, so the text is searched.
///
/// Read as a soft-fail, each was released and its retry placed again.
pub fn may_be_a_fill(body: &[u8]) -> bool {
    let text = json_text(body);
    match serde_json::from_slice::<Verdict>(text) {
        // An array reads as the fields in order (`["1"]`): no `success` at all.
        Ok(_) if !Verdict::object(text) => false,
        Ok(v) if v.success.is_none() => serde_json::from_slice::<
            serde_json::Map<String, serde_json::Value>,
        >(text)
        .is_ok_and(|members| {
            members.iter().any(|(name, value)| {
                name.eq_ignore_ascii_case("success") && (*value == true || says_yes(value))
            })
        }),
        Ok(v) => v.success.as_ref().is_some_and(says_yes),
        Err(_) => says_success_true(text),
    }
}

/// Whether a `success` value says yes in a form other than the literal `true`: `1`
/// (`1.0`), `"1"`, or `"true"` in any letter case, blanks around it allowed. Not `"yes"`,
/// `"ok"` or any other word: those are an executor's own vocabulary, and SPEC's rule
/// (release) stands for them.
fn says_yes(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Number(n) => n.as_f64() == Some(1.0),
        serde_json::Value::String(s) => {
            let s = s.trim();
            s == "1" || s.eq_ignore_ascii_case("true")
        }
        _ => false,
    }
}

/// Whether `text` says `"success"` (or `'success'`, any letter case), a colon and `true`
/// (any letter case), blanks allowed between; or, as [`says_yes`] reads a whole answer,
/// `"true"`, `1` or `"1"` (in single quotes too).
fn says_success_true(text: &[u8]) -> bool {
    const NAME: &[u8] = b"success";
    text.windows(NAME.len() + 2).enumerate().any(|(at, w)| {
        let (open, close) = (w[0], w[w.len() - 1]);
        let quoted = open == close && matches!(open, b'"' | b'\'');
        if !quoted || !w[1..=NAME.len()].eq_ignore_ascii_case(NAME) {
            return false;
        }
        text[at + w.len()..]
            .trim_ascii_start()
            .strip_prefix(b":")
            .map(|v| v.trim_ascii_start())
            .is_some_and(|v| {
                (v.len() >= 4 && v[..4].eq_ignore_ascii_case(b"true")) || yes_in_text(v)
            })
    })
}

/// Whether a value's text begins as [`says_yes`] reads a whole answer's `success`: a
/// number that is 1 (`1`, `1.0`; not `10`, `1.5` or `1e3`), or a string (in double or
/// single quotes) that is `1` or `true` in any letter case, blanks around it allowed. Read
/// otherwise, `{"success": 1.0, "avgPrice": NaN}` (a pandas column made float by its NaN)
/// was released where `{"success": 1.0}` is held.
fn yes_in_text(v: &[u8]) -> bool {
    match v.first() {
        Some(&q @ (b'"' | b'\'')) => v[1..].iter().position(|&b| b == q).is_some_and(|end| {
            let s = v[1..=end].trim_ascii();
            s == b"1" || s.eq_ignore_ascii_case(b"true")
        }),
        _ => {
            let number =
                |b: &u8| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-');
            let end = v.iter().position(|b| !number(b)).unwrap_or(v.len());
            std::str::from_utf8(&v[..end])
                .ok()
                .and_then(|n| n.parse::<f64>().ok())
                == Some(1.0)
        }
    }
}

fn is_2xx(status: u16) -> bool {
    (200..300).contains(&status)
}

/// Whether `status` neither fills nor refuses an order: an interim status given as the
/// answer (a `101`, which only answers an `Upgrade` the gateway never sends), or `303 See
/// Other`, what a server answers a POST it has processed (RFC 9110 §15.4.4: the result is
/// elsewhere). Either order may have filled, whatever the body says or however it ends;
/// released, its retry was placed again.
fn says_nothing(status: u16) -> bool {
    (100..200).contains(&status) || status == 303
}

/// Whether `status` refuses the order, whatever its body: a non-2xx that is not one of
/// [`says_nothing`]'s.
fn refuses(status: u16) -> bool {
    !is_2xx(status) && !says_nothing(status)
}

/// The configured executor. An enum rather than a trait object: there are two kinds, and this
/// keeps `execute` a plain async fn.
// One executor lives for the whole process, behind an Arc: its size does not matter, and boxing
// the pool would only add an indirection to every order.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Executor {
    Http(HttpExecutor),
    Paper(Paper),
}

impl Executor {
    /// Whether an order may wait on the network before its outcome is known. Only then
    /// can a client that hangs up (dropping the request's future) come between an order
    /// and its commit or release, so only then does the gateway give it a task of its own.
    pub fn may_wait(&self) -> bool {
        match self {
            Executor::Http(_) => true,
            Executor::Paper(_) => false,
        }
    }

    /// The start of an answer, at most `max` bytes of it, with every part of the URL that
    /// may be a credential replaced by `…` (for the log), and whether it was cut. The whole
    /// answer is masked before the cut (at most 1 MiB, and only of an order that did not
    /// fill): masked over a window past the cut, a credential straddling the window's end
    /// was not matched, and the masks before it moved its first bytes under the cut.
    pub fn excerpt(&self, answer: &[u8], max: usize) -> (String, bool) {
        let secrets = match self {
            Executor::Http(http) => http.secrets(),
            Executor::Paper(_) => &[],
        };
        let masked = secrets.iter().fold(
            String::from_utf8_lossy(answer).into_owned(),
            |text, secret| text.replace(secret.as_str(), "…"),
        );
        let mut end = masked.len().min(max);
        while !masked.is_char_boundary(end) {
            end -= 1;
        }
        (masked[..end].to_string(), end < masked.len())
    }

    pub async fn execute(&self, order: &Order) -> Outcome {
        match self {
            Executor::Http(http) => http.execute(order).await,
            Executor::Paper(paper) => paper.execute(order),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fill's answer cut at any byte is JSON cut short: inside a string, an escape, a
    /// character of several bytes, a literal, a number (after its sign, point or
    /// exponent), an array, between members. Whole, or blank, or text that is no JSON, or
    /// a document with more after it, it is not.
    #[test]
    fn an_answer_cut_at_any_byte_is_cut_json() {
        let whole = "\u{feff}{\"success\":true,\"message\":\"Ordre exécuté\",\"price\":43250.5,\
                     \"pnl\":-1.5e-3,\"q\":2E+2,\"tags\":[true,false,null,\"a\\\"b\\u00e9\"],\
                     \"o\":{\"n\":0}}";
        let bytes = whole.as_bytes();
        assert!(is_json(bytes) && !is_cut_json(bytes));
        for end in 1..bytes.len() {
            let cut = &bytes[..end];
            assert!(
                is_cut_json(cut),
                "cut at {end}: {}",
                String::from_utf8_lossy(cut)
            );
        }
        for not in [
            "",
            " \r\n",
            "hello",
            "<html></html>",
            "{\"success\":true} {\"",
            "-",
        ] {
            assert!(!is_cut_json(not.as_bytes()), "{not:?}");
        }
    }

    /// An answer a JSON parser refuses that says `"success": true` (in any letter case,
    /// in single quotes too) may be a fill's, as may a whole one without `success` whose
    /// `Success` is `true`, and one whose `success` says yes as `1`, `"1"` or `"true"`;
    /// one that does not say it, or whose `success` says no, is not.
    #[test]
    fn an_answer_that_says_success_true_as_spec_does_not_read_it_may_be_a_fill() {
        for says in [
            "{\"success\":true} {\"",
            "{\"success\":true}\n{\"status\":\"filled\"}\n",
            "\u{feff}{\"success\":true}}",
            "{\"success\": true, \"orderId\": \"N1\", \"avgPrice\": NaN}",
            "{\"avgPrice\": NaN, \"success\" : true}",
            "{\"success\":true,\"pnl\":-Infinity}",
            "{\"success\":true,\"path\":\"C:\\path\"}",
            "{\"success\":true,\"note\":\"a\tb\"}",
            "{\"success\":true,}",
            "{/* filled */ \"success\":true}",
            "{\"success\":false,\"success\":true}",
            "{\"success\":true,\"success\":false}",
            // Go's encoding/json and .NET, a field without a JSON name; Python's str(dict).
            "{\"Success\":true,\"OrderID\":\"m-1\"}",
            "{\"SUCCESS\": true}",
            "{'success': True, 'orderId': 'x'}",
            "{\"success\":TRUE,}",
            // Yes, but not as the literal `true`: PHP's 1, a flag read back as "1", a
            // boolean written as a string; whole, or not one document.
            "{\"success\":1,\"orderId\":\"p-1\"}",
            "{\"success\":1.0}",
            "{\"success\":\"1\"}",
            "{\"success\":\"true\"}",
            "{\"success\":\" True \"}",
            "\u{feff}{\"success\":\"TRUE\"}",
            "{\"Success\":\"true\"}",
            "{\"SUCCESS\":1}",
            "{\"success\":\"true\"} x",
            "{\"success\": 1, \"avgPrice\": NaN}",
            "{\"success\":1}\n{}",
            "{'success': '1'}",
            // As a whole answer's are read: 1 as a float, blanks inside the quotes.
            "{\"success\": 1.0, \"avgPrice\": NaN}",
            "{\"success\":1e0} x",
            "{\"success\":\"1 \"} x",
            "{'success': ' True '} x",
        ] {
            assert!(may_be_a_fill(says.as_bytes()), "{says:?}");
        }
        for not in [
            "{\"success\":true}",
            "{\"success\":false,\"data\":{\"success\":true}}",
            "[{\"success\":true}]",
            "{\"success\":false} x",
            "{\"ok\":true}\n{}",
            // `success` itself says no; `Success` nested, or false; another name.
            "{\"success\":false,\"Success\":true}",
            "{\"data\":{\"Success\":true}}",
            "{\"Success\":false}",
            "{\"successful\":true} x",
            // No, or a word of the executor's own, or another number: SPEC's release.
            "{\"success\":0}",
            "{\"success\":\"0\"}",
            "{\"success\":\"false\"}",
            "{\"success\":\"yes\"}",
            "{\"success\":\"truex\"}",
            "{\"success\":2}",
            "{\"success\":null}",
            "{\"success\":[1]}",
            "{\"data\":{\"success\":1}}",
            "[\"1\"]",
            "[1]",
            "{\"success\":10} x",
            "{\"success\":1.5} x",
            "{\"success\":1e3} x",
            "{\"success\":\"truex\"} x",
            "{\"success\":\"1x\"} x",
            "{\"success\":-1} x",
            "{\"success\":\"1 1\"} x",
            "{'success': False} x",
            "hello",
            "",
        ] {
            assert!(!may_be_a_fill(not.as_bytes()), "{not:?}");
        }
    }

    fn kind(o: &Outcome) -> &'static str {
        o.label()
    }

    #[test]
    fn classify_follows_the_table() {
        let cases: &[(u16, &str, &str)] = &[
            (200, r#"{"success":true}"#, "success"),
            (201, r#"{"success":true,"orderId":"x"}"#, "success"),
            (299, r#"{"success":true}"#, "success"),
            (200, r#"{"success":false}"#, "soft_fail"),
            (200, r#"{"orderId":"x"}"#, "soft_fail"),
            (200, r#"{"success":"true"}"#, "soft_fail"),
            (200, r#"{"success":1}"#, "soft_fail"),
            (200, r#"{"data":{"success":true}}"#, "soft_fail"),
            (200, r#"[{"success":true}]"#, "soft_fail"),
            // An array, which serde's derive reads as the fields in order: no `success`.
            (200, "[true]", "soft_fail"),
            (200, " [true]", "soft_fail"),
            (200, "not json", "soft_fail"),
            (200, "\u{feff}{\"success\":true}", "success"),
            (200, "\u{feff}{\"success\":false}", "soft_fail"),
            (200, "\u{feff}\u{feff}{\"success\":true}", "soft_fail"),
            (204, "", "soft_fail"),
            (199, r#"{"success":true}"#, "unknown"),
            (101, "", "unknown"),
            (303, "", "unknown"),
            (300, r#"{"success":true}"#, "failed"),
            (302, "", "failed"),
            (307, "", "failed"),
            (400, r#"{"success":false}"#, "failed"),
            (500, r#"{"success":true}"#, "failed"),
        ];
        for (status, body, want) in cases {
            let got = classify(*status, Bytes::from_static(body.as_bytes()));
            assert_eq!(kind(&got), *want, "{status} {body}");
            let status = (*want != "unknown").then_some(*status);
            assert_eq!(got.status(), status);
        }
    }

    #[test]
    fn classify_keeps_the_body() {
        let body = Bytes::from_static(br#"{"success":true,"orderId":"7"}"#);
        assert_eq!(
            classify(200, body.clone()),
            Outcome::Success { status: 200, body }
        );
    }
}
