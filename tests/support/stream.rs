//! Requests whose body is streamed, announcing no length: an HTTP/1.1 body sent by hand in
//! `Transfer-Encoding: chunked`, and an HTTP/2 body whose size hint is not exact (so hyper
//! sends no `content-length`). Only reading such a body tells how large it is.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};
use hyper::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use hyper::{Method, Request, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::client::{Alpn, Reply, TlsClient};

/// No exchange here takes longer than this.
const DEADLINE: Duration = Duration::from_secs(10);

/// A body given in chunks, one frame each, of a length it does not tell in advance.
pub struct Chunks {
    queue: VecDeque<Bytes>,
    /// After the first chunk, wait for this before the rest.
    gate: Option<tokio::sync::oneshot::Receiver<()>>,
    /// After the last chunk, stall for good instead of ending.
    stall: bool,
    /// The bytes it has handed to the client to send.
    sent: Arc<AtomicUsize>,
}

impl Chunks {
    pub fn new(body: &[u8], chunk: usize) -> Chunks {
        Chunks {
            queue: body
                .chunks(chunk.max(1))
                .map(Bytes::copy_from_slice)
                .collect(),
            gate: None,
            stall: false,
            sent: Arc::default(),
        }
    }

    /// A body of `len` bytes held back by its last: the others in chunks, counted in
    /// `sent`, then a stall.
    pub fn stalling(len: usize, chunk: usize, sent: Arc<AtomicUsize>) -> Chunks {
        Chunks {
            stall: true,
            sent,
            ..Chunks::new(&vec![b' '; len.saturating_sub(1)], chunk)
        }
    }

    /// `body` in chunks, the first at once and the rest once `open` fires.
    pub fn gated(body: &[u8], chunk: usize, open: tokio::sync::oneshot::Receiver<()>) -> Chunks {
        Chunks {
            gate: Some(open),
            ..Chunks::new(body, chunk)
        }
    }

    /// The same body, counting what it hands to the client in `sent`.
    pub fn counted(self, sent: Arc<AtomicUsize>) -> Chunks {
        Chunks { sent, ..self }
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.sent.load(Ordering::SeqCst) > 0
            && let Some(gate) = &mut self.gate
        {
            if Pin::new(gate).poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.gate = None;
        }
        match self.queue.pop_front() {
            Some(c) => {
                self.sent.fetch_add(c.len(), Ordering::SeqCst);
                Poll::Ready(Some(Ok(Frame::data(c))))
            }
            None if self.stall => Poll::Pending, // nothing will wake it: stalled for good
            None => Poll::Ready(None),
        }
    }
    // `size_hint` stays the default: a lower bound of 0 and no upper bound.
}

/// An HTTP/2 connection to `url`: the sender of its requests, and its task.
pub async fn h2_connect<B>(
    ca: &Path,
    url: &str,
) -> (
    hyper::client::conn::http2::SendRequest<B>,
    tokio::task::JoinHandle<hyper::Result<()>>,
)
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let client = TlsClient::with(ca, Alpn::Http2, None);
    let stream = client
        .connect_raw(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("an HTTP/2 handshake");
    (sender, tokio::spawn(conn))
}

/// POSTs `body` to `url` over HTTP/2 in frames of `chunk` bytes, without `content-length`
/// (the size hint is not exact), as `application/json`; the answer in full.
pub async fn post_h2_streamed(
    ca: &Path,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    chunk: usize,
) -> Reply {
    let (mut sender, conn) = h2_connect(ca, url).await;
    let uri: Uri = url.parse().expect("a valid URL");
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(CONTENT_TYPE, "application/json")
        .body(Chunks::new(body, chunk))
        .expect("a valid request");
    for (name, value) in headers {
        req.headers_mut().append(
            HeaderName::from_bytes(name.as_bytes()).expect("a valid header name"),
            HeaderValue::from_str(value).expect("a valid header value"),
        );
    }
    assert!(req.body().size_hint().exact().is_none());
    let exchange = async {
        let response = sender.send_request(req).await?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok::<_, hyper::Error>(Reply {
            status: parts.status,
            headers: parts.headers,
            version: parts.version,
            body,
        })
    };
    let reply = tokio::time::timeout(DEADLINE, exchange)
        .await
        .expect("the server answered within the test deadline")
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    conn.abort();
    reply
}

/// The head of an HTTP/1.1 POST of JSON to `url`, written by hand: the request line,
/// `Host`, `Content-Type`, then `headers` in order (the body's framing among them), and the
/// blank line that ends it.
pub fn h1_post_head(url: &str, headers: &[(&str, &str)]) -> String {
    let uri: Uri = url.parse().expect("a valid URL");
    let mut head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n",
        uri.path(),
        uri.authority().expect("an absolute URL"),
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head
}

/// POSTs `body` to `url` over HTTP/1.1 written by hand, `Transfer-Encoding: chunked` in
/// chunks of `chunk` bytes, with `Connection: close`; answers everything the server wrote
/// until it closed (status line, headers and body, as text).
pub async fn post_h1_chunked_raw(
    ca: &Path,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    chunk: usize,
) -> String {
    let mut chunked = Vec::new();
    for c in body.chunks(chunk.max(1)) {
        chunked.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        chunked.extend_from_slice(c);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    post_h1_chunked_wire(ca, url, headers, chunked).await
}

/// As `post_h1_chunked_raw`, with the chunked body given as it goes on the wire, so that a
/// test can send one that is not well formed. The body is written while the answer is
/// read, so a server that answers before reading it all is heard.
pub async fn post_h1_chunked_wire(
    ca: &Path,
    url: &str,
    headers: &[(&str, &str)],
    chunked: Vec<u8>,
) -> String {
    let framing = [("Transfer-Encoding", "chunked"), ("Connection", "close")];
    let mut wire = h1_post_head(url, &[&framing, headers].concat()).into_bytes();
    wire.extend_from_slice(&chunked);
    post_h1_wire(ca, url, wire).await
}

/// Writes `wire` (an HTTP/1.1 request, head and body, as it goes on the wire) to the host of
/// `url`, and answers everything the server wrote until it closed, as text. Written while
/// the answer is read, so a server that answers before reading it all is heard.
pub async fn post_h1_wire(ca: &Path, url: &str, wire: Vec<u8>) -> String {
    let client = TlsClient::with(ca, Alpn::Http1, None);
    let stream = client
        .connect_raw(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    let (mut rd, mut wr) = tokio::io::split(stream);
    // The server may answer and close before it has read everything: a failed write is
    // expected then, and what it answered is still read below.
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&wire).await;
        let _ = wr.flush().await;
        wr
    });
    let mut answer = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(DEADLINE, read)
        .await
        .expect("the server answered and closed within the test deadline");
    writer.abort();
    String::from_utf8_lossy(&answer).into_owned()
}
