//! A real TLS client for the gateway: trusts a given CA, may present a client certificate, and
//! speaks HTTP/1.1 or HTTP/2 as ALPN decides (or as the test forces).
//!
//! Built on hyper's connection API rather than a pooled client so that a test sees the TLS
//! handshake and the negotiated protocol, and controls when connections open.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper::header::{CONTENT_TYPE, HOST, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, StatusCode, Uri, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;

use super::pki::CertFiles;

/// No test waits longer than this for one exchange.
const DEADLINE: Duration = Duration::from_secs(10);

/// Which protocols the client offers by ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// `h2` and `http/1.1`: the server chooses.
    Any,
    /// `http/1.1` only.
    Http1,
    /// `h2` only.
    Http2,
}

/// A complete answer.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub version: Version,
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON; `Null` when empty, a JSON string of the raw text when not JSON.
    pub fn json(&self) -> serde_json::Value {
        if self.body.is_empty() {
            return serde_json::Value::Null;
        }
        serde_json::from_slice(&self.body).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(&self.body).into_owned())
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

#[derive(Clone)]
pub struct TlsClient {
    connector: TlsConnector,
    /// For [`TlsClient::connect_raw`]: as `connector`, but a client that offers both
    /// protocols offers `http/1.1` alone, as its bytes written by hand are (the gateway
    /// speaks the protocol ALPN chose, which would be `h2`).
    raw: TlsConnector,
}

impl TlsClient {
    /// Trusts `ca` (PEM), offers both protocols, no client certificate.
    pub fn new(ca: &Path) -> TlsClient {
        Self::with(ca, Alpn::Any, None)
    }

    pub fn with(ca: &Path, alpn: Alpn, identity: Option<&CertFiles>) -> TlsClient {
        Self::with_versions(ca, alpn, identity, rustls::DEFAULT_VERSIONS)
    }

    /// As [`TlsClient::with`], offering only these TLS versions.
    pub fn with_versions(
        ca: &Path,
        alpn: Alpn,
        identity: Option<&CertFiles>,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> TlsClient {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots);
        let mut config = match identity {
            None => builder.with_no_client_auth(),
            Some(id) => {
                let chain = CertificateDer::pem_file_iter(&id.cert)
                    .unwrap()
                    .map(|c| c.unwrap())
                    .collect();
                let key = PrivateKeyDer::from_pem_file(&id.key).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
        };
        let mut raw = config.clone();
        (config.alpn_protocols, raw.alpn_protocols) = match alpn {
            Alpn::Any => (
                vec![b"h2".to_vec(), b"http/1.1".to_vec()],
                vec![b"http/1.1".to_vec()],
            ),
            Alpn::Http1 => (vec![b"http/1.1".to_vec()], vec![b"http/1.1".to_vec()]),
            Alpn::Http2 => (vec![b"h2".to_vec()], vec![b"h2".to_vec()]),
        };
        TlsClient {
            connector: TlsConnector::from(Arc::new(config)),
            raw: TlsConnector::from(Arc::new(raw)),
        }
    }

    /// Opens a TLS connection to the host and port of `url`. Fails on a TCP or TLS error (an
    /// untrusted server, a refused client certificate), which tests of the handshake expect.
    pub async fn connect(&self, url: &str) -> std::io::Result<Conn> {
        self.connect_from(url, None).await
    }

    /// As [`TlsClient::connect`], from the local address `from` when given (a second
    /// loopback address, `127.0.0.2`, is another host as far as the gateway can tell).
    pub async fn connect_from(&self, url: &str, from: Option<IpAddr>) -> std::io::Result<Conn> {
        let uri: Uri = url.parse().map_err(std::io::Error::other)?;
        let tls = self.tls_stream(url, from).await?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = TokioIo::new(tls);
        let authority = uri.authority().map(|a| a.to_string()).unwrap_or_default();
        let sender = if h2 {
            let (sender, conn) = http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            Sender::H2(sender)
        } else {
            let (sender, conn) = http1::handshake(io).await.map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            Sender::H1(sender)
        };
        Ok(Conn { sender, authority })
    }

    /// The TLS stream alone, for tests that write bytes by hand (a slow client): HTTP/1.1,
    /// unless this client offers `h2` alone.
    pub async fn connect_raw(
        &self,
        url: &str,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        self.tls_stream_with(&self.raw, url, None).await
    }

    async fn tls_stream(
        &self,
        url: &str,
        from: Option<IpAddr>,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        self.tls_stream_with(&self.connector, url, from).await
    }

    async fn tls_stream_with(
        &self,
        connector: &TlsConnector,
        url: &str,
        from: Option<IpAddr>,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let uri: Uri = url.parse().map_err(std::io::Error::other)?;
        let host = uri.host().unwrap_or("localhost");
        let port = uri.port_u16().unwrap_or(443);
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(bare.to_owned()).map_err(std::io::Error::other)?;
        let tcp = async {
            let Some(local) = from else {
                return TcpStream::connect((bare, port)).await;
            };
            let to = tokio::net::lookup_host((bare, port))
                .await?
                .find(|a| a.is_ipv4() == local.is_ipv4())
                .ok_or_else(|| std::io::Error::other(format!("{bare}: no address like {local}")))?;
            let socket = if local.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            socket.bind(SocketAddr::new(local, 0))?;
            socket.connect(to).await
        };
        let tcp = tokio::time::timeout(DEADLINE, tcp).await??;
        tcp.set_nodelay(true)?;
        tokio::time::timeout(DEADLINE, connector.connect(name, tcp)).await?
    }

    /// POSTs `body` on a fresh connection; answers status, headers and the body as JSON
    /// (see [`Reply::json`]). `Content-Type: application/json` unless `headers` sets one.
    pub async fn post(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> (StatusCode, HeaderMap, serde_json::Value) {
        let reply = self.request(Method::POST, url, headers, body).await;
        let json = reply.json();
        (reply.status, reply.headers, json)
    }

    /// Any method, on a fresh connection; panics on a transport error.
    pub async fn request(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Reply {
        let mut conn = self
            .connect(url)
            .await
            .unwrap_or_else(|e| panic!("connect {url}: {e}"));
        conn.request(method, url, headers, body)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e:?}"))
    }
}

enum Sender {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

/// One open connection; requests on it are sent one after another (keep-alive).
pub struct Conn {
    sender: Sender,
    authority: String,
}

impl Conn {
    /// The protocol ALPN chose.
    /// A second handle on the same HTTP/2 connection, to multiplex concurrent requests on it;
    /// `None` under HTTP/1.1, where requests go one at a time.
    pub fn try_clone(&self) -> Option<Conn> {
        match &self.sender {
            Sender::H1(_) => None,
            Sender::H2(sender) => Some(Conn {
                sender: Sender::H2(sender.clone()),
                authority: self.authority.clone(),
            }),
        }
    }

    pub fn version(&self) -> Version {
        match self.sender {
            Sender::H1(_) => Version::HTTP_11,
            Sender::H2(_) => Version::HTTP_2,
        }
    }

    pub async fn post(
        &mut self,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> hyper::Result<Reply> {
        self.request(Method::POST, url, headers, body).await
    }

    pub async fn request(
        &mut self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> hyper::Result<Reply> {
        let uri: Uri = url.parse().expect("a valid URL");
        let mut req = Request::builder().method(method);
        // HTTP/1.1 takes the path and a Host header; HTTP/2 the absolute URI (:authority).
        req = match self.sender {
            Sender::H1(_) => req
                .uri(uri.path_and_query().map_or("/", |p| p.as_str()))
                .header(HOST, self.authority.as_str()),
            Sender::H2(_) => req.uri(uri),
        };
        let mut req = req.body(Full::new(body.into())).expect("a valid request");
        for (name, value) in headers {
            req.headers_mut().append(
                HeaderName::from_bytes(name.as_bytes()).expect("a valid header name"),
                HeaderValue::from_str(value).expect("a valid header value"),
            );
        }
        req.headers_mut()
            .entry(CONTENT_TYPE)
            .or_insert(HeaderValue::from_static("application/json"));
        self.send(req).await
    }

    /// Sends `req` exactly as built (for requests `request` will not make, such as one without
    /// a Content-Type). Under HTTP/1.1 the URI must be origin-form with a Host header; under
    /// HTTP/2 absolute.
    pub async fn send(&mut self, req: Request<Full<Bytes>>) -> hyper::Result<Reply> {
        let exchange = async {
            let response = match &mut self.sender {
                Sender::H1(s) => {
                    s.ready().await?;
                    s.send_request(req).await?
                }
                Sender::H2(s) => {
                    s.ready().await?;
                    s.send_request(req).await?
                }
            };
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok(Reply {
                status: parts.status,
                headers: parts.headers,
                version: parts.version,
                body,
            })
        };
        tokio::time::timeout(DEADLINE, exchange)
            .await
            .expect("the server answered within the test deadline")
    }
}
