//! The upstream executor over HTTP(S), through a keep-alive pool.
//!
//! Every failure is sorted by one question: could the request have left? Errors raised while
//! connecting (DNS, refused, connect timeout, TLS handshake) mean no byte of the order was
//! written, so the key may be released; so do a connection that closed before the order was
//! written to it, and an HTTP/2 stream the executor refused unprocessed (`not_sent`). Anything
//! later — a reset, a timeout while waiting for the answer, a body cut short — may follow a
//! fill, so it is `Unknown` and the key is held. So is a 2xx whose body only the
//! connection's close ended (with TLS's close_notify or without) and which is not JSON:
//! such a body cut short by a clean close reads as whole, and "unparsable" (a soft-fail,
//! SPEC §4) cannot be told from "cut short". So is a 2xx in a coding the client does not
//! undo (a content coding, a transfer coding but chunked): its `success` cannot be read.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{
    ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, TRANSFER_ENCODING,
};
use hyper::{Request, Uri};
use hyper_rustls::{ConfigBuilderExt, HttpsConnector};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{HttpConnector, capture_connection};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::ClientConfig;

use super::{Order, Outcome, classify, is_2xx, is_cut_json, is_json, may_be_a_fill, refuses};

/// An executor's answer is a small JSON document; a bigger one is not read into memory.
const MAX_ANSWER: usize = 1 << 20;
/// Connecting (DNS, TCP, TLS handshake) gets at most this much, and at most half the overall
/// timeout. It must stay strictly inside the overall bound: a connect that outlived it would be
/// reported as `Unknown` (key held) although nothing was sent.
const MAX_CONNECT: Duration = Duration::from_secs(3);
/// Pooled connections idle longer than this are not reused. An executor closes one left
/// idle past its own keep-alive timeout (gunicorn's is 2 s; uvicorn's, Node's and Apache's
/// 5 s), and an order written as it closes may or may not have been read: a 504 with its
/// key held, the retry refused for the key's life, for an order perhaps never placed. So a
/// connection is dropped well before the shortest such timeout. At a trade every second or
/// more the pool stays warm; a trade after a pause pays a new connection (and handshake).
/// An executor that says a shorter timeout (`Keep-Alive: timeout=1`) gets no reuse.
const POOL_IDLE: Duration = Duration::from_millis(1500);

#[derive(Clone)]
pub struct HttpConfig {
    /// Where orders are POSTed; `http://` or `https://`.
    pub url: Uri,
    /// Bound on the whole exchange: connect, send, and read the answer.
    pub timeout: Duration,
    /// PEM roots of a private CA. When set, only these are trusted (the executor is ours, so a
    /// public CA vouching for its name is no reason to send it orders); otherwise the webpki roots.
    pub ca_file: Option<PathBuf>,
}

/// Why an executor could not be built. Messages never include the URL: it may carry credentials.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    #[error("executor url must be http:// or https:// with a host")]
    Url,
    /// A port that is not one: the URL parser reads it as none, and orders would go to the
    /// scheme's default port (80, 443), to whatever listens there.
    #[error("executor url's port must be a number from 1 to 65535")]
    Port,
    /// `user:password@`: no part of an order's request carries it, so an executor that
    /// needs it refuses every order, with nothing to say why.
    #[error(
        "executor url must not carry user:password@: it is never sent; give the executor's \
         credential in the url's path or query"
    )]
    UserInfo,
    #[error("executor timeout must be greater than zero")]
    Timeout,
    #[error("executor CA file {path}: {reason}")]
    CaFile { path: PathBuf, reason: String },
    #[error("executor TLS setup: {0}")]
    Tls(#[from] rustls::Error),
}

impl fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Host and port only: userinfo, path and query may hold secrets. Every Debug that
        // shows the executor (the config's, the executor's) comes through here.
        f.debug_struct("HttpConfig")
            .field("host", &self.url.host())
            .field("port", &self.url.port_u16())
            .field("timeout", &self.timeout)
            .field("ca_file", &self.ca_file)
            .finish_non_exhaustive()
    }
}

impl HttpConfig {
    /// Where orders go, for the log: scheme, host and port (the scheme's own when the URL
    /// names none), nothing else. Userinfo, path and query may hold secrets: a path or a
    /// query is shown as `/…`, so that a reader does not take it for one left out.
    pub fn origin(&self) -> String {
        let scheme = self.url.scheme_str().unwrap_or("http");
        let host = self.url.host().unwrap_or("");
        let port = self
            .url
            .port_u16()
            .unwrap_or(if scheme == "https" { 443 } else { 80 });
        let rest = match self.url.path_and_query().map(|p| p.as_str()) {
            None | Some("/") => "",
            Some(_) => "/…",
        };
        format!("{scheme}://{host}:{port}{rest}")
    }
}

/// The parts of an executor's URL that may be its credential (the README has it given in
/// the path or the query), as an executor may echo them back in an answer that did not fill
/// (`Cannot POST /orders/KEY`, `{"path": …}`, `invalid token …`), which the log quotes: the
/// path and query together and apart, each path segment and each query value; each as
/// written, with its percent escapes in either case (a framework that writes the URL
/// again, `%2B` for `%2b`), percent-decoded, decoded as a form is (`+` a space: Starlette's
/// `"input"`), and with `/` escaped as JSON may (`\/`). Only those of 8
/// characters or more, masked wherever they occur: no credential is shorter, and a shorter
/// part (`/o`, `live`) would mask ordinary words (`/orders`, `delivered`). Longest first,
/// so that a part is hidden before a shorter one inside it.
fn url_secrets(url: &Uri) -> Vec<String> {
    const SHORTEST: usize = 8;
    let Some(whole) = url.path_and_query().map(|p| p.as_str()) else {
        return Vec::new();
    };
    let (path, query) = whole.split_once('?').unwrap_or((whole, ""));
    let values = query
        .split('&')
        .map(|pair| pair.split_once('=').map_or(pair, |(_, value)| value));
    let mut parts = Vec::new();
    for raw in [whole, path, query]
        .into_iter()
        .chain(path.split('/'))
        .chain(values)
    {
        let decoded = |text: &str| {
            percent_encoding::percent_decode_str(text)
                .decode_utf8_lossy()
                .into_owned()
        };
        let forms = [
            raw.to_string(),
            escapes_cased(raw, u8::to_ascii_uppercase),
            escapes_cased(raw, u8::to_ascii_lowercase),
            decoded(raw),
            decoded(&raw.replace('+', " ")),
        ];
        for part in forms {
            if part.contains('/') {
                parts.push(part.replace('/', "\\/"));
            }
            parts.push(part);
        }
    }
    parts.retain(|p| p.len() >= SHORTEST);
    parts.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    parts.dedup();
    parts
}

/// `text` with the hex digits of each percent escape in the case `case` makes.
fn escapes_cased(text: &str, case: fn(&u8) -> u8) -> String {
    let mut bytes = text.as_bytes().to_vec();
    let mut i = 0;
    while i + 2 < bytes.len() {
        if bytes[i] == b'%' && bytes[i + 1].is_ascii_hexdigit() && bytes[i + 2].is_ascii_hexdigit()
        {
            bytes[i + 1] = case(&bytes[i + 1]);
            bytes[i + 2] = case(&bytes[i + 2]);
            i += 3;
        } else {
            i += 1;
        }
    }
    // Only ASCII hex digits changed, to ASCII hex digits: still the UTF-8 it was.
    String::from_utf8(bytes).unwrap_or_else(|_| text.to_string())
}

pub struct HttpExecutor {
    client: Client<Bounded<HttpsConnector<HttpConnector>>, Full<Bytes>>,
    cfg: HttpConfig,
    /// What of the URL may be a credential, longest first ([`url_secrets`]).
    secrets: Vec<String>,
}

impl fmt::Debug for HttpExecutor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpExecutor")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl HttpExecutor {
    pub fn new(cfg: HttpConfig) -> Result<Self, ExecutorError> {
        let scheme_ok = matches!(cfg.url.scheme_str(), Some("http" | "https"));
        let Some(authority) = cfg.url.authority().filter(|_| scheme_ok) else {
            return Err(ExecutorError::Url);
        };
        if authority.as_str().contains('@') {
            return Err(ExecutorError::UserInfo);
        }
        // What follows the host: `]` ends an IPv6 address, whose colons are not a port's.
        let after_host = authority
            .as_str()
            .rsplit_once(']')
            .map_or(authority.as_str(), |(_, p)| p);
        let port = after_host.rsplit_once(':').map(|(_, port)| port);
        // Empty (`host:`) is the scheme's default, as RFC 3986 has it.
        let not_a_port = |p: &str| !p.is_empty() && !matches!(p.parse::<u16>(), Ok(1..));
        if port.is_some_and(not_a_port) {
            return Err(ExecutorError::Port);
        }
        if cfg.timeout.is_zero() {
            return Err(ExecutorError::Timeout);
        }
        let tls = tls_config(cfg.ca_file.as_deref())?;

        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false); // the TLS layer above handles https
        tcp.set_nodelay(true);
        let connector = Bounded {
            // http:// and https:// alike; TLS as `tls_config` has it (HTTP/1.1 only).
            inner: HttpsConnector::from((tcp, tls)),
            limit: MAX_CONNECT.min(cfg.timeout / 2),
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(connector);
        let secrets = url_secrets(&cfg.url);
        Ok(Self {
            client,
            cfg,
            secrets,
        })
    }

    /// What of the URL may be a credential, for [`super::Executor::mask`].
    pub fn secrets(&self) -> &[String] {
        &self.secrets
    }

    /// One order, within the executor's `timeout`: for the answer's head and then its body.
    pub async fn execute(&self, order: &Order) -> Outcome {
        let mut request = match self.request(order) {
            Ok(request) => request,
            Err(e) => return Outcome::NotSent(format!("cannot build the request: {e}")),
        };
        let connection = capture_connection(&mut request);
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let late = || format!("no answer within {:?}", self.cfg.timeout);
        let response = match tokio::time::timeout_at(deadline, self.client.request(request)).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) if not_sent(&e) => return Outcome::NotSent(chain(&e)),
            Ok(Err(e)) if closed_unanswered(&e) => {
                return Outcome::Unknown(format!(
                    "{}: the connection ended with no answer (the executor crashed, a proxy \
                     before it lost its backend, or the executor closes idle connections \
                     sooner than {POOL_IDLE:?} after an answer, or after an answer without \
                     `Connection: close`)",
                    chain(&e)
                ));
            }
            Ok(Err(e)) => return Outcome::Unknown(chain(&e)),
            Err(_) => return Outcome::Unknown(late()),
        };
        if closes_sooner_than_the_pool(response.headers())
            && let Some(c) = connection.connection_metadata().as_ref()
        {
            c.poison();
        }
        let status = response.status().as_u16();
        // A 2xx in a coding this reads not (it asks for none, but RFC 9110 lets a server
        // send one anyway): its `success` cannot be read, and the order may have filled.
        // Read as unparsable, its key was released and the retry placed again.
        if is_2xx(status)
            && let Some(coding) = coding(response.headers())
        {
            return Outcome::Unknown(format!(
                "answer {status} in the coding {coding:?}, which the gateway does not \
                 decode: it may have been a fill"
            ));
        }
        // Without a length or chunks, the body ends where the connection does (RFC 9112
        // §6.3; HTTP/1.0, or `Connection: close`), so one cut short by a clean close (an
        // executor that crashed mid-answer) reads as whole. A 204 has no body at all.
        let close_delimited = status != 204 && !framed(response.headers());
        // Kept whatever ends the read: what a refusal said before it was cut off is still
        // what it said ("duplicate clientOrderId"), and the log line shows it.
        let mut read = bytes::BytesMut::new();
        let reading = read_answer(response.into_body(), close_delimited, &mut read);
        match tokio::time::timeout_at(deadline, reading).await {
            Ok(Ok(())) => match classify(status, read.freeze()) {
                // A whole `"success": false` is a soft-fail however the body ended; a body
                // that is not one JSON document may be a fill's answer: cut short (ended
                // by a close, or JSON not finished), or saying it filled.
                Outcome::SoftFail { status, body } if close_delimited && !is_json(&body) => {
                    Outcome::Unknown(format!(
                        "answer {status} ended by the connection's close, not JSON: it may \
                         have been cut short"
                    ))
                }
                // It says `success` is true, but not as SPEC's literal `true` at the top
                // level of one JSON document: more after it, `NaN`, a raw tab, a key
                // twice; `Success`; `1` or `"true"`.
                Outcome::SoftFail { status, body } if may_be_a_fill(&body) => {
                    Outcome::Unknown(format!(
                        "answer {status} says \"success\" is true, but not as a literal \
                         `true` in one JSON document: it may have been a fill"
                    ))
                }
                Outcome::SoftFail { status, body } if is_cut_json(&body) => {
                    Outcome::Unknown(format!(
                        "answer {status} is JSON cut short ({} bytes, the document not \
                         finished: a length that counts characters, not bytes?): it may \
                         have been a fill",
                        body.len()
                    ))
                }
                outcome => outcome,
            },
            // A refusal is one whatever its body says, or however long it takes: the
            // executor has said no.
            Ok(Err(_)) | Err(_) if refuses(status) => Outcome::Failed {
                status,
                body: read.freeze(),
            },
            // A 2xx whose body we could not read may have been a fill: we cannot tell.
            Ok(Err(e)) => Outcome::Unknown(format!("answer {status} unreadable: {}", chain(&*e))),
            Err(_) => Outcome::Unknown(format!("answer {status}, then {}", late())),
        }
    }

    fn request(&self, order: &Order) -> Result<Request<Full<Bytes>>, hyper::http::Error> {
        Request::post(self.cfg.url.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            // The answer is read as it comes: say so, rather than meet a compressed one.
            .header(ACCEPT_ENCODING, HeaderValue::from_static("identity"))
            .header("idempotency-key", order.key.as_str())
            .header("x-request-id", order.request_id.as_str())
            .body(Full::new(order.body.clone()))
    }
}

/// Whether the answer says the executor closes this connection once idle for less than
/// the pool keeps it, with half a second to spare (`Keep-Alive: timeout=1`, RFC 2068
/// §19.7.1.1, in seconds). Reused, the next order could cross that close: a 504 with its
/// key held for an order perhaps never read. Such a connection is not reused, nor one whose
/// timeout cannot be read (`timeout=1;max=5`): a new connection costs a handshake, a close
/// crossed an order. No timeout said is left to `POOL_IDLE`.
fn closes_sooner_than_the_pool(headers: &hyper::HeaderMap) -> bool {
    let enough = (POOL_IDLE + Duration::from_millis(500)).as_secs_f64();
    headers
        .get_all("keep-alive")
        .iter()
        .map(|v| v.to_str().unwrap_or_default())
        .flat_map(|v| v.split(','))
        .filter_map(|param| {
            let (name, value) = param.split_once('=')?;
            let value = value.trim().trim_matches('"');
            let secs = value.parse::<f64>().ok().filter(|s| s.is_finite());
            name.trim().eq_ignore_ascii_case("timeout").then_some(secs)
        })
        .any(|secs| secs.is_none_or(|s| s < enough))
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Bounds the whole connect. hyper's own connect timeout covers the TCP handshake only; a stalled
/// DNS lookup or TLS handshake would otherwise run into the overall timeout and be reported as
/// `Unknown`. Failing here instead makes it a connect error: nothing sent, key released.
#[derive(Clone)]
struct Bounded<C> {
    inner: C,
    limit: Duration,
}

impl<C> tower_service::Service<Uri> for Bounded<C>
where
    C: tower_service::Service<Uri>,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let connecting = self.inner.call(dst);
        let limit = self.limit;
        Box::pin(async move {
            match tokio::time::timeout(limit, connecting).await {
                Ok(connected) => connected.map_err(Into::into),
                Err(_) => Err(format!("connect took over {limit:?}").into()),
            }
        })
    }
}

fn tls_config(ca_file: Option<&Path>) -> Result<ClientConfig, ExecutorError> {
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?;
    let mut config = match ca_file {
        None => builder.with_webpki_roots().with_no_client_auth(),
        Some(path) => builder
            .with_root_certificates(load_roots(path)?)
            .with_no_client_auth(),
    };
    // HTTP/1.1 only, whatever the executor offers. Over HTTP/2 an order that waits for a
    // stream slot (the executor's concurrency limit) is kept by hyper's connection task and
    // sent when a slot frees, even after its caller gave up: the gateway would have
    // answered 504 and dropped the order's in-flight mark, or with `on_unknown_outcome =
    // "release"` freed its key, before the order reached the executor. One shared HTTP/2
    // connection that stalls also takes every later order. HTTP/1's client drops a request
    // whose caller has gone before taking it, and a busy connection is never shared: the
    // pool opens another. Said in ALPN too: an executor that speaks HTTP/2 alone then
    // refuses the handshake, and the order is known unsent (502, released). Offered
    // nothing, such an executor took the connection and read no order: a 504 each, held.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // Every connection checks the executor's certificate. A resumed TLS 1.3 session skips
    // that: a certificate that expired, or was replaced by one `ca_file` does not trust,
    // went on working until the gateway restarted, and then every order failed at once.
    // A full handshake costs little here: a connection is kept while orders come.
    config.resumption = rustls::client::Resumption::disabled();
    Ok(config)
}

fn load_roots(path: &Path) -> Result<rustls::RootCertStore, ExecutorError> {
    let bad = |reason: String| ExecutorError::CaFile {
        path: path.to_owned(),
        reason,
    };
    if let Some(why) = crate::secrets::open_to_writes(path, "a CA") {
        return Err(bad(why));
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in crate::gateway::tls::read_certificates(path).map_err(bad)? {
        roots.add(cert).map_err(|e| bad(e.to_string()))?;
    }
    Ok(roots)
}

/// Whether a failed request surely never reached the executor's application:
///
/// - an error while connecting (DNS, TCP, TLS handshake, the connect bound);
/// - hyper-util's `Canceled`: the connection gave the request back unwritten (it closed
///   before hyper took the request to write it). hyper-util retries that itself on a
///   reused connection, not on a new one. A proxy in another process that accepts and
///   closes at once (its backend down) seldom wins that race: the kernel completes the
///   connect before the proxy accepts, hyper writes the order at once, and the close that
///   follows cannot be told from an executor that read the order and died, so that is
///   `Unknown` (held). The kind is private; its `Display` is the one way to
///   tell it, pinned by tests/executor.rs: were it to change, the test fails, and until
///   then such an order is only held (`Unknown`), never released wrongly;
/// - the executor's TLS refusing the gateway's certificate, or its lack of one
///   ([`refused_handshake`]).
fn not_sent(e: &hyper_util::client::legacy::Error) -> bool {
    e.is_connect() || e.to_string() == "client error (Canceled)" || refused_handshake(e)
}

/// Whether a request failed on its connection's close or reset before any answer: where
/// an executor that closes kept-alive connections early loses orders it never read.
fn closed_unanswered(e: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind as K;
    causes(e)
        .find_map(|c| {
            if c.downcast_ref::<hyper::Error>()
                .is_some_and(hyper::Error::is_incomplete_message)
            {
                return Some(true);
            }
            let io = c.downcast_ref::<std::io::Error>()?;
            Some(matches!(
                io.kind(),
                K::ConnectionReset | K::BrokenPipe | K::UnexpectedEof
            ))
        })
        .unwrap_or(false)
}

/// Whether the executor's TLS 1.3 refused the handshake for want of a client certificate
/// (the gateway presents none): the server says so after the client has finished its side
/// of the handshake, so hyper has written the order by then, into a connection the server
/// never completed, whose data no application reads. Such an executor had every order
/// held, none seen. Only `certificate_required`: TLS 1.3's own (RFC 8446 §6.2), sent only
/// during a handshake, and rustls offers no later one (post-handshake authentication).
/// Others are not: under TLS 1.2 a server may ask to renegotiate after it has read the
/// order, and the refusal of that ends in a `handshake_failure` (TLS 1.2 refuses a missing
/// certificate before the client's side is done: a connect error, not sent already).
fn refused_handshake(e: &(dyn std::error::Error + 'static)) -> bool {
    causes(e)
        .find_map(|c| {
            // tokio-rustls gives rustls's error inside an I/O error.
            let tls = c.downcast_ref::<rustls::Error>().or_else(|| {
                let io = c.downcast_ref::<std::io::Error>()?.get_ref()?;
                io.downcast_ref::<rustls::Error>()
            });
            match tls {
                Some(rustls::Error::AlertReceived(alert)) => {
                    Some(*alert == rustls::AlertDescription::CertificateRequired)
                }
                _ => None,
            }
        })
        .unwrap_or(false)
}

/// An answer's body, up to [`MAX_ANSWER`], into `read` (what came before an error stays
/// there). A body that only the connection's close ends
/// ends as well at a close without TLS's close_notify (Python's `ssl`, among others, closes
/// so): over plain HTTP the same bytes end at the TCP close, and read as whole there, so
/// here too, under the same rule (a 2xx that is not JSON is unknown, `execute`). Read
/// as an error, an executor over https that answered `{"success":false}` so had every
/// refused order held, its corrected retry refused for the key's life.
async fn read_answer(
    mut body: hyper::body::Incoming,
    close_delimited: bool,
    read: &mut bytes::BytesMut,
) -> Result<(), BoxError> {
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    if read.len() + data.len() > MAX_ANSWER {
                        return Err(format!("answer over {MAX_ANSWER} bytes").into());
                    }
                    read.extend_from_slice(&data);
                }
            }
            Err(e) if close_delimited && closed_without_notify(&e) => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Whether reading failed because the peer closed the connection without TLS's
/// close_notify: rustls says so as an `UnexpectedEof` I/O error.
fn closed_without_notify(e: &hyper::Error) -> bool {
    causes(e)
        .find_map(|c| c.downcast_ref::<std::io::Error>())
        .is_some_and(|io| io.kind() == std::io::ErrorKind::UnexpectedEof)
}

/// A coding of a message's body that hyper does not undo, if any: a content coding but
/// `identity`, or a transfer coding but `chunked` (which hyper undoes) and `identity`. An
/// executor's answer should have neither (`Accept-Encoding: identity`, no `TE`), and so
/// should a webhook (its 415).
pub(crate) fn coding(headers: &hyper::HeaderMap) -> Option<String> {
    let first = |name, undone: &[&str]| {
        headers
            .get_all(name)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .map(|c| String::from_utf8_lossy(c.trim_ascii()).into_owned())
            .find(|c| !c.is_empty() && !undone.iter().any(|u| c.eq_ignore_ascii_case(u)))
    };
    first(CONTENT_ENCODING, &["identity"])
        .or_else(|| first(TRANSFER_ENCODING, &["chunked", "identity"]))
}

/// Whether an answer's head says where its body ends (RFC 9112 §6.3, as hyper reads it):
/// with a `Transfer-Encoding`, only if chunked is its last coding (`identity` or `gzip`
/// alone run to the close, whatever `Content-Length` says); without one, a
/// `Content-Length`.
fn framed(headers: &hyper::HeaderMap) -> bool {
    let mut codings = headers
        .get_all(TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .peekable();
    if codings.peek().is_none() {
        return headers.contains_key(CONTENT_LENGTH);
    }
    codings
        .last()
        .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

/// The error and its causes on one line: hyper's top-level messages alone ("client error
/// (Connect)") do not tell an operator what happened.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    causes(e)
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(": ")
}

/// An error and its causes, outermost first: what each look for a kind of error walks.
pub(crate) fn causes<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |c| c.source())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The timeout is read in any letter case, with spaces, quoted or among other
    /// parameters, from any `Keep-Alive` header; under 2 s (the pool's 1.5 s and half a
    /// second to spare) the connection is not reused, nor when the timeout is no number.
    /// None said leaves the pool's own rule.
    #[test]
    fn a_keep_alive_timeout_under_two_seconds_ends_reuse() {
        let says = |values: &[&str]| {
            let mut h = hyper::HeaderMap::new();
            for v in values {
                h.append("keep-alive", HeaderValue::from_str(v).unwrap());
            }
            closes_sooner_than_the_pool(&h)
        };
        for short in [
            &["timeout=1"][..],
            &["timeout=0"],
            &["max=100, timeout=1"],
            &["Timeout = 1"],
            &["timeout=\"1\""],
            &["max=5", "timeout=1"],
            &["timeout=1.5"],
            // Not read: taken as short, the safe side.
            &["timeout=1;max=5"],
            &["timeout=x"],
            &["timeout=-1"],
            &["timeout=NaN"],
        ] {
            assert!(says(short), "{short:?}");
        }
        for not in [
            &[][..],
            &["timeout=2"],
            &["timeout=5, max=100"],
            &["timeout=2.0"],
            &["timeout"],
            &["max=1"],
        ] {
            assert!(!says(not), "{not:?}");
        }
    }

    /// An error with the next one as its source.
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    /// What an operator reads of a failed send: every cause, not hyper's top line alone.
    #[test]
    fn chain_tells_every_cause() {
        let refused = Layer("Connection refused (os error 111)", None);
        let tcp = Layer("tcp connect error", Some(Box::new(refused)));
        let e = Layer("client error (Connect)", Some(Box::new(tcp)));
        assert_eq!(
            chain(&e),
            "client error (Connect): tcp connect error: Connection refused (os error 111)"
        );
    }

    /// Of the alerts an executor's TLS may end a request with, only TLS 1.3's
    /// `certificate_required` says the order went unread. A `handshake_failure` may end a
    /// TLS 1.2 renegotiation the executor asked for after reading the order (an
    /// `openssl s_server` that renegotiates, a per-location client certificate): taken
    /// for not sent, its key was released, and the retry placed a second time.
    #[test]
    fn only_a_missing_certificate_in_tls_1_3_is_not_sent() {
        use rustls::AlertDescription as A;
        let alert = |a: A| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                rustls::Error::AlertReceived(a),
            )
        };
        assert!(refused_handshake(&alert(A::CertificateRequired)));
        for a in [
            A::HandshakeFailure,
            A::BadCertificate,
            A::UnknownCA,
            A::AccessDenied,
            A::DecodeError,
        ] {
            assert!(!refused_handshake(&alert(a)), "{a:?}");
        }
        // Under hyper's layers too.
        let io = alert(A::CertificateRequired);
        assert!(refused_handshake(&Wrapped(io)));
    }

    /// An error whose source is an I/O error, as hyper's are.
    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl fmt::Display for Wrapped {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("connection error")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    fn cfg(url: &str) -> HttpConfig {
        HttpConfig {
            url: url.parse().unwrap(),
            timeout: Duration::from_secs(1),
            ca_file: None,
        }
    }

    #[test]
    fn rejects_urls_it_cannot_post_to() {
        for url in ["ftp://host/x", "/orders", "127.0.0.1:9000"] {
            assert!(
                matches!(HttpExecutor::new(cfg(url)), Err(ExecutorError::Url)),
                "{url}"
            );
        }
        // A port that is none would send orders to 80 or 443.
        for url in [
            "http://127.0.0.1:99999/o",
            "http://127.0.0.1:65536/o",
            "http://127.0.0.1:9000x/o",
            "https://exec.local:0/o",
            "http://[::1]:70000/o",
        ] {
            assert!(
                matches!(HttpExecutor::new(cfg(url)), Err(ExecutorError::Port)),
                "{url}"
            );
        }
        for url in [
            "http://127.0.0.1:65535/o",
            "http://[::1]:9000/o",
            "http://[::1]/o",
            "https://exec.local/o",
            "http://exec.local:/o",
        ] {
            assert!(HttpExecutor::new(cfg(url)).is_ok(), "{url}");
        }
        let with_user = cfg("https://bot:s3cret@exec.local:9443/o");
        let e = HttpExecutor::new(with_user).err().unwrap();
        assert!(matches!(e, ExecutorError::UserInfo), "{e}");
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let mut zero = cfg("http://127.0.0.1:1/");
        zero.timeout = Duration::ZERO;
        assert!(matches!(
            HttpExecutor::new(zero),
            Err(ExecutorError::Timeout)
        ));
    }

    #[test]
    fn ca_file_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no pem here\n").unwrap();
        let missing = dir.path().join("missing.pem");
        for path in [empty, missing] {
            let mut c = cfg("https://127.0.0.1:1/");
            c.ca_file = Some(path.clone());
            let err = HttpExecutor::new(c).unwrap_err();
            assert!(matches!(err, ExecutorError::CaFile { .. }), "{err}");
            assert!(err.to_string().contains(&path.display().to_string()));
        }
        // A real certificate, but anyone may write the file: anyone could add a CA to it.
        let ca = dir.path().join("ca.pem");
        let cert = rcgen::generate_simple_self_signed(vec!["exec.local".into()]).unwrap();
        std::fs::write(&ca, cert.cert.pem()).unwrap();
        std::fs::set_permissions(&ca, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        let mut c = cfg("https://127.0.0.1:1/");
        c.ca_file = Some(ca.clone());
        assert!(HttpExecutor::new(c.clone()).is_ok());
        std::fs::set_permissions(&ca, std::os::unix::fs::PermissionsExt::from_mode(0o646)).unwrap();
        let err = HttpExecutor::new(c).unwrap_err().to_string();
        assert!(err.contains("writable by everyone"), "{err}");
    }

    /// The start-up log names where orders go, and never what may hold a secret.
    #[test]
    fn origin_is_scheme_host_and_port_only() {
        let cases = [
            (
                "https://user:hunter2@exec.local:9443/o/s3cret?token=s3cret",
                "https://exec.local:9443/…",
            ),
            ("https://exec.local/orders", "https://exec.local:443/…"),
            (
                "http://127.0.0.1/orders?key=s3cret",
                "http://127.0.0.1:80/…",
            ),
            ("http://127.0.0.1/?key=s3cret", "http://127.0.0.1:80/…"),
            ("http://[::1]:9000/", "http://[::1]:9000"),
            ("http://[::1]:9000", "http://[::1]:9000"),
        ];
        for (url, want) in cases {
            assert_eq!(cfg(url).origin(), want, "{url}");
        }
    }

    #[test]
    fn debug_hides_credentials_in_the_url() {
        let c = cfg("https://exec.local:9443/o/hunter2?token=s3cret");
        let e = HttpExecutor::new(c.clone()).unwrap();
        for debug in [format!("{e:?}"), format!("{c:?}")] {
            assert!(debug.contains("exec.local"));
            for secret in ["hunter2", "s3cret"] {
                assert!(!debug.contains(secret), "{debug}");
            }
        }
    }
}
