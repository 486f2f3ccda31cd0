//! HTTP/2 by hand, frame by frame, over the gateway's TLS: for what a client library does
//! not let a test do, such as send a body before reading the server's SETTINGS, or see the
//! GOAWAY a connection is closed with. Headers go as HPACK literals (RFC 7541 §6.2.2), so
//! no encoder is needed; of the answers' headers only `:status` is read.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::client::{Alpn, TlsClient};
use super::pki::CertFiles;

pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const SETTINGS: u8 = 4;
pub const PING: u8 = 6;
pub const GOAWAY: u8 = 7;
pub const WINDOW_UPDATE: u8 = 8;
pub const END_STREAM: u8 = 1;
pub const ACK: u8 = 1;
pub const END_HEADERS: u8 = 4;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 4;
/// The protocol's initial window, for a stream and for the connection (RFC 9113 §6.9.2).
pub const DEFAULT_WINDOW: i64 = 65_535;

#[derive(Debug)]
pub struct H2Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

pub struct RawH2 {
    io: TlsStream<TcpStream>,
    /// What was read and is not a whole frame yet: a wait that ends mid-frame loses nothing.
    read: Vec<u8>,
}

impl RawH2 {
    /// A TLS connection that chose `h2`, with the client preface and empty SETTINGS sent.
    pub async fn connect(ca: &Path, url: &str) -> RawH2 {
        Self::connect_as(ca, url, None).await
    }

    /// As [`RawH2::connect`], presenting `identity` as the client certificate.
    pub async fn connect_as(ca: &Path, url: &str, identity: Option<&CertFiles>) -> RawH2 {
        let client = TlsClient::with(ca, Alpn::Http2, identity);
        let io = client
            .connect_raw(url)
            .await
            .unwrap_or_else(|e| panic!("connect {url}: {e}"));
        assert_eq!(io.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let mut h = RawH2 {
            io,
            read: Vec::new(),
        };
        h.io.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        h.send(SETTINGS, 0, 0, &[]).await;
        h
    }

    pub async fn send(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let len = payload.len() as u32;
        let mut head = [0u8; 9];
        head[..3].copy_from_slice(&len.to_be_bytes()[1..]);
        head[3] = kind;
        head[4] = flags;
        head[5..].copy_from_slice(&stream.to_be_bytes());
        self.io.write_all(&head).await.unwrap();
        self.io.write_all(payload).await.unwrap();
        self.io.flush().await.unwrap();
    }

    /// A request's HEADERS frame, its header block whole (END_HEADERS).
    pub async fn send_request(&mut self, stream: u32, url: &str, headers: &[(&str, &str)]) {
        let uri: hyper::Uri = url.parse().unwrap();
        let authority = uri.authority().unwrap().to_string();
        let mut block = Vec::new();
        let pseudo = [
            (":method", "POST"),
            (":scheme", "https"),
            (":authority", authority.as_str()),
            (":path", uri.path()),
        ];
        for (name, value) in pseudo.iter().chain(headers) {
            // Literal header field, never indexed, new name; lengths as 7-bit prefixed
            // integers, without Huffman coding.
            block.push(0x10);
            for s in [name, value] {
                push_length(&mut block, s.len());
                block.extend_from_slice(s.as_bytes());
            }
        }
        self.send(HEADERS, END_HEADERS, stream, &block).await;
    }

    /// A POST's HEADERS frame for a JSON body of `len` bytes, which the caller sends.
    pub async fn send_post(&mut self, stream: u32, url: &str, len: usize) {
        let len = len.to_string();
        let headers = [
            ("content-type", "application/json"),
            ("content-length", len.as_str()),
        ];
        self.send_request(stream, url, &headers).await;
    }

    /// The next frame, or `None` once the connection has ended (EOF or an error), or when
    /// none comes within `wait`.
    pub async fn next(&mut self, wait: Duration) -> Option<H2Frame> {
        let read = async {
            loop {
                if let Some(frame) = self.whole_frame() {
                    return Some(frame);
                }
                // `read` takes nothing when cancelled: a timeout keeps the bytes so far.
                let mut chunk = [0u8; 16 * 1024];
                match self.io.read(&mut chunk).await {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => self.read.extend_from_slice(&chunk[..n]),
                }
            }
        };
        tokio::time::timeout(wait, read).await.ok().flatten()
    }

    /// [`RawH2::next`] until `until`.
    pub async fn next_before(&mut self, until: std::time::Instant) -> Option<H2Frame> {
        let wait = until.saturating_duration_since(std::time::Instant::now());
        self.next(wait).await
    }

    fn whole_frame(&mut self) -> Option<H2Frame> {
        let head = self.read.get(..9)?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        if self.read.len() < 9 + len {
            return None;
        }
        let frame: Vec<u8> = self.read.drain(..9 + len).collect();
        Some(H2Frame {
            kind: frame[3],
            flags: frame[4],
            stream: u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff,
            payload: frame[9..].to_vec(),
        })
    }

    /// Answers what the protocol requires of a client for `frame`: SETTINGS and PING
    /// acknowledged. Returns the new initial stream window if the SETTINGS set one.
    pub async fn acknowledge(&mut self, frame: &H2Frame) -> Option<i64> {
        match frame.kind {
            SETTINGS if frame.flags & ACK == 0 => {
                self.send(SETTINGS, ACK, 0, &[]).await;
                frame
                    .payload
                    .chunks_exact(6)
                    .filter(|e| u16::from_be_bytes([e[0], e[1]]) == SETTINGS_INITIAL_WINDOW_SIZE)
                    .map(|e| i64::from(u32::from_be_bytes([e[2], e[3], e[4], e[5]])))
                    .next_back()
            }
            PING if frame.flags & ACK == 0 => {
                self.send(PING, ACK, 0, &frame.payload).await;
                None
            }
            _ => None,
        }
    }
}

fn push_length(out: &mut Vec<u8>, n: usize) {
    if n < 127 {
        out.push(n as u8);
        return;
    }
    out.push(127);
    let mut rest = n - 127;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// The `:status` of a response's header block, as the gateway's HPACK encoder writes it:
/// an indexed field of the static table (RFC 7541 Appendix A) for the statuses it has,
/// else a literal with the name indexed (`:status` is index 8), its value Huffman-coded
/// or not. `None` for a status the connection has sent before, which the encoder then
/// gives as an index into its dynamic table, not kept here: read one answer per status.
pub fn status(block: &[u8]) -> Option<u16> {
    const INDEXED: [(u8, u16); 7] = [
        (8, 200),
        (9, 204),
        (10, 206),
        (11, 304),
        (12, 400),
        (13, 404),
        (14, 500),
    ];
    let first = *block.first()?;
    if first & 0x80 != 0 {
        return INDEXED
            .iter()
            .find(|(i, _)| *i == first & 0x7f)
            .map(|(_, s)| *s);
    }
    // Literal with incremental indexing (0x40 | 8), or without / never indexed (0x08, 0x18):
    // then a 3-digit value, its length's top bit saying whether it is Huffman-coded.
    if !matches!(first, 0x48 | 0x08 | 0x18) {
        return None;
    }
    let len = *block.get(1)?;
    let value = block.get(2..2 + usize::from(len & 0x7f))?;
    if len & 0x80 == 0 {
        return std::str::from_utf8(value).ok()?.parse().ok();
    }
    huffman_digits(value)
}

/// A Huffman-coded string of digits (RFC 7541 Appendix B): '0' to '2' are the 5-bit codes
/// 0 to 2, '3' to '9' the 6-bit codes 0x19 to 0x1f, and what follows the last is padding,
/// fewer than 8 one bits.
fn huffman_digits(coded: &[u8]) -> Option<u16> {
    let mut bits = coded
        .iter()
        .flat_map(|b| (0..8).rev().map(move |i| (b >> i) & 1));
    let mut take =
        |n: usize| -> Option<u8> { (0..n).try_fold(0u8, |code, _| Some(code << 1 | bits.next()?)) };
    let mut value = 0u16;
    for _ in 0..3 {
        let code = take(5)?;
        let digit = match code {
            0..=2 => code,
            0b01100..=0b01111 => (code << 1 | take(1)?).checked_sub(0x19)? + 3,
            _ => return None,
        };
        value = value * 10 + u16::from(digit);
    }
    let padding: Vec<u8> = bits.collect();
    (padding.len() < 8 && padding.iter().all(|&b| b == 1)).then_some(value)
}
