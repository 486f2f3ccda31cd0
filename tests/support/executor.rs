//! A mock executor: a real HTTP server on loopback that records what reaches it and answers as
//! told. Tests switch its mode to play every row of the SPEC §4 outcome table.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::pki::CertFiles;

/// How the mock answers the next requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 200 `{"success":true,"orderId":"mock-<n>",...}`.
    Success,
    /// 200 `{"success":false,...}`.
    SoftFail,
    /// 500.
    ServerError,
    /// Reads the request, then never answers.
    Hang,
    /// Reads the whole request, then drops the connection with a TCP reset, answering nothing.
    Reset,
    /// Success, after this long: keeps an order in flight so that duplicates race it.
    Slow(Duration),
    /// 500, after this long.
    SlowFail(Duration),
    /// As `Success`, with this status instead of 200 (a 2xx such as 201 or 202).
    SuccessWith(u16),
    /// Accepts each connection and closes it at once, reading nothing: a proxy whose
    /// backend is down.
    CloseAtOnce,
    /// 404 with the request's path and query in the body, as Spring's error page has it.
    NotFoundEchoing,
    /// As `Success`, its answer padded (a `pad` string) to at least this many bytes.
    SuccessPadded(usize),
    /// This status, and this body as `application/json`, exactly as given.
    Saying(u16, &'static str),
}

/// One request as the mock received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub version: Version,
    pub idempotency_key: Option<String>,
    pub request_id: Option<String>,
    pub content_type: Option<String>,
    pub accept_encoding: Option<String>,
    pub body: Bytes,
    /// When its body had been read.
    pub at: std::time::Instant,
}

impl Received {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("the mock received a non-JSON body")
    }
}

struct State {
    mode: Mutex<Mode>,
    ledger: Mutex<Vec<Received>>,
    connections: AtomicUsize,
}

pub struct MockExecutor {
    pub addr: SocketAddr,
    scheme: &'static str,
    state: Arc<State>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for MockExecutor {
    fn drop(&mut self) {
        // The accept task owns every connection task (a JoinSet): aborting it stops them all,
        // hanging ones included.
        self.accept.abort();
    }
}

impl MockExecutor {
    /// A plain-HTTP mock on 127.0.0.1, in `Success` mode.
    pub async fn start() -> MockExecutor {
        Self::launch(None).await
    }

    /// An HTTPS mock (HTTP/1.1 and HTTP/2 by ALPN) presenting `server`.
    pub async fn start_tls(server: &CertFiles) -> MockExecutor {
        Self::launch(Some(tls_acceptor(server))).await
    }

    async fn launch(tls: Option<TlsAcceptor>) -> MockExecutor {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            mode: Mutex::new(Mode::Success),
            ledger: Mutex::new(Vec::new()),
            connections: AtomicUsize::new(0),
        });
        let scheme = if tls.is_some() { "https" } else { "http" };
        let accept = tokio::spawn(accept_loop(listener, tls, state.clone()));
        MockExecutor {
            addr,
            scheme,
            state,
            accept,
        }
    }

    /// The URL to configure as the executor.
    pub fn url(&self) -> String {
        format!("{}://{}/orders", self.scheme, self.addr)
    }

    /// The same, naming the host `localhost` (for TLS name checks).
    pub fn url_localhost(&self) -> String {
        format!("{}://localhost:{}/orders", self.scheme, self.addr.port())
    }

    pub fn set_mode(&self, mode: Mode) {
        *self.state.mode.lock().unwrap() = mode;
    }

    /// Requests received (fully read), whatever was answered.
    pub fn calls(&self) -> usize {
        self.state.ledger.lock().unwrap().len()
    }

    /// Waits until `n` orders have arrived; fails the test after 10 s.
    pub async fn wait_for_calls(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.calls() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} of {n} orders reached the executor in 10 s",
                self.calls()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn ledger(&self) -> Vec<Received> {
        self.state.ledger.lock().unwrap().clone()
    }

    /// Connections accepted so far (to see keep-alive reuse).
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }
}

/// An `http://` URL on loopback where nothing listens, and nothing can start to: its port
/// is held, for the rest of the process, by a socket that is bound but never listens. A
/// connection to it is refused (a reset), and no other bind, nor an outgoing connection's
/// ephemeral port, can take it (a port bound and released could be, by a test running
/// alongside).
pub fn refused_url() -> String {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind((Ipv4Addr::LOCALHOST, 0).into()).unwrap();
    let port = socket.local_addr().unwrap().port();
    // Kept open, never listening, until the process exits.
    std::mem::forget(socket);
    format!("http://127.0.0.1:{port}/orders")
}

pub fn tls_acceptor(server: &CertFiles) -> TlsAcceptor {
    let mut config = server_config(server);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    TlsAcceptor::from(Arc::new(config))
}

/// A rustls server's config for `server`'s certificate and key, no ALPN.
pub fn server_config(server: &CertFiles) -> rustls::ServerConfig {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&server.cert)
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_file(&server.key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap()
}

async fn accept_loop(listener: TcpListener, tls: Option<TlsAcceptor>, state: Arc<State>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                state.connections.fetch_add(1, Ordering::SeqCst);
                connections.spawn(serve(tcp, tls.clone(), state.clone()));
            }
            // Reap finished connections so the set does not grow with a long test.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve(tcp: TcpStream, tls: Option<TlsAcceptor>, state: Arc<State>) {
    let mode = *state.mode.lock().unwrap();
    if mode == Mode::CloseAtOnce {
        return;
    }
    // Closing with SO_LINGER 0 sends a RST rather than a FIN: `Reset` is a real reset.
    let _ = tcp.set_zero_linger();
    let reset = Arc::new(Notify::new());
    let service = {
        let reset = reset.clone();
        hyper::service::service_fn(move |req| answer(req, state.clone(), reset.clone()))
    };
    let builder = auto::Builder::new(TokioExecutor::new());
    match tls {
        None => {
            let conn = builder.serve_connection(TokioIo::new(tcp), service);
            tokio::select! { _ = conn => {}, _ = reset.notified() => {} }
        }
        Some(acceptor) => {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! { _ = conn => {}, _ = reset.notified() => {} }
        }
    }
    // Returning drops the connection, and with it the socket.
}

async fn answer(
    req: Request<Incoming>,
    state: Arc<State>,
    reset: Arc<Notify>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (idempotency_key, request_id, content_type, accept_encoding) = (
        header("idempotency-key"),
        header("x-request-id"),
        header("content-type"),
        header("accept-encoding"),
    );
    let target = req.uri().path_and_query().map(|p| p.to_string());
    let (method, path, version) = (
        req.method().to_string(),
        req.uri().path().to_owned(),
        req.version(),
    );
    let body = req.into_body().collect().await?.to_bytes();
    let (n, mode) = {
        let mut ledger = state.ledger.lock().unwrap();
        ledger.push(Received {
            method,
            path,
            version,
            idempotency_key: idempotency_key.clone(),
            request_id,
            content_type,
            accept_encoding,
            body,
            at: std::time::Instant::now(),
        });
        (ledger.len(), *state.mode.lock().unwrap())
    };
    let reply = |status: StatusCode, json: serde_json::Value| {
        Ok(Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(json.to_string())))
            .unwrap())
    };
    let filled = serde_json::json!({
        "success": true,
        "orderId": format!("mock-{n}"),
        "idempotencyKey": idempotency_key,
    });
    match mode {
        Mode::Success => reply(StatusCode::OK, filled),
        Mode::Slow(delay) => {
            tokio::time::sleep(delay).await;
            reply(StatusCode::OK, filled)
        }
        Mode::SoftFail => reply(
            StatusCode::OK,
            serde_json::json!({"success": false, "error": "insufficient margin"}),
        ),
        Mode::ServerError => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            serde_json::json!({"success": false, "error": "exchange down"}),
        ),
        Mode::SlowFail(delay) => {
            tokio::time::sleep(delay).await;
            reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                serde_json::json!({"success": false, "error": "exchange down"}),
            )
        }
        Mode::Hang => std::future::pending().await,
        Mode::Reset => {
            reset.notify_one();
            std::future::pending().await
        }
        Mode::SuccessWith(status) => reply(StatusCode::from_u16(status).unwrap(), filled),
        Mode::CloseAtOnce => unreachable!("never answers a request"),
        Mode::SuccessPadded(len) => {
            let mut padded = filled;
            padded["pad"] = serde_json::json!("p".repeat(len));
            reply(StatusCode::OK, padded)
        }
        Mode::Saying(status, body) => Ok(Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()),
        Mode::NotFoundEchoing => reply(
            StatusCode::NOT_FOUND,
            serde_json::json!({"status": 404, "error": "Not Found", "path": target}),
        ),
    }
}
