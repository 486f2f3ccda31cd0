//! Every error answer of the webhook: RFC 9457 `application/problem+json` with a stable
//! `code` (SPEC §3). Clients branch on `code`, never on `title` or `detail`. The admin face
//! builds its errors with [`document`] and [`respond`] too.
//!
//! `type` is `about:blank`, so `title` is the status's reason phrase as RFC 9457 §4.2.1
//! asks; what went wrong is in `code` and `detail`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::{Value, json};

/// What a client is told to wait while the mutex is failing closed: the owner retries
/// the database with a backoff of a few seconds, so a short wait is honest. At capacity,
/// the wait is until the next key's expiry instead, up to [`CAPACITY_RETRY_AFTER_MAX_S`]
/// ([`Problem::at_capacity`]).
pub const UNAVAILABLE_RETRY_AFTER_S: u64 = 1;
/// The longest wait a full gateway advises: a place freed by a release (a failed order's,
/// an operator's) comes unannounced, and a trade told to wait for the next expiry, up to
/// a TTL, would wait that long for a place that freed at once.
pub const CAPACITY_RETRY_AFTER_MAX_S: u64 = 5;
/// What a client is told to wait while the operator's kill switch is on. Nobody knows
/// when it will be lifted; this only keeps retry storms polite.
pub const KILL_SWITCH_RETRY_AFTER_S: u64 = 30;
/// Why a trade is refused (503) while `server.max_connections` orders are at the executor.
pub const ORDERS_IN_FLIGHT: &str = "orders_in_flight";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// Bad JSON or schema; the detail names the field.
    InvalidRequest(String),
    InvalidIdempotencyKey(String),
    /// The header and the body carry different keys.
    IdempotencyKeyConflict,
    /// `require_client_key` is on and the request has no key.
    IdempotencyKeyRequired,
    /// Deliberately carries nothing: the client must not learn which credential failed.
    AuthFailed,
    IpForbidden,
    NotFound,
    MethodNotAllowed,
    PayloadTooLarge,
    UnsupportedMediaType,
    /// A body in a content or transfer coding the gateway does not decode (gzip): its
    /// JSON cannot be read, and a 400 "not JSON" would send its sender looking elsewhere.
    UnsupportedCoding(String),
    /// A body said to be in a charset the gateway does not read it in (it reads UTF-8):
    /// its detail, made by [`Problem::charset_unread`] or [`Problem::charset_not_ascii`].
    UnsupportedCharset(String),
    Duplicate {
        /// The stored key as text, not a `Key`: that holds 384 bytes inline, which every
        /// `Result<_, Problem>` would then carry.
        key: String,
        state: &'static str,
        /// Where the first delivery's order is ([`order_state`]): `in_flight` (it
        /// may still be at the executor), `unknown` or `succeeded`. `state` alone said `pending` both while the order
        /// was at the executor and after its outcome was lost (a 504, held): a sender that
        /// took the one for the other dropped a trade, or placed it again.
        order: &'static str,
        age_ms: u64,
        expires_in_ms: u64,
    },
    /// The same client key came with a different trade.
    KeyReused,
    RateLimited {
        retry_after_s: u64,
    },
    ExecutionFailed(String),
    ExecutorUnreachable,
    /// The mutex cannot guarantee at-most-once: `reason` is a stable label.
    Unavailable {
        reason: &'static str,
        retry_after_s: u64,
    },
    KillSwitch,
    OutcomeUnknown,
}

impl Problem {
    /// A rate-limit answer from the limiter's wait, rounded up to whole seconds (at least
    /// one: `Retry-After: 0` would invite an immediate retry that is refused again).
    pub fn rate_limited(wait: Duration) -> Self {
        Problem::RateLimited {
            retry_after_s: whole_seconds(wait),
        }
    }

    /// A refusal for `reason` that a second may mend: failing closed (the owner reopens
    /// with a backoff of a few seconds), stopping, or [`ORDERS_IN_FLIGHT`] (one ends
    /// within the executor's timeout).
    pub fn unavailable(reason: &'static str) -> Self {
        Problem::Unavailable {
            reason,
            retry_after_s: UNAVAILABLE_RETRY_AFTER_S,
        }
    }

    /// A refusal at `limits.capacity`: a sender is told to wait until the next key's
    /// alarm, `next_free` (never later than the next expiry: an alarm left by a released
    /// key, or one a lap of the wheel ahead, is earlier), but at most
    /// [`CAPACITY_RETRY_AFTER_MAX_S`], for a release frees a place sooner. Without an
    /// alarm to go by (none set), a second.
    pub fn at_capacity(next_free: Option<Duration>) -> Self {
        Problem::Unavailable {
            reason: crate::mutex::Unavailable::Capacity.reason(),
            retry_after_s: next_free.map_or(UNAVAILABLE_RETRY_AFTER_S, |wait| {
                whole_seconds(wait).min(CAPACITY_RETRY_AFTER_MAX_S)
            }),
        }
    }

    pub fn status(&self) -> StatusCode {
        use Problem::*;
        match self {
            InvalidRequest(_)
            | InvalidIdempotencyKey(_)
            | IdempotencyKeyConflict
            | IdempotencyKeyRequired => StatusCode::BAD_REQUEST,
            AuthFailed => StatusCode::UNAUTHORIZED,
            IpForbidden => StatusCode::FORBIDDEN,
            NotFound => StatusCode::NOT_FOUND,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            UnsupportedMediaType | UnsupportedCoding(_) | UnsupportedCharset(_) => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            Duplicate { .. } => StatusCode::CONFLICT,
            KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ExecutionFailed(_) | ExecutorUnreachable => StatusCode::BAD_GATEWAY,
            Unavailable { .. } | KillSwitch => StatusCode::SERVICE_UNAVAILABLE,
            OutcomeUnknown => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The stable machine-readable code of SPEC §3.
    pub fn code(&self) -> &'static str {
        use Problem::*;
        match self {
            InvalidRequest(_) => "INVALID_REQUEST",
            InvalidIdempotencyKey(_) => "INVALID_IDEMPOTENCY_KEY",
            IdempotencyKeyConflict => "IDEMPOTENCY_KEY_CONFLICT",
            IdempotencyKeyRequired => "IDEMPOTENCY_KEY_REQUIRED",
            AuthFailed => "AUTH_FAILED",
            IpForbidden => "IP_FORBIDDEN",
            NotFound => "NOT_FOUND",
            MethodNotAllowed => "METHOD_NOT_ALLOWED",
            PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            UnsupportedMediaType | UnsupportedCoding(_) | UnsupportedCharset(_) => {
                "UNSUPPORTED_MEDIA_TYPE"
            }
            Duplicate { .. } => "DUPLICATE",
            KeyReused => "IDEMPOTENCY_KEY_REUSED",
            RateLimited { .. } => "RATE_LIMITED",
            ExecutionFailed(_) => "EXECUTION_FAILED",
            ExecutorUnreachable => "EXECUTOR_UNREACHABLE",
            Unavailable { .. } => "IDEMPOTENCY_UNAVAILABLE",
            KillSwitch => "KILL_SWITCH",
            OutcomeUnknown => "EXECUTION_OUTCOME_UNKNOWN",
        }
    }

    /// Seconds for the `Retry-After` header, on the answers that carry one.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Problem::RateLimited { retry_after_s } => Some(*retry_after_s),
            Problem::Unavailable { retry_after_s, .. } => Some(*retry_after_s),
            Problem::KillSwitch => Some(KILL_SWITCH_RETRY_AFTER_S),
            _ => None,
        }
    }

    /// What the log line adds to its code: the detail of a request refused for its
    /// content, which only the sender saw (a TradingView alert's sender shows its user
    /// little, and retries nothing). Other codes say it all.
    pub fn reason(&self) -> Option<String> {
        match self {
            Problem::InvalidRequest(_)
            | Problem::InvalidIdempotencyKey(_)
            | Problem::UnsupportedCharset(_)
            | Problem::UnsupportedCoding(_) => Some(self.detail()),
            _ => None,
        }
    }

    /// A charset that is not one the gateway reads a body in (UTF-8, or one that agrees
    /// with it on ASCII): refused whatever the body.
    pub fn charset_unread(charset: &str) -> Problem {
        Self::charset(
            charset,
            "which the gateway does not read: it reads, and the executor gets, UTF-8",
        )
    }

    /// A charset that agrees with UTF-8 on ASCII, for a body with bytes outside it.
    pub fn charset_not_ascii(charset: &str) -> Problem {
        Self::charset(
            charset,
            "and not ASCII: the gateway reads it, and the executor gets it, as UTF-8",
        )
    }

    /// The charset as sent (its first 40 characters), why it is refused, and what to do.
    fn charset(charset: &str, why: &str) -> Problem {
        let shown: String = charset.chars().take(40).collect();
        Problem::UnsupportedCharset(format!(
            "body said to be in charset {shown:?}, {why}: send it as UTF-8 (charset=utf-8, \
             or none)"
        ))
    }

    pub fn detail(&self) -> String {
        use Problem::*;
        match self {
            InvalidRequest(d) | InvalidIdempotencyKey(d) => d.clone(),
            IdempotencyKeyConflict => {
                "the Idempotency-Key header and the body's idempotencyKey differ".into()
            }
            IdempotencyKeyRequired => "an idempotency key is required".into(),
            AuthFailed => "authentication failed".into(),
            IpForbidden => "source address not allowed".into(),
            NotFound => "no such resource; POST trades to /webhook".into(),
            MethodNotAllowed => "use POST".into(),
            PayloadTooLarge => "body larger than 64 KiB".into(),
            UnsupportedMediaType => {
                "body must be JSON, sent as application/json, a +json type, text/plain or \
                 with no Content-Type"
                    .into()
            }
            UnsupportedCoding(c) => format!(
                "body sent in the coding {:?}, which the gateway does not decode: send the \
                 JSON as it is (no Content-Encoding; Transfer-Encoding chunked at most)",
                // A header of any length: its start is enough to name it.
                c.chars().take(40).collect::<String>()
            ),
            UnsupportedCharset(d) => d.clone(),
            Duplicate {
                key, state, order, ..
            } => {
                // Held by its signature's guard, not by the trade's key (docs/DESIGN.md):
                // the very request, resent. A new trade with the same body is told what
                // tells it apart, without being told to send anything again: a key in its
                // body (README, "Keys"). Not a new signature: that would tell a sender
                // whose resend this is to sign it again, and a trade with no key of its
                // own, signed again past its fingerprint's minute, is placed again.
                let guard = crate::mutex::key::is_guard(key);
                let what = if guard {
                    "this signed request (the same body, signed in the same second)"
                } else {
                    "this trade"
                };
                let next = match *order {
                    "in_flight" => {
                        "its order may still be at the executor: send it again in a few \
                         seconds for its outcome"
                    }
                    // Without a key of its own, resending it as a new trade meets this
                    // one until its key expires or an operator releases it.
                    "unknown" if key.starts_with("trade:") => {
                        "its order's outcome is unknown (the executor did not answer, or \
                         the gateway stopped before writing it): check the exchange before \
                         sending it again with a key of its own (idempotencyKey); without \
                         one, the same trade is held as this one's duplicate until the key \
                         expires (expires_in_ms) or an operator releases it (hoox-edge keys \
                         release)"
                    }
                    "unknown" => {
                        "its order's outcome is unknown (the executor did not answer, or \
                         the gateway stopped before writing it): check the exchange before \
                         sending it as a new trade"
                    }
                    _ => "the executor took its order",
                };
                let new = if guard {
                    "; a new trade with the same body needs a key of its own in the body \
                     (idempotencyKey)"
                } else {
                    ""
                };
                format!("{what} was already accepted ({state}): {next}{new}")
            }
            KeyReused => "this idempotency key was used with a different trade".into(),
            RateLimited { retry_after_s } => {
                format!("rate limit exceeded; retry in {retry_after_s} s")
            }
            ExecutionFailed(d) => format!("the executor did not confirm a fill: {d}"),
            ExecutorUnreachable => "the executor could not be reached; nothing was sent".into(),
            Unavailable {
                reason: ORDERS_IN_FLIGHT,
                ..
            } => format!(
                "as many orders as server.max_connections are at the executor \
                 ({ORDERS_IN_FLIGHT}); this request was refused, nothing was reserved or \
                 sent for it (a resend of an order that is out may be one of them: once \
                 one ends, a duplicate is answered 409)"
            ),
            Unavailable { reason, .. } => {
                format!("idempotency cannot be guaranteed ({reason}); the trade was refused")
            }
            KillSwitch => "trading is halted by the operator".into(),
            OutcomeUnknown => {
                // Held or released by `on_unknown_outcome`: Hoox-Idempotency-Outcome says which.
                // Whatever cut it (a timeout, a reset, an answer that could not be read),
                // the order had left: the log line says which.
                "no answer the gateway could read whole came back from the executor after \
                 the order was sent (a timeout, a reset, an answer cut short, too large or \
                 in a coding it does not read); the trade may have been placed"
                    .into()
            }
        }
    }

    /// The problem document.
    pub fn body(&self) -> Value {
        let mut doc = document(self.status(), self.code(), self.detail());
        if let Problem::Duplicate {
            key,
            state,
            order,
            age_ms,
            expires_in_ms,
        } = self
        {
            doc["key"] = json!(key);
            doc["state"] = json!(state);
            doc["order"] = json!(order);
            doc["age_ms"] = json!(age_ms);
            doc["expires_in_ms"] = json!(expires_in_ms);
        }
        if let Some(s) = self.retry_after() {
            doc["retry_after_s"] = json!(s);
        }
        doc
    }

    pub fn response(&self) -> Response<Full<Bytes>> {
        let mut res = respond(self.status(), &self.body());
        let h = res.headers_mut();
        if let Some(s) = self.retry_after() {
            h.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        match self {
            // RFC 9110 §15.5.6: a 405 lists the allowed methods.
            Problem::MethodNotAllowed => {
                h.insert(header::ALLOW, HeaderValue::from_static("POST"));
            }
            // RFC 9110 §15.5.2 asks for a challenge. A neutral one names no method, so it
            // says nothing about which credential was missing or wrong.
            Problem::AuthFailed => {
                h.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Hoox realm=\"hoox-edge\""),
                );
            }
            _ => {}
        }
        res
    }
}

/// The members every problem document has, the webhook's and the admin face's alike; a
/// caller adds its own (`key`, `reason`, `retry_after_s`, ...) to what this returns. One
/// builder, so that the two faces cannot drift apart.
///
/// `title` falls back to "Error" for a status without a reason phrase (none we send):
/// RFC 9457 makes `title` a human-readable summary, which an empty string is not.
pub fn document(status: StatusCode, code: &str, detail: impl Into<String>) -> Value {
    json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "code": code,
        "detail": detail.into(),
    })
}

/// The answer that carries `doc`, for both faces.
pub fn respond(status: StatusCode, doc: &Value) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from(doc.to_string())));
    *res.status_mut() = status;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    // An error is about this one request: no cache may keep it.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

/// Where an entry's order is, as a 409 and `keys show` say it: `succeeded` (committed),
/// `in_flight` (`out`: an order bound to the entry is at the executor), or `unknown`: the
/// entry is pending with no order out, its outcome not known (a 504, held), or not
/// written before the gateway stopped.
pub fn order_state(state: crate::mutex::State, out: bool) -> &'static str {
    match state {
        crate::mutex::State::Committed => "succeeded",
        _ if out => "in_flight",
        _ => "unknown",
    }
}

impl Problem {
    /// A duplicate of `d`, its key as stored (namespace included): the same string the
    /// `Idempotency-Key` answer header, the executor and the operator's `hoox-edge keys`
    /// use; `order` as [`order_state`] says it.
    pub fn duplicate(d: &crate::mutex::Duplicate, order: &'static str) -> Self {
        Problem::Duplicate {
            key: d.key.as_str().to_owned(),
            state: d.state.as_str(),
            order,
            age_ms: d.age_ms,
            expires_in_ms: d.expires_in_ms,
        }
    }
}

impl From<&crate::mutex::Unavailable> for Problem {
    fn from(u: &crate::mutex::Unavailable) -> Self {
        Problem::unavailable(u.reason())
    }
}

/// `wait` rounded up to whole seconds, at least one: `Retry-After: 0` would invite an
/// immediate retry that is refused again.
fn whole_seconds(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

impl From<super::auth::AuthError> for Problem {
    /// Every failure is the same answer; the reason is for the log line only.
    fn from(_: super::auth::AuthError) -> Self {
        Problem::AuthFailed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn all() -> Vec<Problem> {
        use Problem::*;
        vec![
            InvalidRequest("field `quantity` is required".into()),
            InvalidIdempotencyKey("bad".into()),
            IdempotencyKeyConflict,
            IdempotencyKeyRequired,
            AuthFailed,
            IpForbidden,
            NotFound,
            MethodNotAllowed,
            PayloadTooLarge,
            UnsupportedMediaType,
            UnsupportedCoding("gzip".into()),
            Duplicate {
                key: "k".into(),
                state: "pending",
                order: "in_flight",
                age_ms: 5,
                expires_in_ms: 7,
            },
            KeyReused,
            RateLimited { retry_after_s: 3 },
            ExecutionFailed("insufficient margin".into()),
            ExecutorUnreachable,
            Unavailable {
                reason: "busy",
                retry_after_s: 1,
            },
            KillSwitch,
            OutcomeUnknown,
        ]
    }

    async fn body_of(p: &Problem) -> (hyper::Response<Full<Bytes>>, Value) {
        let res = p.response();
        let (parts, body) = res.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        (hyper::Response::from_parts(parts, Full::new(bytes)), v)
    }

    #[test]
    fn codes_and_statuses_match_the_spec_table() {
        let table: Vec<(u16, &str)> = all()
            .iter()
            .map(|p| (p.status().as_u16(), p.code()))
            .collect();
        assert_eq!(
            table,
            vec![
                (400, "INVALID_REQUEST"),
                (400, "INVALID_IDEMPOTENCY_KEY"),
                (400, "IDEMPOTENCY_KEY_CONFLICT"),
                (400, "IDEMPOTENCY_KEY_REQUIRED"),
                (401, "AUTH_FAILED"),
                (403, "IP_FORBIDDEN"),
                (404, "NOT_FOUND"),
                (405, "METHOD_NOT_ALLOWED"),
                (413, "PAYLOAD_TOO_LARGE"),
                (415, "UNSUPPORTED_MEDIA_TYPE"),
                (415, "UNSUPPORTED_MEDIA_TYPE"),
                (409, "DUPLICATE"),
                (422, "IDEMPOTENCY_KEY_REUSED"),
                (429, "RATE_LIMITED"),
                (502, "EXECUTION_FAILED"),
                (502, "EXECUTOR_UNREACHABLE"),
                (503, "IDEMPOTENCY_UNAVAILABLE"),
                (503, "KILL_SWITCH"),
                (504, "EXECUTION_OUTCOME_UNKNOWN"),
            ]
        );
    }

    #[tokio::test]
    async fn every_answer_is_a_problem_document() {
        for p in all() {
            let (res, v) = body_of(&p).await;
            assert_eq!(res.status(), p.status());
            assert_eq!(
                res.headers()[header::CONTENT_TYPE],
                "application/problem+json"
            );
            assert_eq!(res.headers()[header::CACHE_CONTROL], "no-store");
            assert_eq!(v["type"], "about:blank");
            assert_eq!(v["status"], p.status().as_u16());
            assert_eq!(v["code"], p.code());
            assert_eq!(v["title"], p.status().canonical_reason().unwrap());
            assert!(v["detail"].as_str().is_some_and(|d| !d.is_empty()));
            // Only the answers that say "come back later" carry Retry-After (SPEC §3).
            assert_eq!(
                res.headers().contains_key(header::RETRY_AFTER),
                matches!(p.status().as_u16(), 429 | 503),
                "{p:?}"
            );
        }
    }

    fn retry_after_s(res: &hyper::Response<Full<Bytes>>) -> u64 {
        res.headers()[header::RETRY_AFTER]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    #[tokio::test]
    async fn retry_after_on_429_and_503() {
        let (res, _) = body_of(&Problem::RateLimited { retry_after_s: 3 }).await;
        assert_eq!(retry_after_s(&res), 3);
        // A zero would tell every sender to retry at once, in a tight loop.
        let (res, _) = body_of(&Problem::KillSwitch).await;
        assert!(retry_after_s(&res) >= 1);
        let u = crate::mutex::Unavailable::Busy;
        let (res, v) = body_of(&Problem::from(&u)).await;
        assert_eq!(retry_after_s(&res), UNAVAILABLE_RETRY_AFTER_S);
        assert!(v["detail"].as_str().unwrap().contains("busy"));
        // At capacity: until the next key's alarm, rounded up, at most the bound; a second
        // without one.
        let full = Problem::at_capacity(Some(Duration::from_millis(3_200)));
        let (res, v) = body_of(&full).await;
        assert_eq!(retry_after_s(&res), 4);
        assert!(v["detail"].as_str().unwrap().contains("capacity"), "{v}");
        let far = Problem::at_capacity(Some(Duration::from_secs(300)));
        let (res, _) = body_of(&far).await;
        assert_eq!(retry_after_s(&res), CAPACITY_RETRY_AFTER_MAX_S);
        let (res, _) = body_of(&Problem::at_capacity(Some(Duration::ZERO))).await;
        assert_eq!(retry_after_s(&res), 1);
        let (res, _) = body_of(&Problem::at_capacity(None)).await;
        assert_eq!(retry_after_s(&res), UNAVAILABLE_RETRY_AFTER_S);
    }

    #[tokio::test]
    async fn duplicate_carries_the_key_and_its_age() {
        let (_, v) = body_of(&Problem::Duplicate {
            key: "order-1".into(),
            state: "committed",
            order: "succeeded",
            age_ms: 1500,
            expires_in_ms: 298_500,
        })
        .await;
        assert_eq!(v["key"], "order-1");
        assert_eq!(v["state"], "committed");
        assert_eq!(v["order"], "succeeded");
        assert_eq!(v["age_ms"], 1500);
        assert_eq!(v["expires_in_ms"], 298_500);
        assert_eq!(
            v["detail"],
            "this trade was already accepted (committed): the executor took its order"
        );
        // Held by a signature's guard: the very request, resent. A new trade with the same
        // body is told what tells it apart: a key in the body, which the signature covers
        // (one in the header it does not), and which keeps its own retries apart.
        let (_, v) = body_of(&Problem::Duplicate {
            key: "sig:0123456789abcdef0123456789abcdef".into(),
            state: "pending",
            order: "in_flight",
            age_ms: 10,
            expires_in_ms: 1_000,
        })
        .await;
        let detail = v["detail"].as_str().unwrap();
        assert!(
            detail.starts_with("this signed request (the same body, signed in the same second)")
                && detail.contains("(pending): its order may still be at the executor")
                && detail.ends_with(
                    "a new trade with the same body needs a key of its own in the body \
                     (idempotencyKey)"
                )
                && !detail.contains("signature"),
            "{detail}"
        );
        // A keyless trade held after a 504: resending it as a new trade meets this one.
        let held = |key: &str| Problem::Duplicate {
            key: key.into(),
            state: "pending",
            order: "unknown",
            age_ms: 90_000,
            expires_in_ms: 210_000,
        };
        let (_, v) = body_of(&held("trade:binance:BTCUSDT:LONG:1:live:29943528")).await;
        let detail = v["detail"].as_str().unwrap();
        assert!(
            detail.contains("the same trade is held as this one's duplicate")
                && detail.contains("hoox-edge keys release"),
            "{detail}"
        );
        let (_, v) = body_of(&held("client:psk:live:order-1")).await;
        let detail = v["detail"].as_str().unwrap();
        assert!(detail.ends_with("check the exchange before sending it as a new trade"));
    }

    #[tokio::test]
    async fn auth_failure_gives_no_hint() {
        let (res, v) = body_of(&Problem::AuthFailed).await;
        let detail = v["detail"].as_str().unwrap().to_ascii_lowercase();
        for word in ["hmac", "bearer", "api", "signature", "timestamp", "cert"] {
            assert!(!detail.contains(word), "{detail}");
        }
        let challenge = res.headers()[header::WWW_AUTHENTICATE].to_str().unwrap();
        assert!(!challenge.to_ascii_lowercase().contains("bearer"));
    }

    #[test]
    fn conversions_from_the_mutex_and_auth() {
        use crate::mutex::{ClientKey, Key, Mode, State};
        let k = Key::client("psk", Mode::Live, &ClientKey::parse("order-9").unwrap()).unwrap();
        let mut d = crate::mutex::Duplicate {
            key: k,
            state: State::Committed,
            age_ms: 10,
            expires_in_ms: 20,
            response: None,
            seq: 3,
            follows: None,
            guarded: false,
        };
        assert_eq!(
            Problem::duplicate(&d, order_state(d.state, false)),
            Problem::Duplicate {
                key: "client:psk:live:order-9".into(),
                state: "committed",
                order: "succeeded",
                age_ms: 10,
                expires_in_ms: 20
            }
        );
        // Pending: at the executor while an order bound to it is out, unknown without.
        d.state = State::Pending;
        assert_eq!(order_state(d.state, true), "in_flight");
        assert_eq!(order_state(d.state, false), "unknown");
        assert_eq!(order_state(State::Committed, true), "succeeded");
        let u = crate::mutex::Unavailable::Busy;
        assert_eq!(
            Problem::from(&u),
            Problem::Unavailable {
                reason: "busy",
                retry_after_s: UNAVAILABLE_RETRY_AFTER_S
            }
        );
        for e in [
            super::super::auth::AuthError::Missing,
            super::super::auth::AuthError::Invalid,
            super::super::auth::AuthError::Expired,
        ] {
            assert_eq!(Problem::from(e), Problem::AuthFailed);
        }
    }

    #[test]
    fn method_not_allowed_lists_post() {
        assert_eq!(
            Problem::MethodNotAllowed.response().headers()[header::ALLOW],
            "POST"
        );
    }

    #[test]
    fn rate_limited_rounds_up_to_whole_seconds() {
        let s = |d| match Problem::rate_limited(d) {
            Problem::RateLimited { retry_after_s } => retry_after_s,
            _ => unreachable!(),
        };
        assert_eq!(s(Duration::from_millis(1)), 1);
        assert_eq!(s(Duration::ZERO), 1);
        assert_eq!(s(Duration::from_millis(1000)), 1);
        assert_eq!(s(Duration::from_millis(1001)), 2);
        assert_eq!(s(Duration::from_secs(7)), 7);
    }

    #[test]
    fn detail_with_quotes_stays_valid_json() {
        let p = Problem::InvalidRequest("field `x\"}` is \\ odd".into());
        let v: Value = serde_json::from_str(&p.body().to_string()).unwrap();
        assert_eq!(v["detail"], "field `x\"}` is \\ odd");
    }
}
