//! What the CLI uses to talk to a running gateway's admin face, and the one percent-encoding
//! of keys that both sides share.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpStream, UnixStream};

use super::Listen;

/// How long one admin call may take, connect to last byte. The admin face answers from
/// memory or from the owner: a release waits for it twice (the look, then the release) and
/// for an order's mark in between, 16 s at the longest `store.timeout` (5 s, and 6 s for a
/// mark). Anything slower means it is stuck.
pub const TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address comes from the config file as it is now, or `--admin`: a gateway
    /// started before `[admin] listen` was changed still listens where it was.
    #[error(
        "cannot connect to the admin listener at {at}: {source} (is the gateway running? \
         it listens where `[admin] listen` said when it started, until a restart; --admin \
         names another address)"
    )]
    Connect {
        at: String,
        #[source]
        source: std::io::Error,
    },
    /// What answered is not an HTTP server: most likely the webhook listener, which speaks
    /// TLS, named where the admin listener was meant.
    #[error(
        "what listens at {at} does not answer in plain HTTP, so it is not the admin listener \
         (the webhook listener speaks TLS): give `[admin] listen` of config.toml, or --admin"
    )]
    NotHttp { at: String },
    /// The connection ended with no answer. The face closes connections past its bound and
    /// its busy answers unread (a flood), and a gateway that stops or dies closes its own,
    /// perhaps after acting: so whether the command was applied is not known here. Said as
    /// hyper's word, it read "operation was canceled", which tells an operator nothing.
    #[error(
        "the admin listener at {at} closed the connection without an answer: it closes \
         connections past {flood} open at once unread (close idle ones, such as a script's \
         kept-alive connections), and a gateway that stops closes its own, perhaps after \
         acting; see `hoox-edge status` before running the command again",
        flood = super::MAX_CONNECTIONS + super::MAX_TOLD_BUSY
    )]
    Closed { at: String },
    #[error("admin request failed: {0}")]
    Http(#[from] hyper::Error),
    /// The request cannot be made from what was given: in practice a key or an entry tag
    /// too long for a URL (the `http` crate takes up to 64 KiB).
    #[error(
        "the request cannot be made ({0}): a key or --entry that long is no key the gateway \
         keeps ({max} bytes at most)",
        max = crate::mutex::key::MAX_KEY
    )]
    Request(#[from] hyper::http::Error),
    #[error("the admin listener did not answer within {0:?}")]
    Timeout(Duration),
}

/// One request to the admin face: `(status, body)`.
pub async fn request(
    listen: &Listen,
    method: &str,
    path: &str,
) -> Result<(u16, String), ClientError> {
    match tokio::time::timeout(TIMEOUT, request_inner(listen, method, path)).await {
        Ok(r) => r,
        Err(_) => Err(ClientError::Timeout(TIMEOUT)),
    }
}

async fn request_inner(
    listen: &Listen,
    method: &str,
    path: &str,
) -> Result<(u16, String), ClientError> {
    let connect = |source| ClientError::Connect {
        at: listen.to_string(),
        source,
    };
    let answer = match listen {
        Listen::Tcp(addr) => {
            let io = TcpStream::connect(addr).await.map_err(connect)?;
            send(TokioIo::new(io), method, path).await
        }
        Listen::Unix(path_) => {
            let io = UnixStream::connect(path_).await.map_err(connect)?;
            send(TokioIo::new(io), method, path).await
        }
    };
    answer.map_err(|e| match e {
        ClientError::Http(h) if h.is_parse() => ClientError::NotHttp {
            at: listen.to_string(),
        },
        ClientError::Http(h) if closed_unanswered(&h) => ClientError::Closed {
            at: listen.to_string(),
        },
        e => e,
    })
}

/// Whether `e` is the peer closing the connection before its answer was read whole: hyper
/// says so as a request canceled, a message cut short, or the socket's own reset.
fn closed_unanswered(e: &hyper::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset, UnexpectedEof};
    e.is_canceled()
        || e.is_incomplete_message()
        || std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(|io| matches!(io.kind(), ConnectionReset | BrokenPipe | UnexpectedEof))
}

async fn send<T>(io: T, method: &str, path: &str) -> Result<(u16, String), ClientError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
    // The connection future drives the socket; it ends when the answer is read and the
    // sender is dropped.
    let driver = tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "localhost")
        .body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    drop(sender);
    driver.abort();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Encodes a stored key as one path segment. Unreserved characters and `:` (legal in a
/// path segment, and the key's own separator) are kept, so that a URL stays readable;
/// everything else, `/` and `%` included, becomes `%XX`.
///
/// The fingerprint's own escaping (`mutex::key::escape`) keeps `/` and escapes `:`, the
/// reverse of what a path segment needs; its reasons are there.
pub fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b':') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(char::from(HEX[(b >> 4) as usize]));
            out.push(char::from(HEX[(b & 0xf) as usize]));
        }
    }
    out
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Decodes a percent-encoded path segment. Strict: a `%` not followed by two hex digits,
/// or bytes that are not UTF-8, are refused rather than guessed at. `+` is not a space in
/// a path.
pub fn decode_key(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hi = hex_value(bytes.next()?)?;
            let lo = hex_value(bytes.next()?)?;
            out.push(hi << 4 | lo);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

fn hex_value(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keys_stay_readable() {
        assert_eq!(
            encode_key("client:psk:live:order-1"),
            "client:psk:live:order-1"
        );
        assert_eq!(
            encode_key("client:a:live:x/y z%"),
            "client:a:live:x%2Fy%20z%25"
        );
        assert_eq!(
            decode_key("client:a:live:x%2fy%20z%25").as_deref(),
            Some("client:a:live:x/y z%")
        );
        assert_eq!(decode_key("a+b").as_deref(), Some("a+b"));
    }

    #[test]
    fn malformed_escapes_are_refused() {
        for bad in ["%", "%4", "%zz", "a%g1", "%ff", "%c3"] {
            assert_eq!(decode_key(bad), None, "{bad}");
        }
    }

    proptest! {
        #[test]
        fn encode_then_decode_is_identity(s in "\\PC{0,64}") {
            let e = encode_key(&s);
            prop_assert!(!e.contains('/'));
            prop_assert_eq!(decode_key(&e), Some(s));
        }
    }
}
